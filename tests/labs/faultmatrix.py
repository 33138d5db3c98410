"""The fault matrix, declared: every (backend, owner, phase, fault) cell that
applies, with what the run must do. The runner (``faultrunner.py``) runs a
cell; ``tests/live/test_fault_matrix*.py`` make each cell a test
(``pytest -m faultmatrix -k 'ssh and attached and training and frozen'``);
``docs/reliability.md`` is rendered from this declaration
(``scripts/reliability-table``), so a bound written there is the bound tested.

Pure data and rules: no process starts here.

A cell's fault always strikes node 1 (rank 1), the node that is not the
master: a fault of node 0 is the same fault with the master's rendezvous
gone too, which the nodes' own tests cover.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

BACKENDS = ("local", "ssh", "slurm")
OWNERS = ("attached", "kept", "detached")
# up: attached; up --max-restarts 1: the nodes' keepers hold it, attached; up --detach
OWNER_OPTIONS = {"attached": (), "kept": ("--max-restarts", "1"), "detached": ("--detach",)}
PHASES = ("connect", "setup", "rendezvous", "workers_starting", "training", "teardown")
PHASE_WORDS = {
    "connect": "while the controller opens the node's agent",
    "setup": "during the nodes' `setup:`",
    "rendezvous": "while node 0's torchrun waits for node 1 at the rendezvous",
    "workers_starting": "as the workers start (before they join the process group)",
    "training": "while the ranks train",
    "teardown": "while the gang tears down after a rank failed",
}
GRACE_S = 3.0  # every cell's `up --grace`
START_TIMEOUT_S = 60.0  # every cell's `up --start-timeout`
SILENCE_S = 30.0  # protocol.PEER_TIMEOUT_S: the controller and a node give up on each other
LINK_S = 10.0  # kept/peers.GANG_TIMEOUT_S: the keepers give up on a silent link
TORCHRUN_ENDS_S = 15.0  # labs/bounds.py: torchrun ending its node's other ranks
AT_ONCE_S = 5.0  # labs/bounds.py
MARGIN_S = 5.0  # a loaded 2-core machine: interpreter exits, the summary, the records
PAUSE_SHORT_S = 20.0  # a laptop lid: the run must survive it
PAUSE_LONG_S = 60.0  # past every silence: an attached run ends, and says why
UNREAD_S = 60.0  # the controller's output not read for this long: the run must survive
SMI_TIMEOUT_S = 20.0  # agent/node/gpuclaim.SMI_TIMEOUT_S


@dataclass(frozen=True)
class Fault:
    name: str  # the cell id's word
    what: str  # what happened, in docs/failures.md's words
    todo: str  # what to do about it
    phases: tuple[str, ...]
    backends: tuple[str, ...] = BACKENDS
    owners: tuple[str, ...] = OWNERS


# How a run ends after a fault:
SURVIVES = "survives"  # the run goes on and succeeds
RESTARTS = "restarts"  # a kept run restarts the gang, and the next attempt succeeds
FAILS = "fails"  # failed, the root cause naming node 1 in the words given
INTERRUPTED = "interrupted"  # `ps`/`status`: interrupted (its controller is gone)
REFUSED = "refused"  # the launch stops before any rank starts, naming node 1 and why
GOES_ON = "goes on"  # not ours to end (Slurm's, a detached run's keepers'): `down` ends it


@dataclass(frozen=True)
class Expect:
    ends: str
    shown: str = ""  # what you see (the root cause's or the refusal's words, as failures.md)
    pattern: str = ""  # a regex the root cause (or the error) must match
    within_s: float = 0.0  # from the fault to the run's end and nothing of it left
    bound: str = ""  # the bound in docs/failures.md's words
    node: int | None = 1  # the node the root cause names (None: any, as the run's)

    def describe(self) -> str:
        return {SURVIVES: "goes on; succeeds", RESTARTS: "the gang restarts; succeeds",
                INTERRUPTED: "interrupted", GOES_ON: "goes on until `down`"}.get(
            self.ends, self.ends)


@dataclass(frozen=True)
class Excluded:
    why: str


FAULTS = (
    Fault("rank_raises", "a rank raises", "fix the script; the traceback is in node-1.log",
          ("workers_starting", "training")),
    Fault("rank_sigkill", "a rank is killed (`kill -9`, the OOM killer)",
          "check `dmesg` on that node for the OOM killer", ("workers_starting", "training")),
    Fault("node_frozen", "the node freezes (its sshd or its agent stopped: a hung host)",
          "check the host; `ddp-orch down RUN` once it is back double-checks it",
          PHASES),
    Fault("link_cut", "the node's link is cut (no FIN, no RST: a pulled cable)",
          "check the network", ("setup", "rendezvous", "workers_starting", "training"),
          backends=("ssh",)),
    Fault("supervisor_sigkill", "the node's agent (supervisor, or keeper) is killed (`kill -9`)",
          "nothing: its guardian ended the run there", ("setup", "workers_starting", "training")),
    Fault("controller_sigkill", "the controller is killed (`kill -9`)",
          "nothing; `ddp-orch down RUN` double-checks",
          ("connect", "setup", "workers_starting", "training")),
    Fault("controller_paused_20s", "the controller is paused 20 s (a laptop lid, Ctrl-Z)",
          "nothing", ("setup", "training")),
    Fault("controller_paused_60s", "the controller is paused 60 s",
          "keep the machine awake, or `up --detach`", ("training",)),
    Fault("output_unread_60s", "the controller's output is not read for 60 s (`| less`, Ctrl-S)",
          "nothing: the logs keep every line", ("training",)),
    Fault("runs_dir_full", "the controller's runs directory is full",
          "free space there, or `--runs-dir` elsewhere", ("connect", "training"),
          backends=("local", "ssh")),
    Fault("node_disk_full", "the node's workdir is full",
          "free space on that node, or another `workdir:`", ("connect", "training"),
          backends=("ssh",), owners=("attached",)),
    Fault("smi_hangs", "nvidia-smi hangs on the node (a wedged driver)",
          "reset or drain the GPU; list other GPUs", ("connect", "training"),
          backends=("local", "slurm"), owners=("attached",)),
)
FAULT = {f.name: f for f in FAULTS}


@dataclass(frozen=True)
class Cell:
    backend: str
    owner: str
    phase: str
    fault: str

    @property
    def id(self) -> str:
        return f"{self.backend}-{self.owner}-{self.phase}-{self.fault}"

    @property
    def expect(self) -> "Expect | Excluded":
        return expect(self)


def expect(cell: Cell) -> Expect | Excluded:
    """What ``cell``'s run must do: docs/failures.md's promise for it."""
    b, o, p, f = cell.backend, cell.owner, cell.phase, cell.fault
    slurm = b == "slurm"
    keepers = o in ("kept", "detached") and not slurm  # the nodes' keepers hold the gang
    if slurm and o == "kept":
        return Excluded("gang restarts are for the local and SSH backends (Slurm: resubmit, "
                        "or sbatch --requeue)")
    grace_end = GRACE_S + MARGIN_S
    if p == "teardown" and f not in ("controller_sigkill",):
        # the teardown of rank 0's failure: the fault striking it must not
        # take the root cause's place, nor hold the end past the teardown's
        return Expect(FAILS, "the run's own root cause: `root cause: node 0 (host): ... "
                             "rank 0 ... failed: RuntimeError: ...`",
                      r"rank 0 raises to start the teardown",
                      GRACE_S + 5.0 + 5.0 + MARGIN_S + (SILENCE_S if keepers else 0.0),
                      "the teardown's own: the grace period, then SIGKILL (5 s), then the "
                      "node is cut off", node=0)
    after_detach = o == "detached" and p in ("workers_starting", "training", "teardown")
    if after_detach and f in ("controller_paused_20s", "controller_paused_60s",
                              "output_unread_60s", "runs_dir_full"):
        return Excluded("a detached run has no controller once `up --detach` has returned "
                        "(its workers run); `attach` only follows it")
    if f in ("rank_raises", "rank_sigkill"):
        words = (r"torchrun exited 1; rank 1 \(local rank 0\) failed: RuntimeError: fault "
                 r"matrix: rank 1 raises" if f == "rank_raises" else
                 r"rank 1 \(local rank 0\) failed: .*(SIGKILL|Signal 9)")
        shown = ("`root cause: node 1 (host): torchrun exited 1; rank 1 (local rank 0) "
                 "failed: RuntimeError: ...`" if f == "rank_raises" else
                 "`root cause: node 1 (host): ... rank 1 (local rank 0) failed: Signal 9 "
                 "(SIGKILL) received by PID ...`")
        if o == "kept":
            return Expect(RESTARTS, "`attempt 0 failed (...); restarting the whole gang`, "
                                    "then the next attempt", within_s=TORCHRUN_ENDS_S
                          + 2 * grace_end + 30.0,
                          bound="the grace period and a backoff, then a new rendezvous")
        return Expect(FAILS, shown, words, TORCHRUN_ENDS_S + grace_end,
                      "the grace period, once torchrun has ended node 1's own ranks")
    if f in ("node_frozen", "link_cut"):
        if slurm and p == "connect":  # its job step's agent never starts: its torchrun neither
            return Expect(FAILS, "`node 1 (host): did not join the rendezvous before the start "
                                 "timeout`", r"did not join|start timeout",
                          START_TIMEOUT_S + grace_end + SILENCE_S, "the start timeout")
        if slurm:
            return Expect(GOES_ON, "the job stays running (Slurm owns its nodes' liveness)",
                          within_s=SILENCE_S + grace_end,
                          bound="Slurm's: its node health check, the job's `--time`; "
                                "`ddp-orch down` ends it")
        if p == "connect":
            return Expect(FAILS, "`not joined: node 1 (host)` after `--start-timeout`",
                          r"did not (join|answer)|never|start timeout|not joined",
                          START_TIMEOUT_S + grace_end + SILENCE_S, "the start timeout")
        if keepers and (f == "link_cut" or b == "local") and p != "connect":
            return Expect(FAILS, "`status`: `root cause: node 1 (host): its keeper could not "
                                 "be heard: nothing on the link for 10s`",
                          r"could not be heard|nothing from the node|lost",
                          LINK_S + grace_end + SILENCE_S,
                          "10 s after the last heartbeat it sent, then the grace period")
        if o == "detached" and f == "node_frozen":  # its sshd frozen, after the keepers' start
            return Expect(SURVIVES, "nothing: a detached run's keepers talk to each other "
                                    "directly, not through sshd", within_s=0.0, bound="-")
        return Expect(FAILS, "`node 1 (host) silent for 30s; stopping every node`, then "
                             "`lost: nothing from the node for 30s`",
                      r"nothing from the node for 30s", SILENCE_S + grace_end + 10.0,
                      "30 s of silence, then the teardown, which never waits on the frozen "
                      "link: 45 s with the default grace period")
    if f == "supervisor_sigkill":
        if keepers:
            return Expect(FAILS, "`status`: `root cause: node 1 (host): its keeper could not "
                                 "be heard: the link closed`",
                          r"could not be heard|keeper|lost|ended without",
                          AT_ONCE_S + grace_end + 10.0,
                          "at once (its link closes), then the grace period")
        return Expect(FAILS, "`lost: the node agent ended without reporting (killed by "
                             "signal 9)`",
                      r"ended without reporting|killed|signal 9|without a report",
                      AT_ONCE_S + grace_end,
                      "its guardian ends the run there at once, then the grace period")
    if f == "controller_sigkill":
        if slurm:
            return Expect(SURVIVES, "the job goes on: `status` and `attach` give its end",
                          within_s=0.0, bound="-")
        if o == "detached" and p != "connect":
            return Expect(SURVIVES, "nothing: the run is its keepers' from their start "
                                    "(killed: `up` before it returned, or `attach`, "
                                    "which only follows)", within_s=0.0, bound="-")
        return Expect(INTERRUPTED, "`ddp-orch ps` shows the run as interrupted",
                      within_s=AT_ONCE_S + grace_end + (2.0 if keepers else 0.0),
                      bound="at once: each node sees its controller's link close, then the "
                            "grace period")
    if f == "controller_paused_20s":
        return Expect(SURVIVES, "nothing: 20 s is under the 30 s of silence either side "
                                "gives the other", within_s=0.0, bound="-")
    if f == "controller_paused_60s":
        if slurm:
            return Expect(SURVIVES, "the job goes on; the controller follows it on waking",
                          within_s=0.0, bound="-")
        return Expect(FAILS, "`root cause: node K (host): stopped its run after 30s without "
                             "hearing from ddp-orch, which was paused for 60s`",
                      r"paused for", PAUSE_LONG_S + grace_end + 5.0,
                      "the nodes stop after 30 s of silence; the controller says why when it "
                      "wakes", node=None)
    if f == "output_unread_60s":
        return Expect(SURVIVES, "the output once read, with `N line(s) ... not shown` past "
                                "16 MiB held", within_s=0.0, bound="-")
    if f == "runs_dir_full":
        if p == "connect":
            return Expect(REFUSED, "`No space left on device`, naming the runs directory",
                          r"No space left|no space|full", AT_ONCE_S + MARGIN_S, "at once")
        if b == "local":  # the nodes' own run directories are in it: their logs fill
            # (a keeper's stream too: it keeps room of its own for its last lines)
            return Expect(FAILS, "`root cause: node K (host): the node's disk is full at "
                                 "...: No space left on device`",
                          r"No space left|Errno 28", 0.0,
                          "a rank's next write that needs room (a log's page), then the grace "
                          "period", node=None)
        return Expect(SURVIVES, "`ddp-orch: cannot write node-1.log: No space left on device` "
                                "once; the run goes on, and is recorded once there is room",
                      within_s=0.0, bound="-")
    if f == "node_disk_full":
        if p == "connect":
            return Expect(REFUSED, "`connecting to the nodes failed: node 1 (host): ... No "
                                   "space left on device`", r"No space left",
                          AT_ONCE_S + MARGIN_S, "at once")
        # Not timed from the fill: the rank's output goes to a log on that
        # disk (torchrun's), whose last page takes lines until it is full
        # (at this cell's pace, a line every 0.25 s: about a minute).
        return Expect(FAILS, "`root cause: node 1 (host): ... No space left on device`",
                      r"No space left|Errno 28", 0.0,
                      "a rank's next write that needs room (a log's page), then the grace "
                      "period")
    if f == "smi_hangs":
        if slurm and p == "connect":
            return Excluded("Slurm gives the job its GPUs (gres): nothing asks nvidia-smi "
                            "before the job's ranks start")
        if p == "connect":
            return Expect(REFUSED, "`node 1 (host): nvidia-smi did not answer within 20s`",
                          r"nvidia-smi", SMI_TIMEOUT_S + MARGIN_S + 10.0,
                          "nvidia-smi's 20 s bound")
        return Expect(SURVIVES, "nothing: the heartbeats stop asking for GPU use",
                      within_s=0.0, bound="-")
    return Excluded("no rule")


def cells() -> list[Cell]:
    """Every cell the faults declare, applicable or excluded (``expect``)."""
    out = []
    for fault in FAULTS:
        for backend in fault.backends:
            for owner in fault.owners:
                for phase in fault.phases:
                    if phase == "setup" and backend == "slurm" and owner == "detached":
                        continue  # the same job's setup as attached: not a separate path
                    out.append(Cell(backend, owner, phase, fault.name))
    return out


CELLS = cells()
CELL = {c.id: c for c in CELLS}


def ci_share(commit: str, size: int, regressions: list[str]) -> list[str]:
    """The cells a CI run of ``commit`` runs: ``size`` of them chosen by the
    commit's hash (so over commits every cell runs), and every cell that
    has ever failed."""
    runnable = [c.id for c in CELLS if isinstance(c.expect, Expect)]
    ranked = sorted(runnable, key=lambda cid: hashlib.sha256(f"{commit}:{cid}".encode())
                    .hexdigest())
    return sorted(set(ranked[:size]) | {r for r in regressions if r in CELL})


REGRESSIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fault_regressions.txt")


def regressions() -> list[str]:
    """The cells that have failed once (``fault_regressions.txt``, a cell id a
    line, ``#`` comments): CI runs each of them on every commit."""
    try:
        with open(REGRESSIONS, encoding="utf-8") as fh:
            return [line.split("#")[0].strip() for line in fh if line.split("#")[0].strip()]
    except FileNotFoundError:
        return []


def render() -> str:
    """docs/reliability.md's table: each fault, by owner, with what the run
    does and its bound, and the cells that do not apply with why."""
    out = ["| what happened | owner | where (phases) | what the run does | what you see "
           "| bound (from the fault) | what to do |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    excluded = []
    for fault in FAULTS:
        rows: dict[tuple, list[str]] = {}
        for cell in (c for c in CELLS if c.fault == fault.name):
            verdict = cell.expect
            if isinstance(verdict, Excluded):
                excluded.append((cell, verdict.why))
                continue
            bound = verdict.bound
            if verdict.within_s:
                bound += f" (tested: {verdict.within_s:g} s at most, `--grace {GRACE_S:g}`)"
            key = (cell.owner, verdict.describe(), verdict.shown, bound)
            rows.setdefault(key, []).append(f"{cell.backend} {cell.phase}")
        for (owner, does, shown, bound), where in rows.items():
            places = ", ".join(_grouped(where))
            out.append(f"| {fault.what} | {owner} | {places} | {does} | {shown or '-'} "
                       f"| {bound or '-'} | {fault.todo} |")
    text = "\n".join(out) + "\n"
    if excluded:
        whys: dict[str, list[str]] = {}
        for cell, why in excluded:
            whys.setdefault(why, []).append(cell.id)
        text += "\nNot tested, with why:\n\n" + "".join(
            f"- {why}: {len(ids)} cell(s) ({', '.join(sorted(ids)[:3])}"
            f"{', ...' if len(ids) > 3 else ''})\n" for why, ids in whys.items())
    return text


def _grouped(where: list[str]) -> list[str]:
    """``local setup, local training, ssh setup`` as ``local: setup, training; ssh: setup``."""
    by_backend: dict[str, list[str]] = {}
    for item in where:
        backend, phase = item.split(" ", 1)
        by_backend.setdefault(backend, []).append(phase.replace("_", " "))
    return [f"{b}: {' / '.join(p)}" for b, p in by_backend.items()]
