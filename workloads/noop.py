"""noop: start, join the process group, one all_reduce, report, exit.

For measuring launch overhead: everything a real workload pays before its
first step (interpreter + torch import, rendezvous, one collective) and
nothing else. The all_reduce of a 1 on every rank must come back as the
world size; anything else is an error.
"""

import time

_T0 = time.perf_counter()  # before importing torch, to measure that import

import hashlib  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.elastic.multiprocessing.errors import record  # noqa: E402

from workloads.harness.context import synchronize  # noqa: E402
from workloads.harness.evidence import gather  # noqa: E402
from workloads.harness.job import Job, run_job, start  # noqa: E402
from workloads.harness.report import build_result, describe_start, emit  # noqa: E402


def run(job: Job) -> dict:
    ctx, log = job.ctx, job.log
    t_joined = time.perf_counter()
    log(describe_start(ctx, "none", "noop moves no data"))
    x = torch.ones(1, device=ctx.device)
    dist.all_reduce(x)
    synchronize(ctx)
    t_reduced = time.perf_counter()
    value = x.item()
    if value != ctx.world_size:
        raise RuntimeError(f"all_reduce of ones gave {value}, expected {ctx.world_size}")
    evidence = gather(ctx, hashlib.sha256(repr(value).encode()).hexdigest())
    timing = {"import_s": job.started - _T0, "init_s": t_joined - job.started,
              "all_reduce_s": t_reduced - t_joined, "steps": 0}
    result = build_result(ctx, job.args, workload="noop", data="none",
                          metrics={"all_reduce_value": value, "all_reduce_ok": True},
                          timing=timing, evidence=evidence, loss_curve=[], started=_T0)
    emit(ctx, result, job.args.result_file, log)
    return result


@record
def main(argv=None) -> dict:
    return run_job(start("noop", argv), run)


if __name__ == "__main__":
    main()
