"""Ranks at different paces, for ``ddp-orch top``'s straggler rule.

``--mode ddp``: a real DDP step (gloo, a tiny model) per loop; the rank
``--slow-rank`` names spends three times as long computing before the
all-reduce, and every rank reports its step with its compute and data
seconds (``ddp_orch_progress.step``): rule 1's evidence. Every rank steps at
the same rate, as DDP makes them.

``--mode free``: no collective; each rank prints and reports its steps on
its own, the slow rank at a third of the others' rate (rule 2); the rank
``--stop-rank`` names stops printing and reporting after 4 s (rule 3), and
the rank ``--silent-rank`` names never prints or reports anything. With
``--print-only`` the ranks print their steps and report none: their step
is read from their lines (``agent/node/outputsteps.py``).

Runs for ``--seconds`` and ends with exit 0.
"""
import argparse
import os
import time

import ddp_orch_progress

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["ddp", "free"], default="ddp")
parser.add_argument("--seconds", type=float, default=20.0)
parser.add_argument("--slow-rank", type=int, default=2)
parser.add_argument("--stop-rank", type=int, default=-1)
parser.add_argument("--silent-rank", type=int, default=-1)
parser.add_argument("--compute", type=float, default=0.05, help="a normal rank's compute, s")
parser.add_argument("--print-only", action="store_true", help="free mode: print, report nothing")
args = parser.parse_args()
rank = int(os.environ["RANK"])
slow = 3.0 if rank == args.slow_rank else 1.0
end = time.monotonic() + args.seconds

if args.mode == "ddp":
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    while True:
        done = torch.tensor([float(time.monotonic() > end)])
        dist.all_reduce(done)  # every rank leaves at the same step
        if done.item():
            break
        t0 = time.perf_counter()
        batch = torch.randn(4, 8)
        t1 = time.perf_counter()
        loss = model(batch).pow(2).mean()
        time.sleep(args.compute * slow)  # the forward's compute, slower on the slow rank
        t2 = time.perf_counter()
        loss.backward()  # the all-reduce: the fast ranks wait here for the slow one
        optimizer.step()
        step += 1
        ddp_orch_progress.step(step, samples=4 * step, compute_s=t2 - t1, data_s=t1 - t0)
    # DDP's reducer first, then the group, every rank together: a rank that
    # tore down while another still held its gloo pairs aborted at exit (CI)
    del model, optimizer
    dist.barrier()
    dist.destroy_process_group()
else:
    step = 0
    stop_at = time.monotonic() + 4.0
    while time.monotonic() < end:
        time.sleep(args.compute * slow)
        step += 1
        if rank == args.silent_rank or (rank == args.stop_rank and time.monotonic() > stop_at):
            continue
        print(f"rank {rank} step {step}", flush=True)
        if not args.print_only:
            ddp_orch_progress.step(step)
if rank != args.silent_rank:
    print(f"rank {rank} done", flush=True)
