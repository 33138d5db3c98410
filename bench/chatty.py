"""A chatty torchrun workload for bench/log_relay.py: every rank prints --lines lines.

Each line carries the rank and a sequence number, so the receiver can check
that every line arrived and that each rank's lines kept their order::

    chatty rank=1 seq=000042 ....payload....

Each line is written and flushed on its own (like ``logging`` does), so the
program behaves the same whatever buffering its environment asks for. It
does not import torch: the relay, not the torch import, is under test. With
$CHATTY_TIMES set, each rank also records when it started and finished
writing (bench/log_relay.py's timeline).
"""

import argparse
import json
import os
import sys
import time

PAYLOAD = "step metrics loss=0.123456 lr=0.001 samples/s=12345.6 " + "x" * 20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lines", type=int, default=100_000)
    args = p.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    t_start = time.time()
    out = sys.stdout
    for seq in range(args.lines):
        out.write(f"chatty rank={rank} seq={seq:06d} {PAYLOAD}\n")
        out.flush()
    out.write(f"chatty rank={rank} done\n")
    out.flush()
    times_dir = os.environ.get("CHATTY_TIMES")  # the bench's timeline, if it asks
    if times_dir:
        with open(os.path.join(times_dir, f"{os.environ.get('CHATTY_TAG') or os.environ.get('DDP_ORCH_RUN_ID', 'x')}-{rank}.json"),
                  "w") as fh:
            json.dump({"rank": rank, "start": t_start, "end": time.time()}, fh)


if __name__ == "__main__":
    main()
