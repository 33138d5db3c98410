"""A scheduler job's file (``job.json``), typed: ``JobSpec``.

It is all a node the scheduler started is told (no controller opens a
channel to it), so it is checked field by field like any message: a bad
file is a ``SpecError`` naming the field, never a KeyError in a node's agent.
"""

from __future__ import annotations

import dataclasses
import json

from ..wire import fields
from ..wire.owner import Holder
from .spec import SpecError, SupervisorSpec

# A secret of node k's env travels beside the job file, never in it: as the
# submission's variable SECRET_PREFIX + k + "_" + its name (``jobnode.node_spec``).
SECRET_PREFIX = "DDP_ORCH_SECRET_"


def secret_variable(node_rank: int, name: str) -> str:
    return f"{SECRET_PREFIX}{node_rank}_{name}"


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a node's agent finds its place in the job, in the scheduler's words."""

    scheduler: str  # its name, for messages ("Slurm")
    node_name: str  # the variable with the scheduler's name for this node
    node_index: str  # the variable with this node's index in the allocation
    gpus: str  # the variable with the GPUs allocated on this node
    whole_node: str  # how the cluster file asks for a node whole, for a message
    cpus: str = ""  # the variable with the CPUs the scheduler gave this node's task, if any

    # Until the job runs, the master's address and port in the argv the
    # controller built are these exact placeholder words; node 0's agent
    # publishes the real ones, and every node replaces the words, nothing else.
    @property
    def addr_slot(self) -> str:
        return f"<{self.scheduler.lower()} node 0>"

    @property
    def port_slot(self) -> str:
        return f"<free port on {self.scheduler.lower()} node 0>"


@dataclasses.dataclass(frozen=True)
class JobNode:
    """One node of the job; its secrets' values come in the scheduler's environment."""

    host: str
    spec: SupervisorSpec
    secret_env: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class JobSpec:
    run_id: str
    job_dir: str  # the shared directory: rendezvous.json and the setup barrier's files
    placed: bool  # the scheduler chose the hosts: a node is its index in the allocation
    placement: Placement
    master_addr: str | None  # None: node 0's host name, known only inside the job
    master_port: int | None  # None: a free port node 0 binds
    start_timeout_s: float  # how long the other nodes wait for node 0's rendezvous
    nodes: tuple[JobNode, ...]

    def to_dict(self) -> dict:
        return {"run_id": self.run_id, "job_dir": self.job_dir, "placed": self.placed,
                "placement": dataclasses.asdict(self.placement),
                "master_addr": self.master_addr, "master_port": self.master_port,
                "start_timeout_s": self.start_timeout_s,
                "nodes": [{"host": n.host, "spec": n.spec.to_dict(),
                           "secret_env": list(n.secret_env)} for n in self.nodes]}

    @classmethod
    def read(cls, path: str) -> "JobSpec":
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            raise SpecError(f"bad job file {path}: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> "JobSpec":
        """The job ``data`` describes; SpecError naming the first bad field."""
        if not isinstance(data, dict):
            raise SpecError(f"bad job file: not an object: {str(data)[:200]}")
        why = fields.why_bad(data, _FIELDS)
        if why is not None:
            raise SpecError(f"bad job file: {why}")
        place, port = data["placement"], data.get("master_port")
        nodes = tuple(JobNode(n["host"], SupervisorSpec.from_dict(n["spec"]),
                              tuple(n.get("secret_env", ()))) for n in data["nodes"])
        for node in nodes:
            foreign = node.spec.owner.not_held_by(Holder.SCHEDULER)
            if foreign:
                raise SpecError(f"bad job file: {foreign}")
        return cls(data["run_id"], data["job_dir"], data["placed"], Placement(**place),
                   data.get("master_addr"), port, float(data["start_timeout_s"]), nodes)


def _node_ok(node: object) -> bool:
    return isinstance(node, dict) and isinstance(node.get("host"), str) \
        and isinstance(node.get("spec"), dict) \
        and isinstance(node.get("secret_env", []), list) \
        and all(isinstance(name, str) for name in node.get("secret_env", []))


def _placement(value: object) -> bool:
    return isinstance(value, dict) and set(value) == {f.name for f in dataclasses.fields(Placement)} \
        and all(isinstance(v, str) for v in value.values())


# A job file's fields (``fields.first_bad``; "?": may be absent).
_FIELDS = {
    "run_id": fields.TEXT, "job_dir": fields.PATH, "placed": fields.FLAG,
    "placement": fields.Field(_placement, "{" + ", ".join(
        f.name for f in dataclasses.fields(Placement)) + "}"),
    "master_addr?": fields.Field(lambda v: v is None or isinstance(v, str), "a host or null"),
    "master_port?": fields.Field(lambda v: v is None or fields.is_int(v) and 0 < v < 65536,
                                 "a port (1 to 65535) or null"),
    "start_timeout_s": fields.seconds(positive=True),
    "nodes": fields.Field(lambda v: isinstance(v, list) and bool(v) and all(map(_node_ok, v)),
                          "a list of {host, spec, secret_env}"),
}
