"""A node's GPUs as nvidia-smi reports them, and which of them a run may take.

On a shared machine an index the user typed may belong to someone else's
job, be in MIG mode, or be held by another run of ddp-orch. ``facts`` asks
nvidia-smi once per launch for what is there and what runs on it;
``choose`` turns a request (``[3, 4]``, ``"all"``, ``"free"``, ``"free:N"``)
into indices, or into a refusal that says who uses what and which GPUs are
free now, in words the user can act on. ``choose`` is pure, so every rule is
tested without a GPU; the locks that hold the chosen GPUs for a run's life
are in ``gpulocks``.

Stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

import collections
import os
import pwd
import shutil
import subprocess
import time

GPU_FIELDS = ("index,uuid,pci.bus_id,name,memory.total,memory.used,utilization.gpu,"
              "mig.mode.current,driver_version")
APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"
CSV = "--format=csv,noheader,nounits"
# nvidia-smi's words for a value it does not have; each becomes None.
_UNKNOWN = ("", "[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]")
# Its "query unsuccessful" status, with these words when the node has no GPU.
NO_DEVICES_EXIT = 6
NO_DEVICES = "No devices were found"
_KILLED_WAIT_S = 1.0  # how long a killed nvidia-smi may take to go
_ERROR_CHARS = 300

REASONS = ("missing", "mig", "held", "busy", "short")
WAITABLE = frozenset({"held", "busy", "short"})


class Unreadable(ValueError):
    """A line of nvidia-smi's CSV that is not what was asked for."""


# -- facts ----------------------------------------------------------------

def facts(timeout_s: float = 10.0) -> dict:
    """What nvidia-smi says of this node's GPUs and the processes on them.

    ``{"ok": True, "driver", "gpus": [...], "apps": [...]}`` (see
    ``parse_gpu`` and ``parse_app``); ``{"ok": False, "absent": True,
    "error"}`` without nvidia-smi; ``{"ok": False, "error"}`` when it fails,
    hangs (each call is bounded by ``timeout_s``) or answers something
    unreadable. A node without GPUs is ok with ``gpus == []``.
    """
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"ok": False, "absent": True, "error": "nvidia-smi not found on PATH"}
    try:
        gpu_lines = _query(smi, f"--query-gpu={GPU_FIELDS}", timeout_s)
        gpus = [parse_gpu(line) for line in gpu_lines]
        app_lines = _query(smi, f"--query-compute-apps={APP_FIELDS}", timeout_s) if gpus else []
        apps = [parse_app(line) for line in app_lines]
    except (_Failed, Unreadable) as exc:
        return {"ok": False, "error": str(exc)}
    drivers = [gpu.pop("driver") for gpu in gpus]  # the node's, said on every line
    return {"ok": True, "driver": next(filter(None, drivers), None), "gpus": gpus, "apps": apps}


SAMPLE_FIELDS = "index,utilization.gpu,memory.used"


def sample(indices: "list[int] | tuple[int, ...]", timeout_s: float = 5.0) -> dict | None:
    """``{index: [utilization %, memory used MiB]}`` now for the GPUs
    ``indices`` (a value nvidia-smi withholds is None), or None when
    nvidia-smi is absent, fails or hangs (each call bounded by ``timeout_s``):
    the supervisor's heartbeat carries it, so ``status`` and the summary see
    each rank's GPU while the run goes on."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not indices:
        return None
    wanted = set(indices)
    try:
        out = {}
        for line in _query(smi, f"--query-gpu={SAMPLE_FIELDS}", timeout_s):
            index, util, used = _fields(line, SAMPLE_FIELDS, free_text="index")
            key = _int(index, "index", line)
            if key in wanted:
                out[str(key)] = [_int(util, "utilization.gpu", line),
                                 _int(used, "memory.used", line)]
        return out
    except (_Failed, Unreadable):
        return None


class _Failed(Exception):
    """nvidia-smi did not answer a query: its words, exit status or time-out."""


def _query(smi: str, query: str, timeout_s: float) -> list[str]:
    """The non-empty lines ``nvidia-smi QUERY --format=csv,...`` prints.

    Not ``subprocess.run``: on a time-out it waits for the killed child
    without a bound, and an nvidia-smi stuck in the driver (a GPU fallen off
    the bus) does not die; this gives up on it after ``_KILLED_WAIT_S``.
    """
    what = f"nvidia-smi {query.split('=', 1)[0]}"
    try:
        proc = subprocess.Popen([smi, query, CSV], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                errors="replace")
    except OSError as exc:
        raise _Failed(f"{what}: {exc.strerror or exc}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _abandon(proc)
        raise _Failed(f"{what}: no answer within {timeout_s:g}s") from None
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    if proc.returncode == NO_DEVICES_EXIT and NO_DEVICES in out + err:
        return []
    if proc.returncode != 0:
        said = _last_line(err) or _last_line(out) or "no output"
        raise _Failed(f"{what}: {said[:_ERROR_CHARS]} (exit {proc.returncode})")
    return lines


def _abandon(proc: subprocess.Popen) -> None:
    """Kill ``proc`` and wait a moment for it; a process that cannot die is
    left to the kernel rather than hanging the agent with it."""
    proc.kill()
    try:
        proc.wait(_KILLED_WAIT_S)
    except subprocess.TimeoutExpired:
        pass
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def parse_gpu(line: str) -> dict:
    """One line of ``--query-gpu=GPU_FIELDS``: ``{"index", "uuid", "bus_id",
    "name", "memory_total_mib", "memory_used_mib", "utilization", "mig",
    "driver"}`` (``facts`` moves ``driver`` to the node). Unknown numbers are
    None; ``mig`` is True only where MIG mode is enabled now."""
    (index, uuid, bus_id, name, total, used, util, mig, driver) = \
        _fields(line, GPU_FIELDS, free_text="name")
    number = _int(index, "index", line)
    if number is None:
        raise Unreadable(f"nvidia-smi gave a GPU without an index: {line[:_ERROR_CHARS]!r}")
    return {"index": number, "uuid": uuid, "bus_id": bus_id, "name": name,
            "memory_total_mib": _int(total, "memory.total", line),
            "memory_used_mib": _int(used, "memory.used", line),
            "utilization": _int(util, "utilization.gpu", line),
            "mig": mig.lower() == "enabled", "driver": driver}


def parse_app(line: str) -> dict:
    """One line of ``--query-compute-apps=APP_FIELDS``: ``{"gpu_uuid", "pid",
    "name", "used_mib", "user"}``; ``user`` is the owner of ``/proc/<pid>``,
    None where that pid is not visible here (another container's)."""
    gpu_uuid, pid, name, used = _fields(line, APP_FIELDS, free_text="process_name")
    number = _int(pid, "pid", line)
    if number is None:
        raise Unreadable(f"nvidia-smi gave a process without a pid: {line[:_ERROR_CHARS]!r}")
    return {"gpu_uuid": gpu_uuid, "pid": number, "name": name,
            "used_mib": _int(used, "used_memory", line), "user": process_user(number)}


def _fields(line: str, fields: str, free_text: str) -> list[str]:
    """The ``", "``-separated values of ``line``, one per field, ``""`` where
    nvidia-smi has none. A free-text field (a model or a process name) may
    hold ``", "`` itself: the values around it are counted from both ends,
    and it keeps what is left."""
    names = fields.split(",")
    values = [value.strip() for value in line.split(", ")]
    if len(values) < len(names):
        raise Unreadable(f"nvidia-smi gave {len(values)} values for {len(names)} fields "
                         f"({fields}): {line[:_ERROR_CHARS]!r}")
    at = names.index(free_text)
    after = len(names) - at - 1
    extra = len(values) - len(names)
    joined = ", ".join(values[at:at + extra + 1])
    return [_text(v) for v in values[:at] + [joined] + values[len(values) - after:]]


def _text(value: str) -> str:
    return "" if value in _UNKNOWN else value


def _int(value: str, field: str, line: str) -> int | None:
    if value in _UNKNOWN:
        return None
    try:
        return int(value)
    except ValueError:
        raise Unreadable(f"nvidia-smi gave {field} {value!r}, not a number: "
                         f"{line[:_ERROR_CHARS]!r}") from None


def process_user(pid: int) -> str | None:
    """The user who owns process ``pid`` here: a name, ``uid N`` without
    one, None when ``/proc/<pid>`` is not there to ask."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# -- choose ---------------------------------------------------------------

def lock_key(gpu: dict) -> str:
    """The name a GPU is held under (``gpulocks``): its UUID, which no other
    GPU anywhere has; ``index-N`` for a GPU whose UUID nvidia-smi withholds."""
    return gpu.get("uuid") or f"index-{gpu['index']}"


def choose(request: "list[int] | tuple[int, ...] | str", gpus: list[dict], apps: list[dict],
           *, threshold_mib: int = 1024, held: "dict[str, dict] | None" = None,
           allow_busy: bool = False) -> dict:
    """The GPUs ``request`` gets on a node whose ``facts`` are ``gpus`` and
    ``apps``, where the GPUs in ``held`` (lock key -> holder, see
    ``lock_key``) are another run's now.

    A GPU is busy when a compute process runs on it, or more than
    ``threshold_mib`` of its memory is used (a launch chooses before any
    process of its run exists, so every process is another's); it is free
    when it is neither busy nor held nor in MIG mode. An explicit list and
    ``"all"`` refuse MIG, held and (unless ``allow_busy``) busy GPUs; ``"free"``
    takes every free GPU, ``"free:N"`` N of them (see ``_pick``).

    ``{"ok": True, "chosen", "uuids", "models", "bus_ids", "notes"}``, or
    ``{"ok": False, "reason", "error", "free", "waitable"}``: ``reason`` is
    one of ``REASONS``; ``waitable`` says whether waiting could clear it.
    """
    node = _Node(gpus, apps, held or {}, threshold_mib)
    if isinstance(request, str) and request.startswith("free"):
        return _choose_free(node, _free_count(request))
    if request == "all":
        if not gpus:
            return node.refusal([("missing", "nvidia-smi lists no GPU on this node")])
        return _choose_listed(node, sorted(node.by_index), allow_busy)
    if isinstance(request, str):
        raise ValueError(f"GPU request {request!r}: expected a list of indices, "
                         "'all', 'free' or 'free:N'")
    return _choose_listed(node, list(request), allow_busy)


def _free_count(request: str) -> int | None:
    """None for ``"free"`` (every free GPU), N for ``"free:N"``."""
    if request == "free":
        return None
    head, _, count = request.partition(":")
    if head != "free" or not count.isdigit() or int(count) < 1:
        raise ValueError(f"GPU request {request!r}: expected 'free' or 'free:N' with N >= 1")
    return int(count)


class _Node:
    """One node's GPUs with what makes each unavailable, worked out once."""

    def __init__(self, gpus: list[dict], apps: list[dict], held: dict[str, dict],
                 threshold_mib: int):
        self.by_index = {gpu["index"]: gpu for gpu in gpus}
        self.held = held
        self.threshold_mib = threshold_mib
        self.procs: dict[str, list[dict]] = collections.defaultdict(list)
        for app in apps:
            self.procs[app["gpu_uuid"]].append(app)

    def holder(self, gpu: dict) -> dict | None:
        return self.held.get(lock_key(gpu))

    def busy(self, gpu: dict) -> bool:
        """A process runs on it, or memory is in use on it (a process of
        another container is not listed, its memory is)."""
        used = gpu.get("memory_used_mib")
        return bool(self.procs[gpu.get("uuid")]) or \
            (used is not None and used > self.threshold_mib)

    def is_free(self, gpu: dict) -> bool:
        return not (gpu.get("mig") or self.holder(gpu) is not None or self.busy(gpu))

    def free(self) -> list[int]:
        return sorted(i for i, gpu in self.by_index.items() if self.is_free(gpu))

    def why_not(self, gpu: dict, allow_busy: bool) -> tuple[str, str] | None:
        """Why ``gpu`` may not be taken: ``(reason, words)``; None if it may."""
        if gpu.get("mig"):
            return "mig", (f"{_name(gpu)} is in MIG mode: its instances are not plain indices; "
                           "run under Slurm, or set CUDA_VISIBLE_DEVICES=MIG-<uuid> yourself "
                           "(nvidia-smi -L lists them)")
        holder = self.holder(gpu)
        if holder is not None:
            return "held", f"{_name(gpu)} is held by {describe_holder(holder)}"
        if self.busy(gpu) and not allow_busy:
            return "busy", f"{_name(gpu)} is busy: {self.use(gpu)}"
        return None

    def use(self, gpu: dict) -> str:
        """What uses ``gpu``: each process (by pid, whatever order nvidia-smi
        gave them in), or its memory when none is visible."""
        procs = sorted(self.procs[gpu.get("uuid")], key=lambda app: app["pid"])
        if procs:
            return ", ".join(_describe_proc(p) for p in procs)
        total = gpu.get("memory_total_mib")
        of = f" of {total} MiB" if total is not None else ""
        return (f"{gpu.get('memory_used_mib')} MiB{of} used, by no process visible here "
                "(another container's?)")

    def refusal(self, problems: list[tuple[str, str]], waitable: bool = True) -> dict:
        """The answer for ``problems`` (reason, words): the first reason in
        ``REASONS`` order, since a missing GPU matters more than a busy one;
        waitable only when every problem could clear by waiting (and the
        caller knows of nothing else that cannot)."""
        reasons = {reason for reason, _ in problems}
        free = self.free()
        ready = f"free now: {','.join(map(str, free))}" if free else "none free now"
        return {"ok": False, "reason": next(r for r in REASONS if r in reasons),
                "error": "; ".join(words for _, words in problems) + f"; {ready}",
                "free": free, "waitable": waitable and reasons <= WAITABLE}

    def chosen(self, indices: list[int], notes: list[str]) -> dict:
        """The answer for ``indices``; mixed models are the gang's to say
        (``engine/gpuplan.notes``, ``check``), from the ``models`` here."""
        gpus = [self.by_index[i] for i in indices]
        return {"ok": True, "chosen": indices, "uuids": [gpu.get("uuid", "") for gpu in gpus],
                "models": [gpu.get("name", "") for gpu in gpus],
                "bus_ids": [gpu.get("bus_id", "") for gpu in gpus], "notes": notes,
                "free": self.free()}


def _choose_listed(node: _Node, indices: list[int], allow_busy: bool) -> dict:
    """An explicit list (in the user's order: it is the ranks' order), or
    every GPU: all of them, or a refusal naming each that may not be taken."""
    missing = [i for i in indices if i not in node.by_index]
    there = ",".join(map(str, sorted(node.by_index))) or "none"
    problems = [("missing", f"no GPU {','.join(map(str, missing))} on this node "
                            f"(nvidia-smi lists GPUs: {there})")] if missing else []
    problems += filter(None, (node.why_not(node.by_index[i], allow_busy)
                              for i in indices if i in node.by_index))
    if problems:
        return node.refusal(problems)
    notes = [f"{_name(node.by_index[i])} is busy, taken anyway: {node.use(node.by_index[i])}"
             for i in indices if node.busy(node.by_index[i])]
    return node.chosen(indices, notes)


def _choose_free(node: _Node, count: int | None) -> dict:
    """``"free"`` (``count`` None: every free GPU) or ``"free:N"``."""
    free = [node.by_index[i] for i in node.free()]
    wanted = count or 1
    if len(free) < wanted:
        plain = sum(not gpu.get("mig") for gpu in node.by_index.values())
        return node.refusal([("short", _short(node, len(free), wanted, count is None, plain))],
                            waitable=plain >= wanted)
    picked = free if count is None else _pick(free, count)
    return node.chosen(sorted(gpu["index"] for gpu in picked), [])


def _short(node: _Node, free: int, wanted: int, every: bool, plain: int) -> str:
    """Why too few GPUs are free: how many are, what keeps each other one,
    and whether the node has ``wanted`` GPUs outside MIG mode at all."""
    asked = "free" if every else f"free:{wanted}"
    words = (f"{asked} asks for {wanted} free GPU{'s' if wanted > 1 else ''}; "
             f"{free} {'is' if free == 1 else 'are'} free on this node")
    if plain < wanted:
        words += f", which has {plain} GPU{'' if plain == 1 else 's'} outside MIG mode"
    others = [node.why_not(gpu, allow_busy=False) for _, gpu in sorted(node.by_index.items())]
    return words + "".join(f"; {why}" for _, why in filter(None, others))


def _order(gpu: dict) -> tuple:
    """The order free GPUs are taken in: least memory used, then least
    utilisation, then lowest index (unknown values last)."""
    used, util = gpu.get("memory_used_mib"), gpu.get("utilization")
    return (used is None, used or 0, util is None, util or 0, gpu["index"])


def _pick(free: list[dict], count: int) -> list[dict]:
    """``count`` of the ``free`` GPUs, of one model where possible: ranks on
    mixed models all run at the pace of the slowest.

    The model is the one with the most free GPUs, up to ``count``; between
    models that supply as many, the one whose best GPU comes first in
    ``_order``. Its best GPUs are taken first, and when it has fewer than
    ``count`` the rest come from the other models, in ``_order``.
    """
    ordered = sorted(free, key=_order)
    supply = collections.Counter(gpu.get("name", "") for gpu in ordered)
    model = max(supply, key=lambda name: (min(supply[name], count),
                                          -next(k for k, gpu in enumerate(ordered)
                                                if gpu.get("name", "") == name)))
    ranked = sorted(ordered, key=lambda gpu: gpu.get("name", "") != model)  # stable
    return ranked[:count]


def mixed_models(names: "list[str] | tuple[str, ...]") -> str | None:
    """One line for a list of models with more than one in it
    (``mixed GPU models: 2x H100, 1x A100: the slowest paces every step``),
    most numerous first; None for one model or none."""
    counts = collections.Counter(names)
    if len(counts) < 2:
        return None
    listed = ", ".join(f"{n}x {name or 'unknown model'}" for name, n in counts.most_common())
    return f"mixed GPU models: {listed}: the slowest paces every step"


def describe_holder(holder: dict) -> str:
    """``run R of USER since 2025-06-01 14:03:07 (pid P on HOST)``, from a
    lock's holder record; an unreadable record is said as such."""
    if not holder:
        return "another run (its lock record is unreadable)"
    words = f"run {holder.get('run_id', '?')} of {holder.get('user', '?')}"
    started = holder.get("started")
    if isinstance(started, (int, float)) and not isinstance(started, bool):
        words += " since " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    elif started:
        words += f" since {started}"
    where = [f"pid {holder['pid']}"] if holder.get("pid") else []
    where += [str(holder["host"])] if holder.get("host") else []
    return f"{words} ({' on '.join(where)})" if where else words


def _describe_proc(app: dict) -> str:
    used = app.get("used_mib")
    return (f"pid {app['pid']} {app.get('name') or '?'} "
            f"({app.get('user') or 'user unknown'}, "
            f"{f'{used} MiB' if used is not None else 'memory unknown'})")


def _name(gpu: dict) -> str:
    return f"GPU {gpu['index']} ({gpu.get('name') or 'unknown model'})"
