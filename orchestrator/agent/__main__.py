"""``python -m orchestrator.agent serve`` (or ``ddp_orch_agent`` on a node).

``serve`` is what the controller runs; ``supervise SPEC.json`` runs a
supervisor by hand or in tests; ``job JOB.json`` is one node of a Slurm job.
"""

from __future__ import annotations

import json
import os
import sys
import threading

FLUSH_S = 5.0  # how long the last output may take to leave before the agent exits


def main(argv: list[str]) -> int:
    if argv == ["serve"]:
        from .wire.serve import serve

        code = serve()
    elif len(argv) == 2 and argv[0] == "supervise":
        from .node.spec import SpecError
        from .node.supervisor import Supervisor

        with open(argv[1], encoding="utf-8") as fh:
            try:
                supervisor = Supervisor(json.load(fh))
            except SpecError as exc:
                print(f"ddp-orch agent: {argv[1]}: {exc}", file=sys.stderr)
                return 2
        code = supervisor.run()
    elif len(argv) == 2 and argv[0] == "job":
        from .node.jobnode import run

        code = run(argv[1])
    elif len(argv) >= 3 and argv[0] == "stacks":  # stacks JOB.json OUT [--native]: srun
        from .node.jobnode import stacks

        code = stacks(argv[1], argv[2], native="--native" in argv[3:])
    else:
        print("usage: ddp_orch_agent serve | supervise SPEC.json | job JOB.json | "
              "stacks JOB.json OUT_PREFIX [--native]", file=sys.stderr)
        return 2
    # A controller that went silent may leave our stdout full, and a flush
    # blocked on it for good: the agent would never exit. At most a few
    # seconds, then it exits anyway (supervisor.json has the outcome).
    flusher = threading.Thread(target=_flush, daemon=True)
    flusher.start()
    flusher.join(FLUSH_S)
    os._exit(code)  # no interpreter teardown racing the stdin thread


def _flush() -> None:
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the controller is gone
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
