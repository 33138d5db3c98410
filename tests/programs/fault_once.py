"""A built-in workload ($FAULT_WORKLOAD: mnist, resnet), with a real fault
on the first attempt only.

After epoch 1's checkpoint is on disk, the last rank raises (on attempt 0),
so ddp-orch's gang restart must resume from that checkpoint. Arguments are
the workload's own.
"""
import importlib
import os
import sys

import torch.distributed as dist

from workloads import contract
from workloads.harness import checkpoint

saver = checkpoint.epoch_saver


def faulty_saver(*args, **kwargs):
    save = saver(*args, **kwargs)

    def save_then_fail(trainer):
        save(trainer)
        if contract.restart_count() == 0 and trainer.epoch == 1:
            dist.barrier()  # rank 0's checkpoint is written
            if dist.get_rank() == dist.get_world_size() - 1:
                raise RuntimeError("planned fault after epoch 1")

    return save_then_fail


checkpoint.epoch_saver = faulty_saver
if __name__ == "__main__":
    importlib.import_module(f"workloads.{os.environ['FAULT_WORKLOAD']}").main(sys.argv[1:])
