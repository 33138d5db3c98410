"""``state.json``: the one module that writes and reads a run's state.

Every reader goes through ``read_record``, so it survives a controller
restart and shares one vocabulary (``outcome.RunState``). A live attached
run whose controller is gone reads as ``interrupted``; a detached run or a
scheduler's job gets its state from its backend (``kept_without_controller``).
"Gone" is judged by the controller's identity (host, boot id, start time,
command line), since a pid alone is reused.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..agent.wire.owner import Owner
from ..errors import ConfigError
from .outcome import AttemptOutcome, NodeOutcome, RunOutcome, RunState
from .rundir import STATE_FILE, RunDir, valid_run_id  # noqa: F401 (STATE_FILE: its importers')

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"
# what must match, besides the host, for a live pid to still be the controller
IDENTITY_KEYS = ("boot_id", "start_time", "cmdline")


def _this_host() -> str:
    """This machine's host name (uname's node name), without importing socket for ``ps``."""
    return os.uname().nodename


@dataclass(frozen=True)
class NodeRecord:
    """Where a node of the run lives, enough for its backend to find it again."""

    node_rank: int
    host: str
    run_dir: str
    python: str
    connection: Mapping[str, Any] = field(default_factory=dict)  # the backend's own


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    run: RunDir
    state: RunState
    backend: str
    started: float | None
    wall_s: float | None
    nodes: tuple[NodeRecord, ...]
    outcomes: tuple[NodeOutcome, ...]
    root_cause: NodeOutcome | None
    controller_pid: int | None
    # the controller's identity (``process_identity``); empty in old records
    controller: Mapping[str, Any] = field(default_factory=dict)
    # who owns the run (``agent/wire/owner.py``), as its dry-run decided
    owner: Owner = Owner()
    attempts: tuple[AttemptOutcome, ...] = ()
    ended: float | None = None  # when the run ended (time.time()); None while live
    # why the controller stopped with no outcome to record (a busy port, the
    # upload cap: the run failed before it started); "" otherwise
    error: str = ""
    # whether a controller brought the results home (an attached run's, or
    # ``attach``'s); a detached run that ended unwatched has not yet
    results_home: bool = True
    # seconds from ``started`` until the run itself started (``wall_s`` is
    # its time from then): connecting, uploading, waiting for GPUs or in a
    # scheduler's queue; to its end, or now, for one that never started or
    # still waits; None where unknown (a record from before the wait was kept)
    waited_s: float | None = None

    @property
    def running_since(self) -> float | None:
        """When the run itself started (``started`` plus the wait), where known."""
        if self.started is None:
            return None
        return self.started + (self.waited_s or 0.0)

    @property
    def live(self) -> bool:
        return self.state.live

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(n.host for n in self.nodes)

    @property
    def exit_codes(self) -> tuple[int | None, ...]:
        return tuple(o.exit_code for o in self.outcomes)


def write_state(run: RunDir, *, run_id: str, backend: str, state: RunState, started: float,
                nodes: Sequence[NodeRecord], outcome: RunOutcome | None = None,
                owner: Owner = Owner(), ended: float | None = None, error: str = "",
                results_home: bool | None = None, running_since: float | None = None) -> None:
    """``ended``: when it ended, if not now; ``error``: why a finished run has no
    ``outcome``; ``results_home``: whether its results came home (default:
    once over); ``running_since``: when the run started, after the wait for
    its nodes. ``started + waited_s + wall_s`` is about ``ended``."""
    over = not state.live
    ended = (ended or time.time()) if over else None
    if running_since is not None:
        waited: float | None = max(0.0, running_since - started)
    else:
        waited = max(0.0, ended - started) if over and outcome is None else None
    if not over:
        wall = None
    elif outcome is not None:
        wall = outcome.wall_s
    else:
        wall = max(0.0, ended - running_since) if running_since is not None else None
    payload: dict[str, Any] = {
        "version": RECORD_VERSION,
        "run_id": run_id, "backend": backend, "state": state.value, "started": started,
        "owner": owner.to_json(),
        "controller_pid": os.getpid(),
        "controller": process_identity(os.getpid()) or {"pid": os.getpid(),
                                                         "host": _this_host()},
        "ended": ended,
        "wall_s": wall,
        "results_home": over if results_home is None else results_home,
        "nodes": [{"node_rank": n.node_rank, "host": n.host, "run_dir": n.run_dir,
                   "python": n.python, "connection": dict(n.connection)} for n in nodes],
    }
    if outcome is not None and outcome.attempts:
        payload["attempts"] = [a.to_dict() for a in outcome.attempts]
    if outcome is not None and not state.live:
        payload["outcomes"] = [o.to_dict() for o in outcome.nodes]
        payload["root_cause"] = outcome.root_cause.to_dict() if outcome.root_cause else None
    if waited is not None:
        payload["waited_s"] = waited
    if error:
        payload["error"] = error
    run.write_state(payload)


def record_end(record: RunRecord, outcome: RunOutcome, *, ended: float | None = None,
               results_home: bool) -> None:
    """Record how a detached run ended, learnt after its controller left
    (``status`` or ``attach``); ``ended`` defaults to now."""
    started = record.started or time.time()
    write_state(record.run, run_id=record.run_id, backend=record.backend, state=outcome.state,
                started=started, nodes=record.nodes, outcome=outcome,
                owner=record.owner, ended=ended, results_home=results_home,
                running_since=None if record.waited_s is None else started + record.waited_s)


def process_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_identity(pid: int) -> dict[str, Any] | None:
    """What tells ``pid`` apart from a later process with the same pid (host,
    boot id, ``/proc/<pid>/stat`` start time in clock ticks, cmdline), or
    None when /proc does not show it.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmdline = fh.read()
        # the command name, field 2, is in parentheses and may hold anything
        start_time = int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None
    args = cmdline.split(b"\0")
    if args[-1] == b"":  # each argument ends in a NUL
        args.pop()
    return {"pid": pid, "host": _this_host(), "boot_id": _boot_id(),
            "start_time": start_time, "cmdline": [a.decode("utf-8", "replace") for a in args]}


def _boot_id() -> str | None:
    try:
        with open(BOOT_ID_FILE, encoding="ascii") as fh:
            return fh.read().strip() or None
    except (OSError, ValueError):
        return None


def recorded_elsewhere(record: RunRecord) -> bool:
    """Whether the run's controller ran on another host than this one."""
    host = record.controller.get("host")
    return host is not None and host != _this_host()


def controller_alive(record: RunRecord) -> bool:
    """Whether the run's controller still runs here: same pid, host, boot, start
    time and command line. Records without ``controller`` check the pid only.
    """
    return _controller_alive(record.controller_pid, record.controller)


def same_controller(recorded: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Whether ``current`` (``process_identity``) is the process ``recorded``."""
    if not current or recorded.get("host") != current.get("host"):
        return False
    return all(recorded[key] == current.get(key) for key in IDENTITY_KEYS if key in recorded)


def _controller_alive(pid: Any, info: Mapping[str, Any]) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if not info:
        return process_alive(pid)  # a record from before identities were kept
    if not process_alive(pid):
        return False
    if not any(key in info for key in IDENTITY_KEYS):  # written where /proc was missing
        return info.get("host") == _this_host()
    return same_controller(info, process_identity(pid))


def read_record(run: RunDir) -> RunRecord | None:
    """The run's record; None without ``state.json``, and a ``DAMAGED`` record
    saying why when it cannot be read: a run never vanishes from ``ps``.
    """
    try:
        data = run.load_json(STATE_FILE)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return damaged(run, f"cannot be read: {exc}")
    if not isinstance(data, dict):
        return damaged(run, f"holds a {type(data).__name__}, not a run's record")
    version = data.get("version", 2 if "owner" in data else 1)
    if version != RECORD_VERSION:
        return other_version(run, version, data)
    try:
        state = RunState(data.get("state"))
        pid = data.get("controller_pid")
        controller = data.get("controller")
        controller = controller if isinstance(controller, dict) else {}
        started = data.get("started")
        root = data.get("root_cause")
        backend = str(data["backend"])
        owner = Owner.from_json(data["owner"])
        record = RunRecord(
            run_id=os.path.basename(run.path), run=run, state=state,
            backend=backend, started=started,
            wall_s=data.get("wall_s"),
            nodes=tuple(NodeRecord(int(n["node_rank"]), str(n["host"]), str(n["run_dir"]),
                                   str(n.get("python", "python3")), n.get("connection") or {})
                        for n in data.get("nodes", [])),
            outcomes=tuple(NodeOutcome.from_dict(o) for o in data.get("outcomes") or []),
            root_cause=NodeOutcome.from_dict(root) if root else None,
            controller_pid=pid, controller=controller,
            owner=owner,
            attempts=tuple(AttemptOutcome.from_dict(a) for a in data.get("attempts") or []),
            ended=_number(data.get("ended")), error=str(data.get("error") or ""),
            results_home=bool(data.get("results_home", not owner.detached)),
            waited_s=_number(data.get("waited_s")))
        # Only an attached run ends with its controller: a detached run is its
        # nodes' keepers', and a scheduler's job is the scheduler's, once they
        # have it. A run still STARTING had handed itself to nobody yet (no
        # keeper started, no job submitted): it ended with its controller too.
        if state.live and (owner.ends_with_controller or state is RunState.STARTING) \
                and not recorded_elsewhere(record) and not controller_alive(record):
            state = RunState.INTERRUPTED
        wall, waited = record.wall_s, record.waited_s
        if started and state.live:
            if waited is None and state in (RunState.STARTING, RunState.PENDING):
                waited = time.time() - started  # still waiting: no time of its own yet
            elif wall is None:
                wall = time.time() - started - (waited or 0.0)
        return replace(record, state=state, wall_s=wall, waited_s=waited)
    except KeyError as exc:
        return damaged(run, f"lacks {exc}", data)
    except (TypeError, ValueError) as exc:  # OwnerError is a ValueError
        return damaged(run, str(exc) or type(exc).__name__, data)


# The shape of ``state.json``. 1: before run owners (a ``rule`` word); 2: an
# ``owner``; 3: each node outcome's ``why``. A record of another version is
# listed, never guessed at.
RECORD_VERSION = 3


def damaged(run: RunDir, why: str, data: Mapping[str, Any] | None = None) -> RunRecord:
    """A run whose ``state.json`` cannot be read, as ``ps`` lists it, with
    ``error`` saying why."""
    try:
        written: float | None = os.path.getmtime(run.state_file())
    except OSError:
        written = None
    backend = data.get("backend") if data else None
    return RunRecord(run_id=os.path.basename(run.path), run=run, state=RunState.DAMAGED,
                     backend=backend if isinstance(backend, str) else "", started=written,
                     wall_s=None, nodes=(), outcomes=(), root_cause=None, controller_pid=None,
                     error=f"its record is damaged: {STATE_FILE} {why}"[:500])


def other_version(run: RunDir, version: Any, data: Mapping[str, Any]) -> RunRecord:
    """A run written by a ddp-orch whose records this one cannot read:
    ``damaged``, saying which version wrote it, never read as a guess."""
    older = isinstance(version, int) and not isinstance(version, bool) \
        and version < RECORD_VERSION
    said = (f"recorded by an older ddp-orch (record version {version}"
            + (", before run owners" if version == 1 else "") + ")" if older else
            f"recorded by a newer ddp-orch (record version {str(version)[:20]})")
    record = damaged(run, "", data)
    return replace(record, error=(
        f"{said}; this ddp-orch reads version {RECORD_VERSION}: run `ddp-orch ps`, `status` "
        "or `down` with the ddp-orch that wrote it"))


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def kept_without_controller(record: RunRecord) -> bool:
    """Whether ``record`` is live with no controller to record its end (a
    detached run, or a scheduler's job whose controller is gone): only its
    backend can say how it is."""
    if not record.live or record.owner.ends_with_controller:
        return False
    return record.owner.detached or not controller_alive(record)


def list_runs(runs_dir: str) -> Iterator[RunRecord]:
    """Every recorded run, newest first by start time (run ids need not sort by time)."""
    if not os.path.isdir(runs_dir):
        return
    root = os.path.abspath(runs_dir)
    records = [read_record(RunDir(os.path.join(root, name))) for name in os.listdir(root)
               if os.path.isdir(os.path.join(root, name))]  # not the marker, a .gitignore
    yield from sorted((r for r in records if r is not None),
                      key=lambda r: (r.started or 0.0, r.run_id), reverse=True)


AMBIGUOUS_SHOWN = 10  # the runs an ambiguous prefix lists, newest first


def latest_run(runs_dir: str, which: Callable[[RunRecord], bool] = lambda record: True,
               what: str = "run") -> RunRecord:
    """The newest recorded run ``which`` accepts (what a command means without a
    run id), or a ConfigError naming the runs directory."""
    for record in list_runs(runs_dir):
        if which(record):
            return record
    raise ConfigError(f"no {what} in {os.path.abspath(runs_dir)}", source="command line",
                      hint="`ddp-orch ps` lists the runs; pass --runs-dir if they live "
                           "elsewhere")


def find_run(runs_dir: str, run_id: str) -> RunRecord:
    """The run ``run_id`` (a unique prefix is enough), or a ConfigError."""
    if not valid_run_id(run_id):
        raise ConfigError(f"{run_id!r} is not a run id", source="command line",
                          hint="`ddp-orch ps` lists the runs")
    records = list(list_runs(runs_dir))  # newest first
    matches = [r for r in records if r.run_id == run_id] or \
        [r for r in records if r.run_id.startswith(run_id)]
    if not matches:
        raise ConfigError(f"no run matching {run_id!r} in {os.path.abspath(runs_dir)}",
                          source="command line",
                          hint="`ddp-orch ps` lists the runs; pass --runs-dir if they live "
                               "elsewhere")
    if len(matches) > 1:
        shown = matches[:AMBIGUOUS_SHOWN]
        more = len(matches) - len(shown)
        listing = "".join(f"\n    {r.run_id}  started {_started(r)}" for r in shown) + \
            (f"\n    ... and {more} more" if more else "")
        raise ConfigError(f"{len(matches)} runs matching {run_id!r} in "
                          f"{os.path.abspath(runs_dir)}, newest first:{listing}",
                          source="command line",
                          hint="give more characters of the run id, enough for one run")
    return matches[0]


def _started(record: RunRecord) -> str:
    if _number(record.started) is None:
        return "at an unknown time"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.started))
    except (TypeError, ValueError, OverflowError, OSError):
        return "at an unknown time"
