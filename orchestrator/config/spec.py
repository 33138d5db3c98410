"""What the user asked for: a cluster file's validated contents, nothing derived
(the rank plan, ``plan/build.py``, is computed from them by pure code)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

# The launch backends and the bounds the command line shares: ``limits``, so
# that the CLI builds its options without this module's dataclasses.
from .limits import BACKENDS, MAX_GPU_WAIT, MAX_HANG_TIMEOUT, MAX_RESTARTS, MIN_HANG_TIMEOUT  # noqa: F401
from .catalog import Catalog, builtin

AUTO_PORT = "auto"
LOCAL_HOSTS = frozenset({"localhost"})
DEFAULT_WORKDIR = "~/.ddp-orch"
DEFAULT_PORT = 29500
DEFAULT_SETUP_TIMEOUT = 1800.0  # seconds: a node's whole ``setup:`` (pip installs take a while)
# A GPU using more memory than this (MiB) is busy even with no process in
# sight (another container's job, say): a bare driver and display use less.
DEFAULT_GPU_BUSY_MIB = 1024
# A GPU more utilised than this (percent) is busy too: another container's
# job at work with little memory (``agent/node/gpus.py``'s default).
DEFAULT_GPU_BUSY_UTIL = 50
# ``gpus:`` asked by what it wants rather than by index (``free:3``); the
# node's agent chooses at launch (``agent/node/gpus.py``).
GPU_REQUESTS = ("all", "free")


def default_backend(hosts: "tuple[str, ...] | list[str]") -> str:
    """``local`` when every node is this machine, ``ssh`` otherwise."""
    return "local" if all(host in LOCAL_HOSTS for host in hosts) else "ssh"


@dataclass(frozen=True)
class SshSpec:
    """SSH settings for one node; None means "ask ~/.ssh/config, then defaults"
    (host keys checked strictly, a 10 s connect timeout)."""

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    strict_host_keys: str | None = None  # yes | accept-new
    connect_timeout: float | None = None


def requested_count(request: str) -> int | None:
    """How many GPUs ``free:N`` asks for; None where only the node knows (all, free)."""
    return int(request.split(":", 1)[1]) if request.startswith("free:") else None


@dataclass(frozen=True)
class NodeSpec:
    """One machine: its host and either GPU indices or a CPU process count."""

    host: str
    gpus: tuple[int, ...] | None
    procs: int | None
    ssh: SshSpec
    python: str
    env: Mapping[str, str]
    line: int | None = None
    gpu_count: int | None = None  # placed by Slurm: this many GPUs from its GRES
    # ``gpus: all | free | free:N``: chosen on the node at launch (``gpus`` is None).
    gpu_request: str | None = None
    # One process that sees all the node's GPUs (compare's nn.DataParallel
    # baseline, ``compare --baseline dp``); never set from a cluster file.
    one_process: bool = False

    @property
    def nproc(self) -> int:
        if self.one_process:
            return 1
        if self.gpu_count is not None:
            return self.gpu_count
        if self.gpu_request is not None:  # 0 until the launch chooses, for all and free
            return requested_count(self.gpu_request) or 0
        return len(self.gpus) if self.gpus is not None else int(self.procs or 0)

    @property
    def on_gpus(self) -> bool:
        """Listed GPUs or a request for some (not ``procs:``, not Slurm's count)."""
        return self.gpus is not None or self.gpu_request is not None

    @property
    def is_local(self) -> bool:
        return self.host in LOCAL_HOSTS


@dataclass(frozen=True)
class WorkloadSpec:
    """What every rank runs: a built-in workload by ``name``, or from ``code``
    (absolute; uploaded, the workers' working directory) a ``script`` inside it or
    a ``module``. ``args``: a mapping (``{epochs: 10}`` -> ``--epochs 10``) or a
    tuple of strings passed verbatim."""

    name: str | None
    script: str | None
    args: Mapping[str, Any] | tuple[str, ...] = field(default_factory=dict)
    module: str | None = None
    code: str | None = None
    # What was given that is valid but likely not meant about the program (a
    # ``module`` not found in ``code``); it goes wherever the workload goes
    # (``ClusterSpec.all_warnings``).
    warnings: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name or self.module or self.script or "?"


@dataclass(frozen=True)
class ClusterSpec:
    """A whole validated cluster file."""

    name: str
    backend: str  # one of BACKENDS
    master_addr: str | None
    master_port: int | str  # an int, or AUTO_PORT
    workdir: str
    device: str  # auto | cuda | cpu
    env: Mapping[str, str]
    nodes: tuple[NodeSpec, ...]
    workload: WorkloadSpec
    source: str = "<memory>"
    text: str = ""
    hang_timeout: float | None = None  # seconds without progress: a hang (None: off)
    max_restarts: int = 0  # whole-gang restarts after a failure (agent/kept/restarts.py's rule)
    # Each backend block given, or the block of the backend used (``blocks``):
    # key -> its module's ``Spec`` (``slurm`` -> ``blocks.slurm.SlurmSpec``).
    blocks: Mapping[str, Any] = field(default_factory=dict)
    placed: bool = False  # nodes: {count: N}; Slurm chooses the hosts
    interface: str = "auto"  # network.interface: auto | off | a name (plan/network.py)
    # ``setup:``: commands run on every node before torchrun, in its code root;
    # each a string (run by ``sh -c``) or an argv tuple (run as it is).
    setup: tuple[str | tuple[str, ...], ...] = ()
    setup_timeout: float = DEFAULT_SETUP_TIMEOUT  # seconds for all of a node's setup
    # ``setup: {commands, when_changed}``: files under the code root whose
    # content, with the commands, env and python, decides whether a node runs
    # its setup again (``agent/node/setupstamp.py``); () runs it every time.
    setup_when_changed: tuple[str, ...] = ()
    # ``outputs:``: paths or globs under node 0's code root, brought home after the run.
    outputs: tuple[str, ...] = ()
    # ``progress: {pattern:}``: how a rank's step is read from its output lines
    # where it makes no step report (``agent/node/outputsteps.py``); None: the defaults.
    progress_pattern: str | None = None
    base_dir: str = "."  # the cluster file's directory: relative paths start there
    # ``gpu_policy:``: what makes a GPU busy, and how long a launch waits for
    # enough free ones (``--wait-gpus``; 0: refuse at once).
    gpu_busy_mib: int = DEFAULT_GPU_BUSY_MIB
    wait_gpus: float = 0.0
    gpu_busy_util: int = DEFAULT_GPU_BUSY_UTIL
    # The GPU health rules this site relaxes (``agent/node/gpus.HEALTH_RULES``),
    # the GPUs taken out by hand as (host, index), and where every node keeps
    # its GPU locks (None: each node's default, ``agent/node/gpulocks.lock_dir``).
    gpu_ignore: tuple[str, ...] = ()
    gpu_exclude: tuple[tuple[str, int], ...] = ()
    gpu_lock_dir: str | None = None
    # What was given that is valid but likely not meant (``gpus: 4``): said by
    # the dry-run and by ``up`` before anything starts.
    warnings: tuple[str, ...] = ()
    # The workloads ``workload.name`` was checked against: the plan and the
    # refusals read this one.
    catalog: Catalog = field(default_factory=builtin, compare=False, repr=False)

    @property
    def all_warnings(self) -> tuple[str, ...]:
        """Every warning the dry-run and ``up`` say: the layout's, then the workload's."""
        return (*self.warnings, *self.workload.warnings)

    def block(self, key: str) -> Any:
        """The backend block ``key`` (``slurm``), or None when not given."""
        return self.blocks.get(key)

    @property
    def uses_gpus(self) -> bool:
        return all(node.procs is None for node in self.nodes)

    @property
    def world_size(self) -> int:
        return sum(node.nproc for node in self.nodes)
