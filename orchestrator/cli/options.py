"""What every command that finds a run says of ``--runs-dir``: shared by
``main.py`` and ``runs.py``, which imports nothing of ``main``."""

from __future__ import annotations

import click

from ..records.runsdir import RUNS_DIR_ENV

# Every command finds the same runs directory, from wherever it runs (``runsdir``).
RUNS_DIR_HELP = ("Where the run directories are (default: the nearest runs/ of ddp-orch in "
                 f"this directory or above, else ${RUNS_DIR_ENV}, else "
                 "~/.local/share/ddp-orch/runs; `ddp-orch ps` says which).")

runs_dir_option = click.option("--runs-dir", default=None, type=click.Path(file_okay=False),
                               help=RUNS_DIR_HELP)
