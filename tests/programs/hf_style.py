"""Prints what Hugging Face style scripts print: settings that read false and
a token it was given, and writes rank 0's result."""
import json
import os

rank = int(os.environ.get("RANK", "0"))
print(f"rank {rank}: shuffle=false tokenizers={os.environ['TOKENIZERS_PARALLELISM']}",
      flush=True)
print(f"rank {rank}: logged in with {os.environ['HF_TOKEN']}", flush=True)
