"""The fault matrix's program (tests/labs/faultrunner.py): a DDP-shaped job
whose phases a test can hold, and whose ranks raise when told.

Every rank, in a directory of gates (``--gates``, a path every node sees:
the labs' nodes are this machine):

* ``rank<R>.start.reached``, then waits for ``rank<R>.start.release`` (or
  ``all.release``): the workers have started, none has joined the process
  group (the phase "workers starting");
* joins the gloo group, then steps: an all-reduce, a line ``rank R step N``,
  and a sleep; after step 3 ``rank<R>.training.reached`` (the phase
  "training"); it steps until any rank sees ``finish`` (or ``--max-steps``);
* raises ``RuntimeError`` at its next step or at its start gate once
  ``raise-rank<R>`` exists (the fault "a rank raises");
* with ``--chatty-at N``, prints ``--chatty-kb`` KiB at once at step N (the
  fault "the controller's output is not read");
* once ``teardown`` exists, rank 0 raises and the others stop stepping (no
  collective to fail in) until they are stopped: on SIGTERM a rank writes
  ``rank<R>.teardown.reached`` and, on the rank ``--slow-stop`` names, takes
  ``--stop-s`` seconds to end (the phase "teardown": the grace period is
  being waited out).

Rank 0 writes its result (``workloads.contract``) at the end.
"""
import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--gates", required=True)
parser.add_argument("--step-s", type=float, default=0.25)
parser.add_argument("--max-steps", type=int, default=2000)
parser.add_argument("--chatty-at", type=int, default=-1)
parser.add_argument("--chatty-kb", type=int, default=300)
parser.add_argument("--slow-stop", type=int, default=-1)
parser.add_argument("--stop-s", type=float, default=8.0)
args = parser.parse_args()
rank = int(os.environ["RANK"])


def gate(name: str) -> str:
    return os.path.join(args.gates, name)


def touch(name: str) -> None:
    with open(gate(name), "w", encoding="utf-8"):
        pass


def raise_if_told() -> None:
    if os.path.exists(gate(f"raise-rank{rank}")):
        raise RuntimeError(f"fault matrix: rank {rank} raises")
    if os.path.exists(gate("teardown")):  # rank 0 raises; the others wait to be stopped
        if rank == 0:
            raise RuntimeError("fault matrix: rank 0 raises to start the teardown")
        while True:
            time.sleep(1)


def on_term(signum, frame) -> None:
    touch(f"rank{rank}.teardown.reached")
    if rank == args.slow_stop:
        time.sleep(args.stop_s)
    sys.exit(128 + signum)


signal.signal(signal.SIGTERM, on_term)
touch(f"rank{rank}.start.reached")
while not (os.path.exists(gate(f"rank{rank}.start.release")) or os.path.exists(gate("all.release"))):
    raise_if_told()
    time.sleep(0.05)
raise_if_told()

import torch  # noqa: E402 (after the start gate, as a real job's data loads)
import torch.distributed as dist  # noqa: E402

from workloads import contract  # noqa: E402

dist.init_process_group("gloo")
step = 0
while True:
    raise_if_told()
    done = torch.tensor([float(step >= args.max_steps or os.path.exists(gate("finish")))])
    dist.all_reduce(done)  # every rank leaves at the same step
    if done.item():
        break
    step += 1
    print(f"rank {rank} step {step}", flush=True)
    if step == args.chatty_at:
        print(("x" * 1023 + "\n") * args.chatty_kb, end="", flush=True)
    if step == 3:
        touch(f"rank{rank}.training.reached")
    time.sleep(args.step_s)
if rank == 0 and contract.RESULT_FILE_ENV in os.environ:
    contract.write_json_atomic(os.environ[contract.RESULT_FILE_ENV],
                               {"world_size": dist.get_world_size(), "metrics": {"steps": step}})
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
