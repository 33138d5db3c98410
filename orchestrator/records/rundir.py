"""The local run directory, ``<runs-dir>/<run-id>/`` (0700): the record of
one launch on the controller. It holds ``cluster.yaml`` as given,
``plan.json`` (secrets masked), ``state.json``, ``.reserve`` (room for the
last state on a full disk), ``progress.json``, ``node-<k>.log``,
``result.json`` (rank 0's), ``outputs.json``, stop.request (who asked it
to stop), ``bundle.tar.gz`` and ``node-<k>/`` for nodes on this machine.
``RunDir`` names each record once: readers never build a path of their own.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

from ..agent.node.scrub import write_atomically
from ..errors import ConfigError
from .runsdir import mark

DEFAULT_RUNS_DIR = "runs"
CLUSTER_FILE = "cluster.yaml"
PLAN_FILE = "plan.json"
STATE_FILE = "state.json"
PROGRESS_FILE = "progress.json"
RESULT_FILE = "result.json"
OUTPUTS_RECORD = "outputs.json"  # what came home, what was refused, what matched nothing
OUTPUTS_DIR = "outputs"
RESERVE_FILE = ".reserve"  # room for the last state.json on a full disk (``reserve``)
RESERVE_BYTES = 256 << 10
_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def new_run_id(name: str, now: float | None = None) -> str:
    """``<name>-YYYYmmdd-HHMMSS-<4 hex>``: sortable, unique, safe in paths."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"{name}-{stamp}-{os.urandom(2).hex()}"


def valid_run_id(run_id: str) -> bool:
    return bool(_RUN_ID_RE.match(run_id))


def taken(runs_dir: str, run_id: str) -> ConfigError:
    """The refusal of a run id that a run in ``runs_dir`` already has."""
    where = os.path.dirname(os.path.abspath(os.path.join(runs_dir, run_id)))
    return ConfigError(f"run id {run_id!r} is already taken in {where}",
                       path="--run-id", source="command line",
                       hint="choose another --run-id, or leave it out for a fresh one; "
                            f"`ddp-orch prune {run_id}` removes that run if it has ended")


@dataclass(frozen=True)
class RunDir:
    path: str

    @classmethod
    def create(cls, runs_dir: str, run_id: str) -> "RunDir":
        path = os.path.abspath(os.path.join(runs_dir, run_id))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        mark(os.path.dirname(path))  # found from below it from now on (``runsdir``)
        try:
            os.mkdir(path, mode=0o700)  # fails if the id is already taken
        except FileExistsError:
            raise taken(runs_dir, run_id) from None
        os.chmod(path, 0o700)
        run = cls(path)
        run.reserve()
        return run

    def reserve(self) -> None:
        """A file of ``RESERVE_BYTES`` that ``write_state`` gives up on a full disk,
        so a run that filled its runs directory still records its end."""
        try:
            with open(self.file(RESERVE_FILE), "wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
        except OSError:
            pass  # no room now: nothing to keep

    @staticmethod
    def refuse_taken(runs_dir: str, run_id: str) -> None:
        """What ``create`` would refuse, without creating anything (for the dry-run)."""
        if os.path.lexists(os.path.join(runs_dir, run_id)):
            raise taken(runs_dir, run_id)

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def node_log(self, node_rank: int) -> str:
        return self.file(f"node-{node_rank}.log")

    def note(self, node_rank: int, text: str) -> None:
        """A line of ddp-orch's own in a node's log; a full disk loses the note,
        never the run's end."""
        try:
            with open(self.node_log(node_rank), "a", encoding="utf-8") as fh:
                fh.write(f"ddp-orch: {text}\n")
        except OSError:
            pass

    def write_text(self, name: str, text: str) -> None:
        with open(self.file(name), "w", encoding="utf-8") as fh:
            fh.write(text)

    def write_json(self, name: str, payload: Any) -> None:
        """Whole or not at all: ``ps`` may read it at any moment."""
        text = json.dumps(payload, indent=2, sort_keys=True, allow_nan=True) + "\n"
        write_atomically(self.file(name), text.encode(), 0o600)

    def load_json(self, name: str) -> Any:
        """The record ``name``; ``OSError`` or ``ValueError`` when it cannot be had."""
        with open(self.file(name), encoding="utf-8") as fh:
            return json.load(fh)

    def read_json(self, name: str) -> Any:
        try:
            return self.load_json(name)
        except (OSError, ValueError):
            return None

    # -- the run's records, by name ---------------------------------------

    def plan(self) -> Any:
        """The resolved plan as recorded (``plan.render.dryrun_to_dict``)."""
        return self.read_json(PLAN_FILE)

    def write_plan(self, payload: Any) -> None:
        self.write_json(PLAN_FILE, payload)

    def state(self) -> Any:
        """The run's state and each node's outcome, as ``records.store`` wrote it."""
        return self.read_json(STATE_FILE)

    def write_state(self, payload: Any) -> None:
        try:
            self.write_json(STATE_FILE, payload)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or \
                    not os.path.exists(self.file(RESERVE_FILE)):
                raise
            os.unlink(self.file(RESERVE_FILE))  # the room kept for this
            self.write_json(STATE_FILE, payload)

    def state_file(self) -> str:
        return self.file(STATE_FILE)

    def leave_stop_request(self, why: str) -> None:
        """Who is about to signal the run's controller, and why: a signal does not
        say who sent it. The keepers' rule: the first request stays."""
        from ..agent.kept import mailbox

        mailbox.leave_stop_request(self.path, why)

    def stop_request(self) -> str:
        """What ``leave_stop_request`` left, as one printable line; "" for none."""
        from ..agent.kept import mailbox

        return mailbox.stop_request(self.path)

    def progress(self) -> Any:
        """Each rank's last step, while an attached run goes on."""
        return self.read_json(PROGRESS_FILE)

    def write_progress(self, payload: Any) -> None:
        self.write_json(PROGRESS_FILE, payload)

    def result(self) -> Any:
        """Rank 0's result as brought home."""
        return self.read_json(RESULT_FILE)

    def result_file(self) -> str:
        return self.file(RESULT_FILE)

    def outputs(self) -> Any:
        """What came home and what was refused (``engine.results``)."""
        return self.read_json(OUTPUTS_RECORD)

    def write_outputs(self, record: Any) -> None:
        self.write_json(OUTPUTS_RECORD, record)
