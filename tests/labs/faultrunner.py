"""Runs one cell of the fault matrix (``faultmatrix.py``) for real: a two-node
run of ``tests/programs/faultable.py`` on the cell's backend and owner,
held at the cell's phase by a gate, the fault injected on node 1, then every
promise checked:

* the run ends as the cell expects (``Expect.ends``), within its bound from
  the fault, measured on the run's records (``state.json``'s end, each
  node's ``supervisor.json``), or goes on and succeeds;
* the root cause (or the refusal) names node 1 in docs/failures.md's words;
* nothing of the run is left on any node (``procscan.wait_gone``: workers,
  torchrun, every agent, supervisor, guardian, keeper, SSH session);
* the GPU locks are free (the cells that hold fake GPUs);
* ``status --json``, ``ps --json`` and the summary agree on the end.

Gates. A phase is held by a file the node waits for (``<gates>/<who>.<phase>
.release``), and said by one it writes (``.reached``): the nodes' ``python:``
is a wrapper that holds the agent's start (connect) and torchrun's
(rendezvous); ``setup:`` runs a gate (setup); the program holds its ranks
before they join the group (workers starting) and says when it trains. Every
gate but the cell's is released from the start.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from conftest import ROOT, run_cli
from faultmatrix import (FAILS, GOES_ON, GRACE_S, INTERRUPTED, OWNER_OPTIONS, PAUSE_LONG_S,
                         PAUSE_SHORT_S, REFUSED, RESTARTS, START_TIMEOUT_S, SURVIVES, UNREAD_S,
                         Cell, Excluded, Expect)
from procscan import OWN_MARKER, environ_of, wait_gone, workers

PROGRAM = os.path.join(ROOT, "tests", "programs", "faultable.py")
PHASE_TIMEOUT_S = 120.0  # a cold start on a loaded machine: agents, torch, two ranks
END_TIMEOUT_S = 240.0  # a cell that must end: the bound is checked on its records
WRAPPER = """#!/bin/sh
# {node}'s python for the fault matrix: holds the agent's start (connect) and
# torchrun's (rendezvous) until the test releases them.
G={gates}
K=${{SLURM_NODEID:-{index}}}
case " $* " in
  *" -m torch.distributed.run "*) phase=rendezvous ;;
  *" -I -S "*) phase=connect ;;
  *) phase= ;;
esac
if [ -n "$phase" ]; then
  : > "$G/node$K.$phase.reached"
  while [ ! -e "$G/node$K.$phase.release" ] && [ ! -e "$G/all.release" ]; do sleep 0.05; done
fi
exec {python} "$@"
"""
SETUP_GATE = """#!/bin/sh
# the fault matrix's setup: holds each node's setup until the test releases it
G={gates}
K=$DDP_ORCH_NODE_RANK
: > "$G/node$K.setup.reached"
while [ ! -e "$G/node$K.setup.release" ] && [ ! -e "$G/all.release" ]; do sleep 0.05; done
echo "node $K set up"
"""
# the gate each phase is held at on node 1, and the file that says it is reached
HELD = {"connect": "node1.connect", "setup": "node1.setup", "rendezvous": "node1.rendezvous",
        "workers_starting": "rank1.start"}
REACHED = {**HELD, "training": "rank1.training", "teardown": "rank1.teardown"}
ALL_GATES = ("node0.connect", "node1.connect", "node0.setup", "node1.setup",
             "node0.rendezvous", "node1.rendezvous", "rank0.start", "rank1.start")


@dataclass
class Rig:
    """A backend's lab for a module's cells: its two node hosts, the env a
    command needs (a lab's HOME, Slurm's config), and the lab to scan."""

    backend: str
    hosts: tuple[str, str]
    env: dict[str, str] = field(default_factory=dict)
    lab: object = None  # an SshLab/NetLab, whose sessions the scan counts; None otherwise
    netlab: object = None  # a NetLab, for cutting a link
    slurm: object = None  # the SlurmLab

    @property
    def labs(self) -> list:
        return [self.lab] if self.lab is not None else []


@dataclass
class Outcome:
    """What a cell's run did, for the checks and the matrix's table."""

    cell: Cell
    fault_at: float = 0.0
    downed: bool = False  # it went on, and `down` ended it
    exited_at: float | None = None  # when `up` exited, as the runner saw it
    out: str = ""
    code: int | None = None
    state: dict = field(default_factory=dict)
    status: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class CellRun:
    def __init__(self, cell: Cell, rig: Rig, tmp_path):
        self.cell, self.rig, self.tmp = cell, rig, tmp_path
        expect = cell.expect
        assert isinstance(expect, Expect), f"{cell.id} is excluded: {expect}"
        self.expect: Expect = expect
        self.run_id = "fm-" + re.sub(r"[^a-z0-9]+", "", cell.id.replace("_", ""))[:40]
        self.gates = tmp_path / "gates"
        self.gates.mkdir()
        self.runs = tmp_path / "runs"
        self.proc: subprocess.Popen | None = None
        self.result = Outcome(cell)
        self.restore: list = []  # what undoes the fault (thaw, mend), run in ``finally``
        self.unmount: list = []  # a small disk's unmount, once the checks have read it
        self.smi = None

    # -- the run's files ------------------------------------------------------

    def cluster_file(self) -> str:
        cell, rig = self.cell, self.rig
        for k in (0, 1):
            path = self.gates / f"python-node{k}"
            path.write_text(WRAPPER.format(node=f"node {k}", gates=self.gates, index=k,
                                           python=sys.executable))
            path.chmod(0o755)
        gpus = cell.fault == "smi_hangs"
        slurm = rig.backend == "slurm"  # one python runs a Slurm job: the wrapper reads SLURM_NODEID
        nodes = "".join(
            f"  - {{host: {host}, {f'gpus: [{k}]' if gpus else 'procs: 1'}"
            + ("" if slurm else f", python: {self.gates / f'python-node{k}'}") + "}\n"
            for k, host in enumerate(rig.hosts))
        program = self.tmp / "faultable.py"
        shutil.copy(PROGRAM, program)
        args = ["--gates", str(self.gates)]
        if cell.fault == "output_unread_60s":
            args += ["--chatty-at", "5"]
        if cell.phase == "teardown":
            args += ["--slow-stop", "1", "--stop-s", "20"]
        text = (f"name: fm\n" + (f"backend: slurm\npython: {self.gates / 'python-node1'}\n"
                                  if slurm else "")
                + ("device: cpu\n" if gpus else "")
                + (f"workdir: {self.tmp / 'remote'}\n" if rig.backend == "ssh" else "")
                + f"nodes:\n{nodes}workload: {{script: faultable.py, args: {json.dumps(args)}}}\n")
        if cell.phase == "setup":
            gate = self.gates / "setup-gate"
            gate.write_text(SETUP_GATE.format(gates=self.gates))
            gate.chmod(0o755)
            text += f"setup: [[{gate}]]\n"
        path = self.tmp / "fm.yaml"
        path.write_text(text)
        return str(path)

    def release(self, *names: str) -> None:
        for name in names:
            (self.gates / f"{name}.release").touch()

    def reached(self, name: str) -> bool:
        return (self.gates / f"{name}.reached").exists()

    # -- one cell -------------------------------------------------------------

    def run(self) -> Outcome:
        cell, expect = self.cell, self.expect
        cluster = self.cluster_file()
        held = HELD.get(cell.phase)
        self.release(*(g for g in ALL_GATES if g != held))
        env = dict(self.rig.env)
        if cell.fault == "smi_hangs":
            env["PATH"] = self.fake_smi() + os.pathsep + env.get("PATH", os.environ["PATH"])
        if cell.fault in ("runs_dir_full", "node_disk_full"):
            self.small_disk(self.runs if cell.fault == "runs_dir_full" else self.tmp / "remote")
        try:
            self.start(cluster, env)
            self.await_phase(REACHED[cell.phase], cell.phase == "teardown")
            self.result.fault_at = time.time()
            survive = self.inject()
            if held:
                self.release(held)
            if survive is not None:
                survive()  # the fault passes (a pause, an unread pipe): then the run goes on
            if expect.ends in (SURVIVES, RESTARTS, GOES_ON):
                self.finish_in(3.0 if expect.ends != RESTARTS else 8.0)
            self.await_end()
        finally:
            for undo in reversed(self.restore):
                undo()
            self.release("all")
            (self.gates / "finish").touch()
        return self.result

    def start(self, cluster: str, env: dict) -> None:
        argv = [sys.executable, "-m", "orchestrator", "up", cluster, "--run-id", self.run_id,
                "--runs-dir", str(self.runs), "--grace", f"{GRACE_S:g}",
                "--start-timeout", f"{START_TIMEOUT_S:g}", *OWNER_OPTIONS[self.cell.owner]]
        log = open(self.tmp / "up.out", "w", encoding="utf-8")  # noqa: SIM115 (kept to the end)
        stdout = subprocess.PIPE if self.cell.fault == "output_unread_60s" else log
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=stdout, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONPATH": ROOT, **env},
                                     start_new_session=True)
        self.restore.append(lambda: self.proc.poll() is None and _signal(self.proc.pid,
                                                                          signal.SIGCONT))

    def await_phase(self, name: str, teardown: bool) -> None:
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        if teardown:  # rank 0 raises once training; node 1's rank takes its time to stop
            while not self.reached("rank1.training"):
                self._alive_until(deadline, "training")
            (self.gates / "teardown").touch()
        while not self.reached(name):
            self._alive_until(deadline, name)

    def _alive_until(self, deadline: float, what: str) -> None:
        detached_done = self.cell.owner == "detached" and self.proc.poll() == 0
        if (self.proc.poll() is not None and not detached_done) or time.monotonic() > deadline:
            raise AssertionError(f"{self.cell.id}: never reached {what} "
                                 f"(up exited {self.proc.poll()}):\n{self.output()[-3000:]}")
        time.sleep(0.05)

    def finish_in(self, seconds: float) -> None:
        time.sleep(seconds)
        (self.gates / "finish").touch()

    def await_end(self) -> None:
        """Until the run is over: ``up``'s exit (attached), or its nodes' end
        as ``status`` asks it (detached); then the records."""
        deadline = time.monotonic() + END_TIMEOUT_S
        while self.proc.poll() is None:  # an attached run that goes on is ended with down
            assert time.monotonic() < deadline, \
                f"{self.cell.id}: up did not end:\n{self.output()[-3000:]}"
            self._down_if_it_went_on()
            time.sleep(0.05)
        self.result.code, self.result.exited_at = self.proc.returncode, time.time()
        # a run that outlives its `up` (detached; a Slurm job whose controller
        # was killed) ends where `status` says so
        outlives = self.cell.owner == "detached" or self.cell.fault == "controller_sigkill"
        if outlives or self.expect.ends == GOES_ON:
            while True:
                status = self.status()
                if status.get("state") not in ("starting", "pending", "running"):
                    break
                self._down_if_it_went_on()
                assert time.monotonic() < deadline, f"{self.cell.id}: still live: {status}"
                time.sleep(1.0)
        self.result.out = self.output()
        self.result.state = self.state()
        self.result.status = self.status()

    def _down_if_it_went_on(self) -> None:
        """A run that must go on (``GOES_ON``), 45 s after the fault: it did;
        ``down`` ends it, and its record is then what down leaves."""
        if self.expect.ends == GOES_ON and time.time() - self.result.fault_at > 45:
            self.result.notes.append("running 45 s after the fault; ended with `down`")
            run_cli("down", self.run_id, "--runs-dir", str(self.runs), "--grace", "3",
                    env=self.rig.env, timeout=120)
            self.result.downed = True
            self.expect = Expect(INTERRUPTED)  # what down leaves on record

    # -- faults -----------------------------------------------------------------

    def inject(self):
        """Strike; returns what ends the fault for a cell the run survives
        (None: the fault is for good, or ends by itself)."""
        fault, rig = self.cell.fault, self.rig
        if fault == "rank_raises":
            (self.gates / "raise-rank1").touch()
            if self.cell.owner == "kept":  # one attempt fails; the next one goes on
                _later(3.0, lambda: _unlink(self.gates / "raise-rank1"))
            return None
        if fault == "rank_sigkill":
            os.kill(self.wait_for(lambda: workers(self.run_id, 1).get(1)), signal.SIGKILL)
            return None
        if fault == "node_frozen":
            pids = self.frozen_pids()
            for pid in pids:
                _signal(pid, signal.SIGSTOP)
            self.restore.append(lambda: [_signal(pid, signal.SIGCONT) for pid in pids])
            return None
        if fault == "link_cut":
            rig.netlab.cut(1)
            self.restore.append(lambda: rig.netlab.mend(1))
            return None
        if fault == "supervisor_sigkill":
            _signal(self.wait_for(lambda: self.node_agent(1)), signal.SIGKILL)
            return None
        if fault == "controller_sigkill":
            _signal(self.proc.pid, signal.SIGKILL)
            return None
        if fault in ("controller_paused_20s", "controller_paused_60s"):
            seconds = PAUSE_SHORT_S if fault.endswith("20s") else PAUSE_LONG_S
            _signal(self.proc.pid, signal.SIGSTOP)
            return lambda: (time.sleep(seconds), _signal(self.proc.pid, signal.SIGCONT))
        if fault == "output_unread_60s":
            return lambda: self._read_late(UNREAD_S)
        if fault in ("runs_dir_full", "node_disk_full"):
            full = self.runs if fault == "runs_dir_full" else self.tmp / "remote"
            self.fill(full)
            if self.expect.ends == SURVIVES:  # full for a while, then someone makes room
                return lambda: (time.sleep(10.0), self._on_disk("rm", "-f", f"{full}/.fill"))
            return None
        if fault == "smi_hangs":
            from fakesmi import set_state
            set_state(self.smi, [{"index": 0}, {"index": 1}], hang=True)
            return None
        raise AssertionError(f"no such fault {fault}")

    def frozen_pids(self) -> list[int]:
        """What freezes with node 1: its sshd (listener and sessions) on an SSH
        lab; else its agent, the process the controller (or the gang) hears
        from: its supervisor, or its keeper."""
        if self.rig.lab is not None:
            return [self.rig.lab.listener_pid(1), *self.rig.lab.session_pids(1)]
        if self.cell.phase == "connect":  # its agent has not started: its wrapper waits
            return self.wait_for(lambda: _gated(self.gates / "python-node1", node=1))
        return [self.wait_for(lambda: self.node_agent(1))]

    def node_agent(self, k: int) -> int | None:
        """Node ``k``'s supervisor (or keeper): a process of ddp-orch's own for
        the run, working in the node's run directory, not its guardian."""
        node_dir = f"/node-{k}"
        for pid in _own_pids(self.run_id):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    cmd = fh.read()
            except OSError:
                continue
            if cwd.endswith(node_dir) and b"DDP_ORCH_RUN_ID=" not in cmd:
                return pid
        return None

    def wait_for(self, find, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while True:
            found = find()
            if found:
                return found
            assert time.monotonic() < deadline, f"{self.cell.id}: nothing to strike"
            time.sleep(0.02)

    def _read_late(self, seconds: float) -> None:
        """``up | (sleep 60; cat)``: nothing read, then everything."""
        time.sleep(seconds)
        with open(self.tmp / "up.out", "w", encoding="utf-8") as log:
            for line in self.proc.stdout:  # to the end: up writes until it exits
                log.write(line.decode("utf-8", "replace") if isinstance(line, bytes) else line)
                if "rank 1 step" in str(line) and not (self.gates / "finish").exists():
                    (self.gates / "finish").touch()

    def small_disk(self, path) -> None:
        """A 64 MiB disk at ``path``: the controller's, or node 1's own (on an
        SSH lab, in the mount namespace of node 1's sshd, which its sessions
        share: a mount made out here does not reach it)."""
        os.makedirs(path, exist_ok=True)
        self._on_disk("mount", "-t", "tmpfs", "-o", "size=64m,mode=0755", "fm-full", str(path),
                     check=True)
        # the run's records live on it: `ps` and `status` read them in the checks
        self.restore.append(lambda: self._on_disk("rm", "-f", f"{path}/.fill"))
        self.unmount.append(lambda: self._on_disk("umount", "-l", str(path)))

    def fill(self, path) -> None:
        self._on_disk("sh", "-c", f'cat /dev/zero > "{path}/.fill" 2>/dev/null; true')

    def _on_disk(self, *argv: str, check: bool = False) -> None:
        """``argv`` where the small disk is: node 1's mount namespace for a
        node's disk on an SSH lab, else here."""
        enter = []
        if self.cell.fault == "node_disk_full" and self.rig.lab is not None:
            enter = ["nsenter", "-t", str(self.rig.lab.listener_pid(1)), "-m", "--"]
        subprocess.run([*enter, *argv], check=check)

    def fake_smi(self) -> str:
        from fakesmi import fake_nvidia_smi
        self.smi = self.tmp / "smi"
        return fake_nvidia_smi(self.smi, [{"index": 0}, {"index": 1}])

    # -- records ---------------------------------------------------------------

    def output(self) -> str:
        try:
            return (self.tmp / "up.out").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def state(self) -> dict:
        try:
            return json.loads((self.runs / self.run_id / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def status(self) -> dict:
        done = run_cli("status", self.run_id, "--json", "--runs-dir", str(self.runs),
                       env=self.rig.env, timeout=120)
        try:
            return json.loads(done.stdout)
        except ValueError:
            return {"error": done.stdout + done.stderr}


# -- checks ----------------------------------------------------------------------


def check(run: CellRun) -> None:
    """Every promise of the cell, on what its run did."""
    cell, expect, got = run.cell, run.expect, run.result
    label = f"{cell.id}: {expect.ends}"
    out = got.out
    state = got.status.get("state")  # the record as ps and status read it
    if expect.ends in (SURVIVES, RESTARTS):
        assert state == "succeeded", f"{label}, but {state}:\n{out[-4000:]}\n{got.status}"
        if expect.ends == RESTARTS:
            assert len(got.status.get("attempts") or []) == 2, got.status
    elif expect.ends == INTERRUPTED:
        # a run that went on may end by itself as `down` reaches it
        assert state == "interrupted" or (got.downed and state == "succeeded"), \
            f"{label}, but {state}:\n{out[-4000:]}"
    elif expect.ends == REFUSED:
        said = out + str(got.state.get("error"))
        assert got.code not in (0, None) and re.search(expect.pattern, said), \
            f"{label} /{expect.pattern}/:\n{said[-4000:]}"
    elif expect.ends == FAILS:
        root = got.status.get("root_cause") or {}
        assert state == "failed", f"{label}, but {state}:\n{out[-4000:]}\n{got.status}"
        assert expect.node is None or root.get("node_rank") == expect.node, \
            f"{label}: root cause {root}:\n{out[-4000:]}"
        assert re.search(expect.pattern, root.get("reason") or ""), \
            f"{label}: /{expect.pattern}/ not in {root.get('reason')!r}"
    if expect.within_s and expect.ends in (FAILS, INTERRUPTED, REFUSED):
        # the run's end as recorded; where it could not be (a runs directory
        # that is full, a controller killed), when up exited
        ended = got.state.get("ended") or got.status.get("ended") or got.exited_at
        assert ended, f"{label}: no end recorded: {got.state}"
        took = ended - got.fault_at
        for record in teardowns(run):
            took = max(took, record["torn_down_at"] - got.fault_at)
        got.notes.append(f"over {took:.1f}s after the fault (bound {expect.within_s:g}s)")
        assert took <= expect.within_s, f"{label}: {took:.1f}s > {expect.within_s:g}s"
    left = wait_gone(run.run_id, 30, labs=run.rig.labs)
    assert left == set(), f"{label}: left behind: {left!r}"
    if run.smi is not None:
        assert not _gpu_locked(run.smi), f"{label}: its GPU is still locked"
    agree(run)


def agree(run: CellRun) -> None:
    """``status --json``, ``ps --json`` and the summary say the same end."""
    got = run.result
    listed = run_cli("ps", "--json", "--runs-dir", str(run.runs), env=run.rig.env, timeout=60)
    mine = [r for r in json.loads(listed.stdout)["runs"] if r["run_id"] == run.run_id]
    if not mine:
        assert run.expect.ends == REFUSED, f"{run.cell.id}: not in ps: {listed.stdout}"
        return
    state = got.status.get("state")
    assert mine[0]["state"] == state, (mine[0]["state"], state)
    root = (got.status.get("root_cause") or {}).get("node_rank")
    assert (mine[0]["root_cause"] or {}).get("node_rank") == root, (mine[0], got.status)
    summary = re.search(rf"^run {re.escape(run.run_id)}: ([A-Z]+)", got.out, re.M)
    if summary and run.cell.owner != "detached":
        assert summary.group(1).lower() == state, (summary.group(0), state)
        named = re.search(r"^root cause: node (\d+)", got.out, re.M)
        assert (int(named.group(1)) if named else None) == root, (named and named.group(0),
                                                                 root)


def teardowns(run: CellRun) -> list[dict]:
    """Each node's supervisor record of its teardown that ended the run."""
    out = []
    for node in run.result.state.get("nodes") or ():
        try:
            with open(os.path.join(node["run_dir"], "supervisor.json"), encoding="utf-8") as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if record.get("torn_down_at"):
            out.append(record)
    return out


# -- helpers -----------------------------------------------------------------------


def _own_pids(run_id: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and environ_of(int(name)).get(OWN_MARKER) == run_id:
            out.append(int(name))
    return out


def _gated(wrapper, node: int) -> list[int]:
    """The shell of node ``node``'s ``python:`` wrapper holding its agent's
    start (under Slurm every node runs the same wrapper: its SLURM_NODEID says
    whose it is)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if str(wrapper).encode() not in fh.read().split(b"\0")[:2]:
                    continue
        except OSError:
            continue
        if environ_of(int(name)).get("SLURM_NODEID", str(node)) == str(node):
            out.append(int(name))
    return out


def _gpu_locked(smi) -> bool:
    """Whether the stand-in's GPU is still locked by some run: a run of the
    test's own that asks for it is refused."""
    from fakesmi import state
    from orchestrator.agent.node import gpulocks, gpus

    keys = [gpus.lock_key(gpu) for gpu in state(smi)["hosts"]["local"]["gpus"]]
    try:
        gpulocks.hold(keys, {"run_id": "fault-matrix-check"}).release()
    except gpulocks.Held:
        return True
    return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _later(seconds: float, action) -> None:
    import threading

    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()


def run_cell(cell: Cell, rig: Rig, tmp_path) -> Outcome:
    """Run ``cell`` and check every promise of it; its outcome, for the table."""
    if isinstance(cell.expect, Excluded):
        import pytest
        pytest.skip(f"{cell.id}: {cell.expect.why}")
    run = CellRun(cell, rig, tmp_path)
    try:
        run.run()
        check(run)
    finally:
        for unmount in run.unmount:
            unmount()
    return run.result
