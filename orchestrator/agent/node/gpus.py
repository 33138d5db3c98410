"""A node's GPUs as nvidia-smi reports them, and which of them a run may take.

``choose`` is pure, so it is tested without a GPU. ``subprocess`` is imported
only where nvidia-smi runs: a dry-run reads ``HEALTH_RULES`` here and starts
no process.
"""

from __future__ import annotations

import collections
import os
import pwd
import re
import shutil
import time
import typing

# What a launch reads of each GPU, then what its health is judged on
# (``health``). A health field an older nvidia-smi does not know is dropped
# from the query (its value unknown, and said: ``unreported``); the fields
# before the free-text name are what every nvidia-smi since R450 answers.
CORE_FIELDS = ("index", "uuid", "pci.bus_id", "name", "memory.total", "memory.used",
               "utilization.gpu", "mig.mode.current", "driver_version")
HEALTH_FIELDS = ("ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
                 "reset_status.reset_required", "compute_mode", "clocks_throttle_reasons.active")
GPU_FIELDS = ",".join(CORE_FIELDS + HEALTH_FIELDS)
# The newer name of a field, tried where nvidia-smi refuses the older one.
FIELD_ALIASES = {"clocks_throttle_reasons.active": "clocks_event_reasons.active"}
# Row remapping (Ampere and later) has a query of its own.
ROW_FIELDS = "gpu_uuid,remapped_rows.pending,remapped_rows.failure"
APP_FIELDS = "gpu_uuid,pid,process_name,used_memory"
CSV = "--format=csv,noheader,nounits"
# nvidia-smi's words for a value it does not have; each becomes None.
_UNKNOWN = ("", "[N/A]", "N/A", "[Not Supported]", "[Insufficient Permissions]", "[Unknown Error]")
# Its words for a GPU in a fault state, in place of a value: the GPU is unusable.
FAULT_VALUES = {"[GPU requires reset]": "needs a reset", "[GPU is lost]": "is lost to the driver"}
# Its "query unsuccessful" status, with these words when the node has no GPU.
NO_DEVICES_EXIT = 6
NO_DEVICES = "No devices were found"
# Lines it prints among the rows about a GPU it could not read (exit 15, a
# GPU off the bus) or a warning (exit 14, a corrupted infoROM).
_SAID = ("Unable to determine the device handle", "WARNING:", "Unable to ", "GPU is lost")
_NOT_A_FIELD = re.compile(r'Field "(?P<field>[^"]+)" is not a valid field to query')
_KILLED_WAIT_S = 1.0  # how long a killed nvidia-smi may take to go
_ERROR_CHARS = 300
# clocks_throttle_reasons.active bits (nvml.h) that slow a GPU that is not
# asked to be slow: HW slowdown, SW and HW thermal slowdown, HW power brake.
THROTTLE_BITS = {0x8: "HW slowdown", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown",
                 0x80: "HW power brake slowdown"}

# Why a GPU may not be taken, gravest first (``choose``'s refusals).
REASONS = ("missing", "mig", "unhealthy", "excluded", "held", "busy", "short")
WAITABLE = frozenset({"held", "busy", "short"})
# The health rules a GPU is refused on, each of which ``gpu_policy.ignore``
# may relax for a site; a line nvidia-smi could not read is never taken.
HEALTH_RULES = ("ecc", "retired_pages", "remapped_rows", "reset", "compute_mode")
DEFAULT_BUSY_UTIL = 50  # percent: more is another's job at work, whatever its memory


class Unreadable(ValueError):
    """A line of nvidia-smi's CSV that is not what was asked for."""


# -- facts ----------------------------------------------------------------

def facts(timeout_s: float = 10.0) -> dict:
    """This node's GPUs and the processes on them, or ``{"ok": False, "error"}``.
    A non-zero exit with rows (a corrupted infoROM, a GPU off the bus) keeps
    the GPUs it could read."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"ok": False, "absent": True, "error": "nvidia-smi not found on PATH"}
    try:
        answer, unreported = _query_gpus(smi, timeout_s)
    except _Failed as exc:
        return {"ok": False, "error": str(exc)}
    gpus, notes = read_gpu_lines(answer.rows, unreported)
    if answer.code != 0 and not gpus:
        return {"ok": False, "error": answer.failure}
    if not gpus and notes:
        return {"ok": False, "error": "; ".join(notes)[:_ERROR_CHARS * 2]}
    said = list(answer.said)
    apps: list[dict] = []
    if gpus:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            asked_apps = pool.submit(_query, smi, f"--query-compute-apps={APP_FIELDS}",
                                     timeout_s)
            asked_rows = pool.submit(_query, smi, f"--query-remapped-rows={ROW_FIELDS}",
                                     timeout_s)
        try:
            listed = asked_apps.result()
        except _Failed as exc:
            return {"ok": False, "error": str(exc)}
        if listed.code != 0 and not listed.rows and answer.code == 0:
            return {"ok": False, "error": listed.failure}
        for line in listed.rows:
            try:
                apps.append(parse_app(line))
            except Unreadable as exc:  # a process we cannot read: its GPU's memory still counts
                notes.append(str(exc))
        said += listed.said
        _add_rows(gpus, asked_rows)
    drivers = [gpu.pop("driver", None) for gpu in gpus]  # the node's, said on every line
    out = {"ok": True, "driver": next(filter(None, drivers), None), "gpus": gpus, "apps": apps}
    if said or notes:
        out["notes"] = list(dict.fromkeys([*said, *notes]))
    if unreported:
        out["unreported"] = unreported
    return out


def _query_gpus(smi: str, timeout_s: float) -> tuple["_Answer", list[str]]:
    """``--query-gpu`` with every field this nvidia-smi knows, and those it refused."""
    fields = list(CORE_FIELDS + HEALTH_FIELDS)
    unreported: list[str] = []
    while True:
        try:
            answer = _query(smi, "--query-gpu=" + ",".join(fields), timeout_s)
        except _Failed as exc:
            field = exc.not_a_field
            if field is None or field in CORE_FIELDS or field not in fields:
                raise
            at = fields.index(field)
            alias = FIELD_ALIASES.get(field)
            if alias is not None and alias not in fields:
                fields[at] = alias
            else:
                del fields[at]
                unreported.append(next((old for old, new in FIELD_ALIASES.items()
                                        if new == field), field))
            continue
        order = CORE_FIELDS + HEALTH_FIELDS
        return (answer._replace(rows=[_padded(line, fields) for line in answer.rows]),
                sorted(unreported, key=order.index))


def _padded(line: str, fields: list[str]) -> str:
    """``line`` as if every field was asked, ``[N/A]`` for those left out."""
    every = CORE_FIELDS + HEALTH_FIELDS
    if fields == list(every):
        return line
    values = line.split(", ")
    if len(values) < len(fields):
        return line  # unreadable either way: parse_gpu says why
    extra = len(values) - len(fields)  # a name with ", " in it
    at = fields.index("name")
    joined = values[:at] + [", ".join(values[at:at + extra + 1])] + values[at + extra + 1:]
    by_field = dict(zip(fields, joined))
    for old, new in FIELD_ALIASES.items():
        if new in by_field:
            by_field[old] = by_field.pop(new)
    return ", ".join(by_field.get(f, "[N/A]") for f in every)


def read_gpu_lines(lines: list[str], unreported: "list[str] | tuple[str, ...]" = ()
                   ) -> tuple[list[dict], list[str]]:
    """The GPUs of ``--query-gpu``'s lines (an unreadable one marked, never taken), and notes."""
    gpus, notes = [], []
    for line in lines:
        try:
            gpus.append(parse_gpu(line))
        except Unreadable as exc:
            index = _leading_index(line)
            if index is None:
                notes.append(f"a line nvidia-smi printed cannot be read: {line[:_ERROR_CHARS]!r}")
            else:
                gpus.append({"index": index, "uuid": "", "bus_id": "", "name": "",
                             "memory_total_mib": None, "memory_used_mib": None,
                             "utilization": None, "mig": False, "unreadable": str(exc)})
    return gpus, notes


def _leading_index(line: str) -> int | None:
    first = line.split(",", 1)[0].strip()
    return int(first) if first.isdigit() and len(first) <= 4 else None


def _add_rows(gpus: list[dict], asked: "concurrent.futures.Future") -> None:
    """Each GPU's row remapping; none (pre-Ampere, old drivers) is unknown."""
    try:
        rows = asked.result().rows
    except _Failed:
        return
    by_uuid = {gpu.get("uuid"): gpu for gpu in gpus if gpu.get("uuid")}
    for line in rows:
        try:
            uuid, pending, failed = _fields(line, ROW_FIELDS, free_text="gpu_uuid")
        except Unreadable:
            continue
        if uuid in by_uuid:
            by_uuid[uuid]["remapped_pending"] = _yes(pending)
            by_uuid[uuid]["remapped_failed"] = _yes(failed)


SAMPLE_FIELDS = "index,utilization.gpu,memory.used"


def sample(indices: "list[int] | tuple[int, ...]", timeout_s: float = 5.0) -> dict | None:
    """``{index: [utilization %, memory used MiB]}`` for ``indices``; None if nvidia-smi fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None or not indices:
        return None
    wanted = set(indices)
    try:
        rows = _query(smi, f"--query-gpu={SAMPLE_FIELDS}", timeout_s).rows
    except _Failed:
        return None
    out = {}
    for line in rows:
        try:
            index, util, used = _fields(line, SAMPLE_FIELDS, free_text="index")
            key = _int(index, "index", line)
            if key in wanted:
                out[str(key)] = [_int(util, "utilization.gpu", line),
                                 _int(used, "memory.used", line)]
        except Unreadable:
            continue
    return out or None


class _Failed(Exception):
    """nvidia-smi gave no answer; ``not_a_field``: the field it refused, if any."""

    def __init__(self, words: str, not_a_field: str | None = None):
        super().__init__(words)
        self.not_a_field = not_a_field


class _Answer(typing.NamedTuple):
    """One query's answer; ``said`` is its warnings and stderr, not rows."""

    rows: list[str]
    said: list[str]
    code: int
    failure: str


def _query(smi: str, query: str, timeout_s: float) -> _Answer:
    """What ``nvidia-smi QUERY`` printed, whatever its exit status. Not
    ``subprocess.run``, which waits without bound for the killed child: an
    nvidia-smi stuck in the driver (a GPU off the bus) does not die."""
    import subprocess

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
    if proc.returncode == NO_DEVICES_EXIT and NO_DEVICES in out + err:
        return _Answer([], [], 0, "")
    words = _last_line(err) or _last_line(out) or "no output"
    failure = f"{what}: {words[:_ERROR_CHARS]} (exit {proc.returncode})"
    refused = _NOT_A_FIELD.search(out + err)
    if proc.returncode != 0 and refused:
        raise _Failed(failure, refused.group("field"))
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    rows = [line for line in lines if not line.startswith(_SAID)]
    said = [line[:_ERROR_CHARS] for line in lines if line.startswith(_SAID)]
    said += [line.strip()[:_ERROR_CHARS] for line in err.splitlines() if line.strip()]
    if proc.returncode != 0:
        said.append(f"{what} exited {proc.returncode}")
    return _Answer(rows, said, proc.returncode, failure)


def _abandon(proc: subprocess.Popen) -> None:
    """Kill ``proc``; one that cannot die is left to the kernel, not awaited."""
    import subprocess

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
    """One line of ``--query-gpu=GPU_FIELDS``, with its health; unknown values
    are None. ``ecc_errors`` counts uncorrected errors since the driver loaded."""
    (index, uuid, bus_id, name, total, used, util, mig, driver,
     ecc, retired, reset, mode, throttle) = _fields(line, GPU_FIELDS, free_text="name")
    number = _int(index, "index", line)
    if number is None:
        raise Unreadable(f"nvidia-smi gave a GPU without an index: {line[:_ERROR_CHARS]!r}")
    faults = [FAULT_VALUES[v] for v in (total, used, util, ecc, mode, throttle)
              if v in FAULT_VALUES]
    return {"index": number, "uuid": uuid, "bus_id": bus_id, "name": name,
            "memory_total_mib": _int(total, "memory.total", line),
            "memory_used_mib": _int(used, "memory.used", line),
            "utilization": _int(util, "utilization.gpu", line),
            "mig": mig.lower() == "enabled", "driver": driver,
            "ecc_errors": _int(ecc, "ecc.errors.uncorrected.volatile.total", line),
            "retired_pending": _yes(retired), "reset_required": _yes(reset),
            "compute_mode": None if mode in FAULT_VALUES else (mode or None),
            "throttle": _bits(throttle, line), "fault": faults[0] if faults else None}


def _yes(value: str) -> bool | None:
    low = value.lower()
    return True if low in ("yes", "1", "true") else False if low in ("no", "0", "false") else None


def _bits(value: str, line: str) -> int | None:
    if value in _UNKNOWN or value in FAULT_VALUES:
        return None
    try:
        return int(value, 16) if value.lower().startswith("0x") else int(value)
    except ValueError:
        raise Unreadable(f"nvidia-smi gave clocks_throttle_reasons.active {value!r}, not a "
                         f"bitmask: {line[:_ERROR_CHARS]!r}") from None


def parse_app(line: str) -> dict:
    """One line of ``--query-compute-apps``; ``user`` is None for another container's pid."""
    gpu_uuid, pid, name, used = _fields(line, APP_FIELDS, free_text="process_name")
    number = _int(pid, "pid", line)
    if number is None:
        raise Unreadable(f"nvidia-smi gave a process without a pid: {line[:_ERROR_CHARS]!r}")
    return {"gpu_uuid": gpu_uuid, "pid": number, "name": name,
            "used_mib": _int(used, "used_memory", line), "user": process_user(number)}


def _fields(line: str, fields: str, free_text: str) -> list[str]:
    """``line``'s values, one per field; a free-text field (a model or
    process name) may hold ``", "`` itself and keeps what the others leave."""
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
    if value in _UNKNOWN or value in FAULT_VALUES:
        return None
    try:
        return int(value)
    except ValueError:
        raise Unreadable(f"nvidia-smi gave {field} {value!r}, not a number: "
                         f"{line[:_ERROR_CHARS]!r}") from None


def process_user(pid: int) -> str | None:
    """Who owns process ``pid``: a name, ``uid N``, or None if not visible."""
    try:
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# -- health -----------------------------------------------------------------

def health(gpu: dict, ignore: "tuple[str, ...] | list[str] | frozenset[str]" = ()
           ) -> list[tuple[str, str]]:
    """What makes ``gpu`` unfit, as ``(rule, words)``, gravest first. An
    unknown value is no problem: nothing is known against the GPU."""
    out: list[tuple[str, str]] = []
    if gpu.get("unreadable"):
        return [("unreadable", f"its line of nvidia-smi cannot be read ({gpu['unreadable']})")]
    if gpu.get("fault"):
        out.append(("reset", f"nvidia-smi says it {gpu['fault']}"))
    rules = {
        "ecc": (gpu.get("ecc_errors") or 0) > 0 and
        f"{gpu['ecc_errors']} uncorrected ECC error{'s' if gpu['ecc_errors'] != 1 else ''} "
        "since the driver loaded",
        "retired_pages": gpu.get("retired_pending") is True and
        "memory pages pending retirement",
        "remapped_rows": (gpu.get("remapped_failed") is True and "a failed row remapping") or
        (gpu.get("remapped_pending") is True and "a row remapping pending"),
        "reset": gpu.get("reset_required") is True and not gpu.get("fault") and
        "nvidia-smi says it needs a reset",
        "compute_mode": (gpu.get("compute_mode") or "").lower() == "prohibited" and
        "compute mode Prohibited: no process may use it",
    }
    out += [(rule, words) for rule, words in rules.items() if words and rule not in ignore]
    return out


def cautions(gpu: dict) -> list[str]:
    """What a run may meet on ``gpu`` although it is taken: exclusive mode, slowed clocks."""
    out = []
    if (gpu.get("compute_mode") or "").lower() in ("exclusive_process", "exclusive_thread"):
        out.append(f"compute mode {gpu['compute_mode']}: one process at a time; a second CUDA "
                   "context on it fails")
    slow = [words for bit, words in THROTTLE_BITS.items() if (gpu.get("throttle") or 0) & bit]
    if slow:
        out.append(f"clocks held down ({', '.join(slow)}): it may pace every step")
    return out


def health_cell(gpu: dict, ignore: "tuple[str, ...] | list[str]" = ()) -> str:
    """``check``'s HEALTH cell: ``ok``, or each problem and caution, briefly."""
    short = {"ecc": f"{gpu.get('ecc_errors')} ECC error{'s' if gpu.get('ecc_errors') != 1 else ''}",
             "retired_pages": "pages to retire",
             "remapped_rows": "row remap failed" if gpu.get("remapped_failed") else
             "row remap pending",
             "reset": "needs reset" if gpu.get("fault") != "is lost to the driver" else "lost",
             "compute_mode": "compute prohibited", "unreadable": "unreadable"}
    cells = [short[rule] + (" (ignored)" if rule in ignore else "") for rule, _ in health(gpu)]
    if (gpu.get("compute_mode") or "").lower().startswith("exclusive"):
        cells.append("exclusive mode")
    slow = [words for bit, words in THROTTLE_BITS.items() if (gpu.get("throttle") or 0) & bit]
    if slow:
        cells.append(f"throttled ({', '.join(slow)})")
    return ", ".join(cells) or "ok"


# -- choose ---------------------------------------------------------------

def lock_key(gpu: dict) -> str:
    """The name a GPU is held under: its UUID, unique anywhere, else ``index-N``."""
    return gpu.get("uuid") or f"index-{gpu['index']}"


def choose(request: "list[int] | tuple[int, ...] | str", gpus: list[dict], apps: list[dict],
           *, threshold_mib: int = 1024, held: "dict[str, dict] | None" = None,
           allow_busy: bool = False, busy_util: int = DEFAULT_BUSY_UTIL,
           ignore: "tuple[str, ...] | list[str]" = (),
           exclude: "tuple[int, ...] | list[int]" = ()) -> dict:
    """The GPUs ``request`` gets; ``held`` maps lock key to holder.

    A launch chooses before its ranks exist, so any process on a GPU is
    another's. Another container's processes are not listed, so memory over
    ``threshold_mib`` or use over ``busy_util`` percent is busy too.
    """
    node = _Node(gpus, apps, held or {}, threshold_mib, busy_util, tuple(ignore),
                 frozenset(exclude))
    if isinstance(request, str) and request.startswith("free"):
        return _choose_free(node, _free_count(request))
    if request == "all":
        if not gpus:
            return node.refusal([("missing", "nvidia-smi lists no GPU on this node", None)])
        return _choose_all(node, allow_busy)
    if isinstance(request, str):
        raise ValueError(f"GPU request {request!r}: expected a list of indices, "
                         "'all', 'free' or 'free:N'")
    return _choose_listed(node, list(request), allow_busy)


def _free_count(request: str) -> int | None:
    if request == "free":
        return None
    head, _, count = request.partition(":")
    if head != "free" or not count.isdigit() or int(count) < 1:
        raise ValueError(f"GPU request {request!r}: expected 'free' or 'free:N' with N >= 1")
    return int(count)


class _Node:
    """One node's GPUs with what makes each unavailable, worked out once."""

    def __init__(self, gpus: list[dict], apps: list[dict], held: dict[str, dict],
                 threshold_mib: int, busy_util: int, ignore: tuple[str, ...],
                 exclude: frozenset[int]):
        self.by_index = {gpu["index"]: gpu for gpu in gpus}
        self.held = held
        self.threshold_mib = threshold_mib
        self.busy_util = busy_util
        self.exclude = exclude
        self.unfit = {gpu["index"]: health(gpu, ignore) for gpu in gpus}
        self.procs: dict[str, list[dict]] = collections.defaultdict(list)
        for app in apps:
            self.procs[app["gpu_uuid"]].append(app)

    def holder(self, gpu: dict) -> dict | None:
        return self.held.get(lock_key(gpu))

    def busy(self, gpu: dict) -> bool:
        used, util = gpu.get("memory_used_mib"), gpu.get("utilization")
        return bool(self.procs[gpu.get("uuid")]) or \
            (used is not None and used > self.threshold_mib) or \
            (util is not None and util > self.busy_util)

    def takeable(self, gpu: dict) -> bool:
        """Not in MIG mode, fit, not excluded: a GPU waiting could free."""
        return not (gpu.get("mig") or self.unfit[gpu["index"]] or gpu["index"] in self.exclude)

    def is_free(self, gpu: dict) -> bool:
        return self.takeable(gpu) and self.holder(gpu) is None and not self.busy(gpu)

    def free(self) -> list[int]:
        return sorted(i for i, gpu in self.by_index.items() if self.is_free(gpu))

    def why_not(self, gpu: dict, allow_busy: bool) -> tuple[str, str, dict] | None:
        """Why ``gpu`` may not be taken: ``(reason, words, fault)``; None if it may."""
        index = gpu["index"]
        if gpu.get("mig"):
            return "mig", (f"{_name(gpu)} is in MIG mode: ddp-orch runs one rank per whole GPU, "
                           "and a MIG GPU is split into instances"), {"index": index,
                                                                       "reason": "mig"}
        problems = self.unfit[index]
        if problems:
            return "unhealthy", f"{_name(gpu)} is unfit: " + "; ".join(w for _, w in problems), \
                {"index": index, "reason": "unhealthy", "rules": [r for r, _ in problems]}
        if index in self.exclude:
            return "excluded", f"{_name(gpu)} is taken out by gpu_policy.exclude", \
                {"index": index, "reason": "excluded"}
        holder = self.holder(gpu)
        if holder is not None:
            return "held", f"{_name(gpu)} is held by {describe_holder(holder)}", None
        if self.busy(gpu) and not allow_busy:
            return "busy", f"{_name(gpu)} is busy: {self.use(gpu)}", None
        return None

    def use(self, gpu: dict) -> str:
        """What uses ``gpu``: its processes by pid, else its memory or utilisation."""
        procs = sorted(self.procs[gpu.get("uuid")], key=lambda app: app["pid"])
        if procs:
            return ", ".join(_describe_proc(p) for p in procs)
        used = gpu.get("memory_used_mib")
        if used is not None and used > self.threshold_mib:
            total = gpu.get("memory_total_mib")
            of = f" of {total} MiB" if total is not None else ""
            return f"{used} MiB{of} used, by no process visible here (another container's?)"
        return (f"{gpu.get('utilization')}% utilised (more than gpu_policy.busy_utilization, "
                f"{self.busy_util}%), by no process visible here (another container's?)")

    def refusal(self, problems: "list[tuple[str, str, dict | None]]",
                waitable: bool = True) -> dict:
        """The answer for ``problems``: the gravest reason (``REASONS``
        order); waitable only when every problem could clear by waiting."""
        reasons = {reason for reason, _, _ in problems}
        free = self.free()
        ready = f"free now: {','.join(map(str, free))}" if free else "none free now"
        return {"ok": False, "reason": next(r for r in REASONS if r in reasons),
                "error": "; ".join(words for _, words, _ in problems) + f"; {ready}",
                "free": free, "waitable": waitable and reasons <= WAITABLE,
                "faults": [fault for _, _, fault in problems if fault]}

    def chosen(self, indices: list[int], notes: list[str]) -> dict:
        """The answer for ``indices``; mixed models are the gang's to judge."""
        gpus = [self.by_index[i] for i in indices]
        notes = notes + [f"{_name(gpu)}: {words}" for gpu in gpus for words in cautions(gpu)]
        return {"ok": True, "chosen": indices, "uuids": [gpu.get("uuid", "") for gpu in gpus],
                "models": [gpu.get("name", "") for gpu in gpus],
                "bus_ids": [gpu.get("bus_id", "") for gpu in gpus], "notes": notes,
                "free": self.free()}


def _choose_listed(node: _Node, indices: list[int], allow_busy: bool,
                   notes: "list[str] | None" = None) -> dict:
    """An explicit list, in the user's (the ranks') order, or a refusal."""
    missing = [i for i in indices if i not in node.by_index]
    there = ",".join(map(str, sorted(node.by_index))) or "none"
    problems: list[tuple[str, str, dict | None]] = [
        ("missing", f"no GPU {','.join(map(str, missing))} on this node "
                    f"(nvidia-smi lists GPUs: {there})", None)] if missing else []
    problems += filter(None, (node.why_not(node.by_index[i], allow_busy)
                              for i in indices if i in node.by_index))
    if problems:
        return node.refusal(problems)
    notes = list(notes or []) + [
        f"{_name(node.by_index[i])} is busy, taken anyway: {node.use(node.by_index[i])}"
        for i in indices if node.busy(node.by_index[i])]
    return node.chosen(indices, notes)


def _choose_all(node: _Node, allow_busy: bool) -> dict:
    """Every GPU but the unfit and excluded ones (each noted), as a list."""
    left_out = {i: node.why_not(gpu, allow_busy=True) for i, gpu in node.by_index.items()
                if node.unfit[i] or i in node.exclude}
    taken = sorted(i for i in node.by_index if i not in left_out)
    if not taken:
        return node.refusal([why for _, why in sorted(left_out.items()) if why] or
                            [("missing", "nvidia-smi lists no usable GPU on this node", None)])
    notes = [f"all: {why[1]}, left out" for _, why in sorted(left_out.items()) if why]
    return _choose_listed(node, taken, allow_busy, notes)


def _choose_free(node: _Node, count: int | None) -> dict:
    free = [node.by_index[i] for i in node.free()]
    wanted = count or 1
    if len(free) < wanted:
        plain = sum(node.takeable(gpu) for gpu in node.by_index.values())
        return node.refusal([("short", _short(node, len(free), wanted, count is None, plain),
                              None)], waitable=plain >= wanted)
    picked = free if count is None else _pick(free, count)
    return node.chosen(sorted(gpu["index"] for gpu in picked), [])


def _short(node: _Node, free: int, wanted: int, every: bool, plain: int) -> str:
    """Why too few GPUs are free, and whether ``wanted`` ever could be."""
    asked = "free" if every else f"free:{wanted}"
    words = (f"{asked} asks for {wanted} free GPU{'s' if wanted > 1 else ''}; "
             f"{free} {'is' if free == 1 else 'are'} free on this node")
    if plain < wanted:
        outside = sum(not gpu.get("mig") for gpu in node.by_index.values())
        which = "outside MIG mode" if outside == plain else \
            "that may be taken at all (outside MIG mode, fit and not excluded)"
        words += f", which has {plain} GPU{'' if plain == 1 else 's'} {which}"
    others = [node.why_not(gpu, allow_busy=False) for _, gpu in sorted(node.by_index.items())]
    return words + "".join(f"; {why[1]}" for why in filter(None, others))


def _order(gpu: dict) -> tuple:
    """Free GPUs' order: unthrottled, least used, lowest index; unknowns last."""
    used, util = gpu.get("memory_used_mib"), gpu.get("utilization")
    slowed = any((gpu.get("throttle") or 0) & bit for bit in THROTTLE_BITS)
    return (slowed, used is None, used or 0, util is None, util or 0, gpu["index"])


def _pick(free: list[dict], count: int) -> list[dict]:
    """``count`` of the ``free`` GPUs, of one model where possible: ranks on
    mixed models all run at the slowest's pace."""
    ordered = sorted(free, key=_order)
    supply = collections.Counter(gpu.get("name", "") for gpu in ordered)
    model = max(supply, key=lambda name: (min(supply[name], count),
                                          -next(k for k, gpu in enumerate(ordered)
                                                if gpu.get("name", "") == name)))
    ranked = sorted(ordered, key=lambda gpu: gpu.get("name", "") != model)  # stable
    return ranked[:count]


def mixed_models(names: "list[str] | tuple[str, ...]") -> str | None:
    """``mixed GPU models: 2x H100, 1x A100: the slowest paces every step``,
    or None for one model or none."""
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
