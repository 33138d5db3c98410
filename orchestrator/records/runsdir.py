"""Which runs directory a command uses, wherever it is started from.

The first of: ``--runs-dir``; the nearest ``runs/`` of ddp-orch
(``is_runs_dir``) at or above the current directory, as git finds
``.git``; ``$DDP_ORCH_RUNS_DIR``; ``user_default``. So runs kept beside a
project are found from anywhere inside it, and the rest from anywhere at all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

RUNS_DIR_NAME = "runs"
MARKER = ".ddp-orch-runs"
RUNS_DIR_ENV = "DDP_ORCH_RUNS_DIR"
MARKER_TEXT = ("ddp-orch keeps its runs here. Commands run in the directory above this "
               "one, or below it, find them (`ddp-orch ps`).\n")


@dataclass(frozen=True)
class RunsDir:
    path: str  # --runs-dir as given; otherwise absolute
    source: str  # how it was chosen, in words, for ``ps``

    @property
    def shown(self) -> str:
        return os.path.abspath(self.path)


def locate(given: str | None, *, cwd: str | None = None,
           env: Mapping[str, str] | None = None) -> RunsDir:
    """The runs directory a command uses (see the module's docstring)."""
    if given:
        return RunsDir(given, "--runs-dir")
    env = os.environ if env is None else env
    try:
        here = os.path.abspath(cwd or os.getcwd())
    except OSError:  # the current directory was removed
        here = None
    found = find_above(here) if here else None
    if found is not None:
        return RunsDir(found, "the nearest runs/ of ddp-orch at or above the current "
                              "directory")
    nowhere = f"no runs/ of ddp-orch in {here} or above it" if here else \
        "the current directory is gone"
    if env.get(RUNS_DIR_ENV):
        return RunsDir(os.path.abspath(os.path.expanduser(env[RUNS_DIR_ENV])),
                       f"${RUNS_DIR_ENV}: {nowhere}")
    return RunsDir(user_default(env), f"the default: {nowhere}; --runs-dir or "
                                      f"${RUNS_DIR_ENV} choose another")


def user_default(env: Mapping[str, str]) -> str:
    """``$XDG_DATA_HOME/ddp-orch/runs`` (an absolute XDG_DATA_HOME only, as
    the XDG spec says), else ``~/.local/share/ddp-orch/runs``."""
    data = env.get("XDG_DATA_HOME", "")
    if not os.path.isabs(data):
        home = env.get("HOME") or os.path.expanduser("~")
        data = os.path.join(home, ".local", "share")
    return os.path.join(data, "ddp-orch", RUNS_DIR_NAME)


def find_above(start: str) -> str | None:
    """The nearest ``runs/`` of ddp-orch in ``start`` or a directory above it."""
    here = start
    while True:
        candidate = os.path.join(here, RUNS_DIR_NAME)
        if is_runs_dir(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def is_runs_dir(path: str) -> bool:
    """Whether ddp-orch made ``path``: it holds ``MARKER``, or (made before
    the marker) a run directory with a ``state.json``."""
    if os.path.isfile(os.path.join(path, MARKER)):
        return True
    try:
        with os.scandir(path) as entries:
            return any(entry.is_dir(follow_symlinks=False)
                       and os.path.isfile(os.path.join(entry.path, "state.json"))
                       for entry in entries)
    except OSError:
        return False


def mark(runs_dir: str) -> None:
    """Leave ``MARKER`` in ``runs_dir`` and a ``.gitignore`` of everything (a
    runs directory is never source), once only, so a ``.gitignore`` the user
    changed later stays. Best effort: a read-only runs directory still works."""
    if _create(os.path.join(runs_dir, MARKER), MARKER_TEXT):
        _create(os.path.join(runs_dir, ".gitignore"), GITIGNORE_TEXT)


GITIGNORE_TEXT = "# ddp-orch's runs: logs, bundles and results, not source\n*\n"


def _create(path: str, text: str) -> bool:
    """Write ``path`` if it does not exist yet; whether it was written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    return True
