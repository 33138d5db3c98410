"""The Slurm commands the backend runs (argv, no shell) and their delimited output:
not ``--json``, as in Slurm 22.05 ``squeue --json`` ignores ``-j`` and ``sacct --json``
misreports exit codes."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable, Mapping

from ...errors import LaunchError

COMMAND_TIMEOUT_S = 30.0
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED", "SPECIAL_EXIT"})
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class SlurmError(LaunchError):
    """A Slurm command failed; ``message`` is what it printed."""

    def __init__(self, command: str, message: str, hint: str = ""):
        self.command = command
        self.message = message
        self.hint = hint
        super().__init__(f"{command}: {message}" + (f"\n  hint: {hint}" if hint else ""))


@dataclass(frozen=True)
class JobState:
    """One line of ``squeue -j ID``: ``state`` as Slurm spells it (RUNNING)."""

    job_id: str
    state: str
    reason: str
    nodelist: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def running(self) -> bool:
        return self.state in ("RUNNING", "COMPLETING")

    @property
    def queued(self) -> bool:
        """Waiting for its nodes (``RunState.PENDING``)."""
        return self.state in ("PENDING", "CONFIGURING")

    @property
    def cancelled(self) -> bool:
        return self.state == "CANCELLED"

    @property
    def hosts(self) -> tuple[str, ...]:
        """The allocation's hosts in SLURM_NODEID order; () until it has them."""
        if not self.nodelist or self.nodelist.startswith("("):
            return ()
        return tuple(hostnames(self.nodelist))


@dataclass(frozen=True)
class NodeInfo:
    """A Slurm node as ``sinfo -N`` shows it."""

    name: str
    hostname: str
    state: str  # idle, mixed, allocated, down*, drained, ...
    cpus: int
    gpus: int  # from its GRES; 0 when it has none

    @property
    def usable(self) -> bool:
        """Not down, drained, failing or unreachable (a ``*`` suffix)."""
        bad = ("down", "drain", "fail", "maint", "reserved", "inval", "unk", "future")
        return not self.state.endswith("*") and not self.state.startswith(bad)


def available(command: str = "sbatch") -> bool:
    return shutil.which(command) is not None


def run(argv: list[str], *, env: Mapping[str, str] | None = None,
        timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    """One Slurm client command, in a session of its own: a Ctrl-C is then the
    controller's to act on, not a kill of ``sbatch`` halfway through a submission."""
    if not available(argv[0]):
        raise SlurmError(argv[0], "not found on this machine",
                         hint="run ddp-orch where sbatch works: a login or submit host of the "
                              "cluster (or install slurm-client and point SLURM_CONF at it)")
    try:
        done = subprocess.run(argv, env=None if env is None else dict(env), capture_output=True,
                              text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise SlurmError(argv[0], f"no answer within {timeout:g}s",
                         hint="is slurmctld up? `scontrol ping` tells") from None
    if done.returncode != 0 and "Could not establish a configuration source" in done.stderr:
        raise SlurmError(argv[0], "this machine has no Slurm configuration",
                         hint="run ddp-orch on a login or submit host of the cluster, or set "
                              "SLURM_CONF to its slurm.conf")
    return done


def _said(done: subprocess.CompletedProcess) -> str:
    text = (done.stderr or done.stdout or "").strip()
    lines = [line.removeprefix("sbatch: error: ").strip() for line in text.splitlines()]
    return "; ".join(line for line in lines if line) or f"exit {done.returncode}"


def submit(argv: list[str], env: Mapping[str, str]) -> str:
    """``sbatch --parsable ...``: the job id. Slurm's refusal is raised as its message."""
    done = run(argv, env=env)
    if done.returncode != 0:
        raise SlurmError("sbatch", f"Slurm rejected the job: {_said(done)}")
    job_id = done.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError("sbatch", f"unexpected answer {done.stdout.strip()[:200]!r}")
    return job_id


def job_state(job_id: str) -> JobState | None:
    """The job as squeue knows it (ended ones for ``MinJobAge``); None once forgotten."""
    done = run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%i|%T|%r|%N"])
    if done.returncode != 0:
        if "Invalid job id" in (done.stderr or ""):
            return None
        raise SlurmError("squeue", _said(done))
    for line in done.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 4 and fields[0] == job_id:
            return JobState(job_id, fields[1], "" if fields[2] == "None" else fields[2],
                            fields[3])
    return None


def accounting(job_id: str) -> tuple[str, str] | None:
    """(state, exit code) from ``sacct`` when the cluster keeps accounting."""
    if not available("sacct"):
        return None
    done = run(["sacct", "-n", "-X", "--parsable2", "-j", job_id, "-o", "JobID,State,ExitCode"])
    if done.returncode != 0:
        return None
    for line in done.stdout.splitlines():
        fields = line.split("|")
        if len(fields) == 3 and fields[0] == job_id:
            return fields[1].split()[0], fields[2]
    return None


def cancel(job_id: str, signal: str | None = None) -> None:
    """``scancel``: SIGTERM, Slurm's KillWait, SIGKILL; or ``signal`` to every process."""
    argv = ["scancel", *(("--full", f"--signal={signal}") if signal else ()), job_id]
    done = run(argv)
    if done.returncode != 0 and "already completing or completed" not in (done.stderr or "") \
            and "Invalid job id" not in (done.stderr or ""):
        raise SlurmError("scancel", _said(done))


def hostnames(nodelist: str) -> list[str]:
    """``node[1-3]`` -> node1, node2, node3, in Slurm's order (SLURM_NODEID)."""
    done = run(["scontrol", "show", "hostnames", nodelist])
    if done.returncode != 0:
        raise SlurmError("scontrol", _said(done))
    return done.stdout.split()


def nodes(names: Iterable[str] = (), partition: str | None = None) -> dict[str, NodeInfo]:
    argv = ["sinfo", "-h", "-N", "-o", "%N|%n|%T|%c|%G"]
    names = list(names)
    if names:
        argv += ["-n", ",".join(names)]
    if partition:
        argv += ["-p", partition]
    done = run(argv)
    if done.returncode != 0:
        raise SlurmError("sinfo", _said(done))
    out = {}
    for line in done.stdout.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        name, hostname, state, cpus, gres = fields
        out[name] = NodeInfo(name, hostname, state, int(cpus) if cpus.isdigit() else 0,
                             gpu_count(gres))
    return out


def partitions() -> list[str]:
    done = run(["sinfo", "-h", "-o", "%R"])
    if done.returncode != 0:
        raise SlurmError("sinfo", _said(done))
    return sorted(set(done.stdout.split()))


def gpu_count(gres: str) -> int:
    """GPUs in a GRES string: ``gpu:8``, ``gpu:a100:4(S:0-1)``, ``(null)``."""
    return sum(int(n) for n in _GPU_GRES.findall(gres))
