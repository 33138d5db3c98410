"""A real Slurm cluster on this machine, for the Slurm backend's live tests.

One ``munged``, one ``slurmctld`` and N ``slurmd`` (``slurmd -N nodeK``),
each its own Slurm node. Every node has this machine's host name and
``NodeAddr=127.0.0.1`` with a port of its own; ``SlurmdParameters=
config_overrides`` lets each claim more CPUs than the machine has and 8
fake GPUs (character devices made with ``mknod c 1 3``, which is what a
``File=`` in gres.conf must point at). Everything lives in a temp dir;
the clients find the config through ``SLURM_CONF``, which ``env()`` gives
(the tests pass it to the processes they start, never to ``os.environ``).

Two traps are checked at start, not discovered by a test later:
``proctrack/cgroup`` without a cgroup.conf fails every step while ``srun``
exits 0 (so this lab uses ``proctrack/linuxproc``), and a node that does
not register stays ``down``: ``start`` waits until every node is idle and
a one-line job has really run on every node.

Stops by PID (slurmd, slurmctld, munged), never by name. Without the
packages the fixture skips, unless ``CI=true``, where it fails with the
install hint.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Iterator

import pytest

from ports import free_port
from sshlab import lacking

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
MUNGED = "/usr/sbin/munged"
INSTALL_HINT = "install slurmctld, slurmd, slurm-client and munge with scripts/install-system-deps"
GPUS_PER_NODE = 8
CPUS_PER_NODE = 8


class SlurmLabError(RuntimeError):
    pass


class SlurmLab:
    """``SlurmLab(n_nodes).start()``; ``stop()`` ends every daemon it started."""

    def __init__(self, n_nodes: int = 2, *, root: str | None = None):
        self.n_nodes = n_nodes
        self._own_root = root is None  # removed by stop()
        self.root = root or tempfile.mkdtemp(prefix="ddp-slurmlab-")
        self.hostname = socket.gethostname().split(".")[0]
        self.nodes = [f"node{k + 1}" for k in range(n_nodes)]
        self.conf = os.path.join(self.root, "slurm.conf")
        self.procs: list[subprocess.Popen] = []
        self.munge_socket = os.path.join(self.root, "munge", "munge.socket")
        self.ctld_port = free_port()
        self.node_ports = [free_port() for _ in self.nodes]

    # -- lifecycle ----------------------------------------------------------

    def __enter__(self) -> "SlurmLab":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "SlurmLab":
        try:
            self._write_config()
            self._start_munged()
            self._spawn([SLURMCTLD, "-D", "-f", self.conf], "slurmctld.out")
            for node in self.nodes:
                os.makedirs(self._path("spool", node), exist_ok=True)
                self._spawn([SLURMD, "-D", "-f", self.conf, "-N", node], f"slurmd-{node}.out")
            self._wait_idle(timeout=30.0)
            self._check_steps_run()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """scancel everything, then SIGTERM each daemon by PID and wait on it."""
        if any(p.poll() is None for p in self.procs):
            subprocess.run(["scancel", "--full", "--user", str(os.getuid())], env=self.env(),
                           capture_output=True, timeout=10)
        for proc in reversed(self.procs):  # slurmd first, munged last
            _terminate(proc)
        self.procs.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def env(self, base: dict | None = None) -> dict[str, str]:
        """An environment in which the Slurm clients talk to this lab."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf
        return env

    # -- helpers for tests --------------------------------------------------

    def run(self, *argv: str, check: bool = True, timeout: float = 20.0) -> str:
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True,
                              timeout=timeout)
        if check and done.returncode != 0:
            raise SlurmLabError(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def queue(self) -> list[str]:
        """Job ids still in the queue (pending, running or completing)."""
        return self.run("squeue", "-h", "-o", "%i").split()

    def wait_queue_empty(self, timeout: float = 30.0, keep: tuple[str, ...] = ()) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = [j for j in self.queue() if j not in keep]
            if not left:
                return []
            time.sleep(0.2)
        return [j for j in self.queue() if j not in keep]

    def daemon_log(self, name: str) -> str:
        try:
            with open(self._path(name), encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    # -- internals ----------------------------------------------------------

    def _path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def _write_config(self) -> None:
        os.makedirs(self._path("state"), exist_ok=True)
        os.makedirs(self._path("dev"), exist_ok=True)
        for i in range(GPUS_PER_NODE):
            dev = self._path("dev", f"gpu{i}")
            if not os.path.exists(dev):
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))  # like /dev/null
        node_lines = "\n".join(
            f"NodeName={node} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} RealMemory=1000 Gres=gpu:{GPUS_PER_NODE} State=UNKNOWN"
            for node, port in zip(self.nodes, self.node_ports))
        all_nodes = ",".join(self.nodes)
        _write(self.conf, f"""\
ClusterName=ddplab
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={self.ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={self._path('state')}
SlurmdSpoolDir={self._path('spool', '%n')}
SlurmctldPidFile={self._path('slurmctld.pid')}
SlurmdPidFile={self._path('slurmd-%n.pid')}
SlurmctldLogFile={self._path('slurmctld.log')}
SlurmdLogFile={self._path('slurmd-%n.log')}
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
MessageTimeout=5
KillWait=5
MinJobAge=30
InactiveLimit=0
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{node_lines}
PartitionName=debug Nodes={all_nodes} Default=YES MaxTime=INFINITE State=UP
PartitionName=solo Nodes={self.nodes[0]} MaxTime=INFINITE State=UP
""")
        _write(self._path("gres.conf"), "AutoDetect=off\n" + "".join(
            f"NodeName={node} Name=gpu File={self._path('dev', 'gpu')}[0-{GPUS_PER_NODE - 1}]\n"
            for node in self.nodes))

    def _start_munged(self) -> None:
        """A munged of our own (its own socket), run as the munge user."""
        run_dir = os.path.dirname(self.munge_socket)
        os.makedirs(run_dir, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        os.chmod(self.root, 0o755)
        key = os.path.join(run_dir, "munge.key")  # our own: no dependence on /etc/munge
        with open(key, "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(key, 0o600)
        shutil.chown(key, "munge", "munge")
        argv = ["runuser", "-u", "munge", "--", MUNGED, "--foreground", f"--key-file={key}",
                f"--socket={self.munge_socket}", f"--pid-file={run_dir}/munged.pid",
                f"--log-file={run_dir}/munged.log", f"--seed-file={run_dir}/munged.seed"]
        self._spawn(argv, "munged.out")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            cred = subprocess.run(["munge", "-n", f"--socket={self.munge_socket}"],
                                  capture_output=True)
            if cred.returncode == 0:
                check = subprocess.run(["unmunge", f"--socket={self.munge_socket}"],
                                       input=cred.stdout, capture_output=True)
                if check.returncode == 0:
                    return
            time.sleep(0.1)
        raise SlurmLabError("munged did not start: " + self.daemon_log("munged.out"))

    def _spawn(self, argv: list[str], log: str) -> None:
        out = open(self._path(log), "ab")
        try:
            self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self.env()))
        finally:
            out.close()

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise SlurmLabError(f"{proc.args[0]} exited {proc.returncode}: "
                                        + self.daemon_log("slurmctld.log")[-2000:])
            done = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(),
                                  capture_output=True, text=True)
            states = done.stdout.strip()
            lines = [line.split() for line in states.splitlines()]
            idle = {name for name, state in lines if state == "idle"}
            if idle >= set(self.nodes):
                return
            time.sleep(0.2)
        raise SlurmLabError(f"the Slurm nodes did not become idle in {timeout:g}s: {states}\n"
                            + self.daemon_log("slurmctld.log")[-2000:])

    def _check_steps_run(self) -> None:
        """A step that really runs on every node, and says so in a file: srun's
        exit code alone is not proof (see the module docstring)."""
        marker = self._path("step-check")
        script = f'echo "$SLURMD_NODENAME $CUDA_VISIBLE_DEVICES" >> {marker}'
        out = self.run("srun", f"--nodes={self.n_nodes}", "--ntasks-per-node=1", "--gres=gpu:2",
                       "--time=1", "sh", "-c", script, check=False, timeout=30)
        try:
            with open(marker, encoding="utf-8") as fh:
                seen = sorted(line.split()[0] for line in fh if line.strip())
        except FileNotFoundError:
            seen = []
        if seen != sorted(self.nodes):
            raise SlurmLabError(f"a test step ran on {seen}, not on {self.nodes}: {out}\n"
                                + self.daemon_log(f"slurmd-{self.nodes[0]}.log")[-2000:])


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _terminate(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        except ProcessLookupError:
            pass


def _require_slurm() -> None:
    missing = [p for p in (SLURMCTLD, SLURMD, MUNGED) if not os.path.exists(p)]
    missing += [c for c in ("sbatch", "srun", "squeue", "scancel") if shutil.which(c) is None]
    if os.getuid() != 0:
        missing.append("root (slurmd runs jobs as their users)")
    if missing:
        lacking(f"the Slurm lab needs {', '.join(missing)}; {INSTALL_HINT}")


@pytest.fixture(scope="session")
def slurm_lab() -> Iterator[SlurmLab]:
    """Three Slurm nodes (node1..node3), shared by the Slurm tests of a session."""
    _require_slurm()
    lab = SlurmLab(3)
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()
