"""The Slurm backend's preflight: what would make Slurm refuse a job, or the job
fail at once, found with ``sinfo`` alone."""

from __future__ import annotations

import os
import posixpath
import socket

from ...config.blocks.slurm import SlurmSpec
from ...config.spec import ClusterSpec, NodeSpec
from ...plan.model import RunPlan
from . import ctl as slurmctl
from ...engine.checkresult import CheckResult

# File systems every node of a cluster sees the same way.
SHARED_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs",
                       "fuse.glusterfs", "panfs", "wekafs", "pvfs2", "orangefs", "fuse.beegfs",
                       "fuse.sshfs", "virtiofs", "9p", "afs", "smb3", "cifs", "fuse.juicefs"})


def slurm_checks(spec: ClusterSpec, plan: RunPlan, job_dir: str) -> list[CheckResult]:
    """The preflight's rows; ``job_dir`` is where the run directory will be."""
    here = "slurm"
    if not slurmctl.available("sbatch"):
        return [CheckResult(-1, here, "sbatch", False, "sbatch is not found on this machine; "
                            "run ddp-orch on a login or submit host of the cluster")]
    out = [CheckResult(-1, here, "sbatch", True, "found")]
    partition = (spec.block("slurm") or SlurmSpec()).partition
    if partition is not None:
        known = slurmctl.partitions()
        out.append(CheckResult(-1, here, "partition", partition in known,
                               "exists" if partition in known else
                               f"no partition {partition!r}; Slurm has "
                               f"{', '.join(known) or 'none'}"))
    if spec.placed:
        infos = slurmctl.nodes(partition=partition)
        out.append(_count_check(spec, infos, partition))
    else:
        infos = slurmctl.nodes([n.host for n in plan.nodes])
        out += [_node_check(k, node, infos.get(node.host))
                for k, node in enumerate(spec.nodes)]
    runs = posixpath.dirname(job_dir)
    problem = shared_dir_problem(runs, infos.values())
    out.append(CheckResult(-1, here, "run directory", problem is None,
                           problem or f"{runs} is seen by the compute nodes"))
    return out


def _count_check(spec: ClusterSpec, infos: dict, partition: str | None) -> CheckResult:
    """Enough usable nodes, each with the GPUs or CPUs a node of the job needs."""
    node = spec.nodes[0]
    fits = [i for i in infos.values() if i.usable
            and (node.gpu_count is None or i.gpus >= node.gpu_count)
            and (node.procs is None or i.cpus >= node.procs)]
    need = (f"{node.gpu_count} GPU(s)" if node.gpu_count is not None
            else f"{node.procs} CPU(s)")
    where = f"partition {partition}" if partition else "the cluster"
    ok = len(fits) >= len(spec.nodes)
    return CheckResult(-1, "slurm", "nodes", ok,
                       f"{len(fits)} usable node(s) in {where} with {need} each; "
                       f"the job needs {len(spec.nodes)}")

def _node_check(k: int, node: NodeSpec, info: slurmctl.NodeInfo | None) -> CheckResult:
    host = node.host
    if info is None:
        return CheckResult(k, host, "node", False,
                           f"Slurm has no node {host!r} (`sinfo -N` lists them)")
    if not info.usable:
        return CheckResult(k, host, "node", False, f"{host} is {info.state}; pick another "
                           f"node or ask the admins to resume it")
    if node.gpus is not None and max(node.gpus) >= info.gpus:
        return CheckResult(k, host, "gpus", False,
                           f"GPU {max(node.gpus)} is not on {host}: its GRES has "
                           f"{info.gpus} GPU(s) (indices 0-{info.gpus - 1})"
                           if info.gpus else f"{host} has no GPUs in its GRES")
    if node.procs is not None and node.procs > info.cpus:
        return CheckResult(k, host, "cpus", False,
                           f"{node.procs} processes but {host} has {info.cpus} CPUs")
    return CheckResult(k, host, "node", True, f"{info.state}, {info.cpus} CPUs, "
                       f"{info.gpus} GPU(s)")


def shared_dir_problem(path: str, nodes) -> str | None:
    """Why the compute nodes may not see ``path``, or None: a local disk or tmpfs
    on a submit host is invisible to them; a network or cluster file system is not."""
    this_host = socket.gethostname().split(".")[0]
    nodes = list(nodes)
    if nodes and all(n.hostname.split(".")[0] == this_host for n in nodes):
        return None
    mount, fstype = _mount_of(path)
    if fstype in SHARED_FS:
        return None
    return (f"{path} is on a {fstype or 'local'} file system ({mount}), which the compute "
            f"nodes do not share; run ddp-orch from the cluster's shared file system, or "
            f"pass --runs-dir DIR on it")


def _mount_of(path: str) -> tuple[str, str]:
    path = os.path.abspath(path)
    best = ("/", "")
    try:
        with open("/proc/self/mounts", encoding="utf-8") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best[0]):
                    best = (mount, fields[2])
    except OSError:
        pass
    return best
