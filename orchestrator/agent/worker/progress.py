"""Your program's step, for ddp-orch: ``ddp_orch_progress.step(n, samples=None,
compute_s=None, data_s=None)``.

The bundle puts this file on every rank's ``PYTHONPATH``, so a script
reports its step from its own loop in one line, also on a rank that prints
nothing::

    import ddp_orch_progress
    ...
        ddp_orch_progress.step(step, samples=seen)  # samples= is optional

``samples``: training samples this rank has processed so far (cumulative).
``compute_s`` and ``data_s``: this step's seconds computing before the
gradients' all-reduce (where every rank waits for the slowest, so it is
left out) and waiting for the batch; both or neither. ``ddp-orch top``
names the rank that spends the most there as the one holding the gang
back. A bad value is left out, and the step still recorded.

It feeds ``status`` and the hang watchdog; without ddp-orch it returns at
once. It stands alone (standard library only), so a project that also runs
under plain ``torchrun`` can copy it in.
"""

from __future__ import annotations

import math
import numbers
import os
import time

MODULE = "ddp_orch_progress"  # the name the bundle ships this file under
RESULT_FILE_ENV = "DDP_ORCH_RESULT_FILE"  # workloads/contract.py's: <node run dir>/result.json
PROGRESS_DIR = "progress"  # agent/layout.py's PROGRESS_DIR (this file runs without the agent)
EVERY_S = 1.0  # at most one file write a second: calling it every step costs nothing
_last = [float("-inf")]
_pace = [0.0, 0.0, 0]  # compute and data seconds since the last write, over this many steps


def step(n: int, samples: int | None = None, compute_s: float | None = None,
         data_s: float | None = None) -> None:
    """Record that this rank reached step ``n``; an error never reaches the training loop."""
    result = os.environ.get(RESULT_FILE_ENV)
    if not result:
        return
    if _seconds(compute_s) and _seconds(data_s):
        _pace[0] += float(compute_s)
        _pace[1] += float(data_s)
        _pace[2] += 1
    now = time.monotonic()
    if now - _last[0] < EVERY_S:
        return
    _last[0] = now
    pace, _pace[:] = list(_pace), [0.0, 0.0, 0]
    directory = os.path.join(os.path.dirname(result), PROGRESS_DIR)
    path = os.path.join(directory, f"rank-{os.environ.get('RANK', '0')}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(f"{int(n)} {time.time():.3f}{_fields(samples, pace)}\n")
        os.replace(path + ".tmp", path)
    except (OSError, ValueError, TypeError):
        pass


def _seconds(value: object) -> bool:
    """Is ``value`` a duration: a finite real >= 0, not a bool?"""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value) and value >= 0)


def _fields(samples: object, pace: list) -> str:
    """What follows ``<step> <time>``: `` <samples>``, and with ``pace``
    `` <samples or -> <compute_s> <data_s>``, the mean seconds per step."""
    good = isinstance(samples, numbers.Integral) and not isinstance(samples, bool) \
        and samples >= 0
    counted = f" {int(samples)}" if good else ""
    if not pace[2]:
        return counted
    return f"{counted or ' -'} {pace[0] / pace[2]:.6f} {pace[1] / pace[2]:.6f}"
