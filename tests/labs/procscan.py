"""Find every process of a run the way an operator would: in /proc.

One scan (``run_pids``) finds what a run leaves on this machine, which in
the tests is the controller and every node (the labs' hosts are this
machine's processes):

* every process that carries the run in its environment: the worker marker
  ``DDP_ORCH_RUN_ID=<run id>`` (torchrun, the workers, ``setup:`` commands:
  what the teardown ends) or ddp-orch's own ``DDP_ORCH_RUN=<run id>``
  (``orchestrator.agent.node.procs.OWN_MARKER``: each agent, the supervisor it
  becomes, its guardian, a keeper, a follower, a Slurm job's agents);
* with ``labs``, the SSH sessions the run opened there: every sshd session
  process under a lab host's listener, unless what runs in it carries
  another run (a session left open with nothing in it, or with an unmarked
  command, counts as this run's: a lab is used by one test at a time).

``wait_gone`` is the "nothing left" check of every live test. It returns
a ``Leftovers`` set: empty compares equal to ``set()``, and a failing
assertion shows each pid with what it is and its command line.

Two live modules run side by side under ``pytest -n 2`` (tests/conftest.py),
so a run id scanned here must be one module's: the first scan of an id
claims it for its module (``claim``), and a scan of the same id from another
module fails, whichever order they ran in, before two runs can be mistaken
for each other.
"""

from __future__ import annotations

import os
import time

from orchestrator.agent.node.procs import OWN_MARKER, proc_table

WORKER_MARKER = "DDP_ORCH_RUN_ID"
RUN_IDS_ENV = "DDP_ORCH_TEST_RUN_IDS"


class Leftovers(set):
    """Pids, shown with their command lines when an assertion fails."""

    def __repr__(self) -> str:
        if not self:
            return "set()"
        return "{" + ", ".join(f"{pid}: {describe(pid)!r}" for pid in sorted(self)) + "}"


def run_pids(run_id: str, labs=()) -> Leftovers:
    """Every live (non-zombie) process of ``run_id`` here, and with ``labs``
    the sshd sessions it holds open on those labs' hosts."""
    claim(run_id)
    table = _table()
    found = Leftovers(pid for pid, (_ppid, state) in table.items()
                      if state not in ("Z", "X") and run_of(pid) == run_id)
    for lab in labs:
        found |= lab_sessions(lab, run_id, table)
    return found


def wait_gone(run_id: str, timeout: float, labs=()) -> Leftovers:
    """Wait until no process of the run is left (``run_pids``); returns what
    is left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        left = run_pids(run_id, labs)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def claim(run_id: str) -> None:
    """Record that the running test's module uses ``run_id``; fail if another
    module of this session already did (the registry is the directory in
    ``$DDP_ORCH_TEST_RUN_IDS``, made by tests/conftest.py)."""
    registry = os.environ.get(RUN_IDS_ENV)
    module = os.environ.get("PYTEST_CURRENT_TEST", "").split("::", 1)[0]
    if not registry or not module:
        return
    path = os.path.join(registry, run_id.replace("/", "%2F"))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        with open(path, encoding="utf-8") as fh:
            owner = fh.read()
        assert owner == module, (f"run id {run_id!r} is used by {owner} and {module}: live "
                                 f"modules run side by side, so give one of them another id")
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(module)


def lab_sessions(lab, run_id: str, table: dict | None = None) -> set[int]:
    """The sshd session processes under ``lab``'s listeners (each host's)
    that are ``run_id``'s: every session whose processes carry no other
    run. A session is the listener's sshd child and the sshd processes
    under it (privilege separation); the commands run below those."""
    table = table if table is not None else _table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, state) in table.items():
        if state not in ("Z", "X"):
            children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    for index in range(len(lab.hosts)):
        try:
            listener = lab.listener_pid(index)
        except KeyError:  # a host the test stopped
            continue
        for session in children.get(listener, ()):
            tree = _descendants(session, children) | {session}
            if not _is_sshd(session) or any(run_of(p) not in (None, run_id) for p in tree):
                continue
            found |= {p for p in tree if _is_sshd(p)}
    return found


def run_of(pid: int) -> str | None:
    """The run ``pid`` carries (either marker), or None."""
    env = environ_of(pid)
    return env.get(OWN_MARKER) or env.get(WORKER_MARKER)


def describe(pid: int) -> str:
    """What a leftover is, for an assertion's message: its role and command line."""
    env = environ_of(pid)
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = " ".join(fh.read().decode("utf-8", "replace").split())
    except OSError:
        cmd = "(gone)"
    if WORKER_MARKER in env:
        role = "worker" if "RANK" in env else "torchrun or setup"
    elif OWN_MARKER in env:
        role = ("ddp-orch guardian" if "_guard()" in cmd else
                "ddp-orch agent (supervisor, keeper, follower)" if "ddp_orch_agent" in cmd
                else "ddp-orch")
    else:
        role = "sshd session"
    return f"{role}: {cmd[:120]}"


def worker_pids(run_id: str) -> set[int]:
    """Live processes with the worker marker only (``DDP_ORCH_RUN_ID``):
    torchrun, the workers and setup commands, what the teardown ends."""
    claim(run_id)
    return {pid for pid, (_ppid, state) in _table().items()
            if state not in ("Z", "X") and environ_of(pid).get(WORKER_MARKER) == run_id}


def environ_of(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return {}
    return dict(entry.decode("utf-8", "replace").partition("=")[::2]
                for entry in raw.split(b"\0") if entry)


def workers(run_id: str, node_rank: int) -> dict[int, int]:
    """{global rank: pid} of the run's worker processes on node ``node_rank``."""
    out = {}
    for pid in worker_pids(run_id):
        env = environ_of(pid)
        if env.get("DDP_ORCH_NODE_RANK") == str(node_rank) and "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


def agent(run_id: str, node_rank: int) -> int:
    """The pid of the torchrun agent of ``node_rank`` (marked, but no RANK)."""
    for pid in worker_pids(run_id):
        env = environ_of(pid)
        if env.get("DDP_ORCH_NODE_RANK") == str(node_rank) and "RANK" not in env:
            return pid
    raise LookupError(f"no torchrun agent of {run_id} node {node_rank}")


def _table() -> dict[int, tuple[int, str]]:
    """{pid: (ppid, state)} of every process now."""
    return {pid: (ppid, state) for pid, ppid, state in proc_table()}


def _descendants(pid: int, children: dict[int, list[int]]) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _is_sshd(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("sshd")
    except OSError:
        return False
