"""Your program's step, for ddp-orch: ``ddp_orch_progress.step(n, samples=None)``.

The bundle ships this file as ``code/ddp_orch_progress.py``, on every rank's
``PYTHONPATH`` on every node and backend, so a script run by ddp-orch
reports its step from its own loop in one line, also on a rank that prints
nothing (most programs print on rank 0 only)::

    import ddp_orch_progress
    ...
        ddp_orch_progress.step(step, samples=seen)  # samples= is optional

``samples``, where given, is how many training samples this rank has
processed so far (cumulative, an int >= 0); ``status`` shows it after the
step. A value that is no such count (negative, not an integer, a bool) is
left out, and the step still recorded.

That is the step heartbeat the built-in workloads send
(``workloads/contract.py``'s ``heartbeat``), by the same channel: a file
``progress/rank-<RANK>`` holding ``"<step> <time>"``, or ``"<step> <time>
<samples>"``, in the node's run directory (the directory of
``DDP_ORCH_RESULT_FILE``), which the node agent reads
(``agent/node/supervisor.py``'s ``progress``). ddp-orch counts it as the
rank's progress: ``status``, ``up --quiet``'s progress line, the hang
watchdog. Without ddp-orch (no ``DDP_ORCH_RESULT_FILE``) it returns at
once. It is standard library only and stands alone, so a project that also
runs under plain ``torchrun`` copies it in, beside its script.
"""

from __future__ import annotations

import numbers
import os
import time

MODULE = "ddp_orch_progress"  # the name the bundle ships this file under
RESULT_FILE_ENV = "DDP_ORCH_RESULT_FILE"  # workloads/contract.py's: <node run dir>/result.json
PROGRESS_DIR = "progress"  # agent/layout.py's PROGRESS_DIR (this file runs without the agent)
EVERY_S = 1.0  # at most one file write a second: calling it every step costs nothing
_last = [float("-inf")]


def step(n: int, samples: int | None = None) -> None:
    """Record that this rank reached step ``n``, having processed ``samples``
    training samples so far where given (best effort: an error writing it
    never reaches the training loop; a bad ``samples`` is left out)."""
    result = os.environ.get(RESULT_FILE_ENV)
    if not result:
        return
    now = time.monotonic()
    if now - _last[0] < EVERY_S:
        return
    _last[0] = now
    directory = os.path.join(os.path.dirname(result), PROGRESS_DIR)
    path = os.path.join(directory, f"rank-{os.environ.get('RANK', '0')}")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(f"{int(n)} {time.time():.3f}{_samples_field(samples)}\n")
        os.replace(path + ".tmp", path)
    except (OSError, ValueError, TypeError):
        pass


def _samples_field(samples: object) -> str:
    """`` <samples>`` for a count (an integer >= 0, not a bool), else nothing."""
    if isinstance(samples, numbers.Integral) and not isinstance(samples, bool) and samples >= 0:
        return f" {int(samples)}"
    return ""
