"""The agent on a node that a scheduler started: one task of a Slurm step.

Under Slurm nobody opens a channel to the node: what the controller would
have sent lives in the job's run directory, on a shared file system, and
``node-K/agent.out`` is read as an SSH channel would be. The master address
and port are known only inside the job: they replace two exact placeholder
words in the argv, and nothing else is parsed.

There is no controller on stdin, so its EOF is no reason to stop:
``scancel`` and ``srun --kill-on-bad-exit`` end the run. Secret env values
never touch the shared disk: they come through sbatch's environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time

from . import ifvars, netroute
from .ompthreads import resolve_threads, task_cores
from .. import layout
from .holdings import Holdings
from .jobfile import SECRET_PREFIX, JobSpec, Placement, secret_variable
from .spec import SpecError, SupervisorSpec
from .stream import Stream
from ..wire.protocol import Ended, encode, exit_event

# How often a node looks for node 0's rendezvous file: an open that fails, and
# every node's torchrun waits for the last to find it.
RENDEZVOUS_POLL_S = 0.01
SETUP_POLL_S = 0.2  # how often the setup barrier's files are looked at


class JobNodeError(Exception):
    """This node cannot take part (not in the plan, no rendezvous)."""


def node_rank_here(job: JobSpec, environ: dict) -> int:
    """This node's rank in the plan, from the task variables ``placement`` names."""
    place = job.placement
    if job.placed:
        node_id = environ.get(place.node_index, "")
        if not node_id.isdigit() or int(node_id) >= len(job.nodes):
            raise JobNodeError(f"{place.node_index}={node_id!r} is not a node of this "
                               f"{len(job.nodes)}-node job")
        return int(node_id)
    name = environ.get(place.node_name, "")
    hosts = [node.host for node in job.nodes]
    if name not in hosts:
        raise JobNodeError(f"this is {place.scheduler} node {name!r}, which is not in the "
                           f"plan ({', '.join(hosts)})")
    return hosts.index(name)


def publish_rendezvous(job_dir: str, addr: str | None, port: int | None,
                       node_name: str = "", holdings: Holdings | None = None) -> dict:
    """Node 0: choose the address and a free port, and tell the others."""
    from .probes import bind

    if not port:
        found = bind(0, addr, holdings=holdings)  # until this node's supervisor starts torchrun
        if not found["ok"]:
            raise JobNodeError(f"no free port for the rendezvous: {found['error']}")
        port = found["port"]
    where = {"addr": addr or socket.gethostname(), "port": int(port), "node": node_name}
    path = os.path.join(job_dir, layout.RENDEZVOUS)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(where, fh)
    os.replace(path + ".tmp", path)
    return where


def await_rendezvous(job_dir: str, timeout_s: float) -> dict:
    """Every other node: node 0's address and port, once it has published them."""
    path = os.path.join(job_dir, layout.RENDEZVOUS)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with open(path, encoding="utf-8") as fh:
                where = json.load(fh)
            if isinstance(where.get("addr"), str) and isinstance(where.get("port"), int):
                return where
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise JobNodeError(f"node 0 did not publish the rendezvous ({path}) within "
                               f"{timeout_s:g}s")
        time.sleep(RENDEZVOUS_POLL_S)


def node_spec(job: JobSpec, node_rank: int, where: dict, environ: dict) -> SupervisorSpec:
    """This node's supervisor spec: the master filled in, the secrets taken
    from sbatch's environment, and each rank's share of the task's cores."""
    node = job.nodes[node_rank]
    spec = node.spec
    place = job.placement
    slots = {place.addr_slot: where["addr"], place.port_slot: str(where["port"])}
    env = dict(spec.env)
    for name in node.secret_env:
        if secret_variable(node_rank, name) not in environ:
            raise JobNodeError(f"{name} did not reach the job (sbatch passes it in the "
                               f"environment); is SBATCH_EXPORT or a site policy limiting "
                               f"--export=ALL?")
        env[name] = environ[secret_variable(node_rank, name)]
    secrets = tuple(sorted({v for n, v in env.items() if n in node.secret_env and v}))
    unset_env = tuple(spec.unset_env) + tuple(sorted(
        name for name in environ if name.startswith(SECRET_PREFIX)))
    check_gpus(env.get("CUDA_VISIBLE_DEVICES"), environ.get(place.gpus), place)
    if any(env.get(var) == ifvars.AUTO for var in ifvars.IFNAME_VARS):
        env = with_interface(env, where, len(job.nodes) > 1)
    env = resolve_threads(env, task_cores(environ.get(place.cpus) if place.cpus else None),
                          spec.nproc)
    argv = [slots.get(word, word) for word in spec.argv]
    home = environ.get("HOME") or os.path.expanduser("~")
    argv[:1] = [at_home(word, home) for word in argv[:1]]
    setup = spec.setup
    if setup and setup.get("path_first"):
        setup = {**setup, "path_first": at_home(setup["path_first"], home)}
    return dataclasses.replace(
        spec, argv=tuple(argv), setup=setup,
        master_port=where["port"], env=env, secrets=secrets, unset_env=unset_env)


def at_home(path: str, home: str) -> str:
    """``path`` with a leading ``~`` made this node's ``home``: under Slurm no
    controller asks a node for its home before the job runs."""
    return home + path[1:] if path == "~" or path.startswith("~/") else path


def with_interface(env: dict, where: dict, remote_peers: bool) -> dict:
    """``env`` with its ``auto`` interfaces set to the one reaching the rendezvous."""
    found = netroute.route(str(where["addr"]), int(where["port"]), remote_peers)
    if not found["ok"]:
        raise JobNodeError(f"cannot choose the interface the ranks use: {found['error']}; set "
                           f"GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME in the cluster file's "
                           f"env (this node has {', '.join(found['interfaces'])})")
    return ifvars.resolve_interfaces(env, found["ifname"])


def check_gpus(pinned: str | None, allocated: str | None, place: Placement) -> None:
    """The user's GPU indices must be the job's here, or they may be another job's."""
    if not pinned or allocated is None:
        return
    mine = set(allocated.split(","))
    outside = [gpu for gpu in pinned.split(",") if gpu not in mine]
    if outside:
        raise JobNodeError(f"GPU {','.join(outside)} is not among the GPUs {place.scheduler} "
                           f"allocated to this job here ({allocated}); another job may hold it. "
                           f"Ask for the node whole ({place.whole_node}) or list GPUs by "
                           f"count (nodes: {{count: N, gpus: G}})")


def run(job_path: str) -> int:
    """One node of the job, start to end; the exit code is torchrun's."""
    environ = dict(os.environ)
    try:
        job = JobSpec.read(job_path)
        node_rank = node_rank_here(job, environ)
    except (JobNodeError, SpecError) as exc:  # before any stream: srun's output (slurm-JOBID.out)
        print(f"ddp-orch agent: {exc}", file=sys.stderr)
        return 1
    run_dir = job.nodes[node_rank].spec.run_dir
    os.makedirs(run_dir, mode=0o700, exist_ok=True)
    out = os.open(os.path.join(run_dir, layout.STREAM),
                  os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)
    holdings = Holdings()
    try:
        if node_rank == 0:
            where = publish_rendezvous(job.job_dir, job.master_addr, job.master_port,
                                       environ.get(job.placement.node_name, ""), holdings)
        else:
            where = await_rendezvous(job.job_dir, job.start_timeout_s)
        spec = node_spec(job, node_rank, where, environ)
    except (JobNodeError, SpecError) as exc:
        os.write(1, encode(exit_event(1, str(exc), Ended.REFUSED, duration_s=0,
                                      last_lines=[f"ddp-orch: {exc}"])))
        return 1
    from .supervisor import Supervisor

    supervisor = Supervisor(spec, holdings=holdings)
    supervisor.out = stream = Stream(1)
    supervisor.setup_barrier = lambda sup: await_setups(job.job_dir, node_rank, len(job.nodes),
                                                        sup)
    try:
        return supervisor.run()
    finally:
        stream.give_back()


def await_setups(job_dir: str, node_rank: int, nnodes: int, sup) -> None:
    """The job's barrier after ``setup:``. A failed setup exits its node, and
    ``srun --kill-on-bad-exit`` then stops the others' wait."""
    path = os.path.join(job_dir, f"{layout.SETUP_DONE_PREFIX}{node_rank}")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f"{time.time()}\n")
    while not sup.stop_requested:
        if all(os.path.exists(os.path.join(job_dir, f"{layout.SETUP_DONE_PREFIX}{k}"))
               for k in range(nnodes)):
            return
        sup.wakeup.wait(SETUP_POLL_S)


def stacks(job_path: str, out_prefix: str, native: bool = False) -> int:
    """``ddp-orch stacks`` on a Slurm node: into ``OUT_PREFIX-node-K.json``,
    not stdout, where srun may interleave the nodes' long lines."""
    from .stacks import dump

    job = JobSpec.read(job_path)
    node_rank = node_rank_here(job, dict(os.environ))
    ranks = dump(job.run_id, {node_rank: job.nodes[node_rank].spec.run_dir}, native)
    path = f"{out_prefix}-node-{node_rank}.json"
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump({"host": socket.gethostname(), "ranks": ranks}, fh)
    os.replace(path + ".tmp", path)
    return 0
