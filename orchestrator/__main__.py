from .cli import main

main(prog_name="ddp-orch")
