"""The launch's GPUs, from the controller's side: what each node is asked,
how long to wait, and the gang's one decision, ``device: auto``: CUDA on
every node, or a refusal naming the node whose torch cannot. Never a silent
CPU fallback in one process while the rest of the gang waits for it on NCCL.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ..agent.node.gpus import HEALTH_RULES, mixed_models
from ..config.spec import DEFAULT_GPU_BUSY_MIB, ClusterSpec
from ..errors import ConfigError, TransportError
from ..records.hints import MEMLOCK_FIX, SHM_FIX, cuda_error_words
from ..plan.model import GpuChoice, NodePlan, RunPlan
from ..tables import span

NO_CUDA_FIX = ("install a CUDA build of torch there, or set `device: cpu` for a CPU rehearsal "
               "(each GPU index a CPU process)")
MAX_GPUS_PER_NODE = 1024  # as the loader's indices
WAIT_POLL_S = 2.0  # between a waiting node's looks at its GPUs
WAIT_SAY_S = 30.0  # how often a wait says who holds the GPUs
CLI = "command line"


def gpu_request(plan: RunPlan, node: NodePlan, spec: ClusterSpec | None,
                allow_busy: bool) -> dict[str, Any] | None:
    """The ``gpus`` request for ``node``; None for CPU processes and scheduler GPUs."""
    if node.gpu_request is not None:
        want: Any = node.gpu_request
    elif node.gpus is not None:
        want = list(node.gpus)
    else:
        return None
    policy: dict[str, Any] = {}
    if spec is not None:
        policy = {"busy_util": spec.gpu_busy_util, "ignore": list(spec.gpu_ignore),
                  "exclude": [k for host, k in spec.gpu_exclude if host == node.host],
                  **({"lock_dir": spec.gpu_lock_dir} if spec.gpu_lock_dir else {})}
    return {"want": want, "run_id": plan.run_id, "node_rank": node.node_rank,
            "busy_mib": spec.gpu_busy_mib if spec else DEFAULT_GPU_BUSY_MIB,
            "allow_busy": allow_busy, "rehearsal": plan.device == "cpu", **policy}


def wants_torch(plan: RunPlan, node: NodePlan) -> bool:
    """Is the node's torch asked whether it sees its GPUs? Not on a CPU rehearsal."""
    return plan.device != "cpu" and (node.gpus is not None or node.gpu_request is not None)


def wait_for_gpus(first: dict, ask: Callable[[], dict], wait_s: float,
                  say: Callable[[str], None], label: str, want: Any = None) -> dict:
    """The node's answer once no wait can clear it, or ``wait_s`` is over."""
    reply = first
    deadline = time.monotonic() + wait_s
    said = None
    while not reply.get("ok") and reply.get("waitable") and time.monotonic() < deadline:
        now = time.monotonic()
        if said is None or now - said >= WAIT_SAY_S:
            say(f"{label}: {waiting_words(reply, want)}; up to {span(deadline - now)} more")
            said = now
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))
        reply = ask()
    return reply


def wait_over(plan: RunPlan, waited: Mapping[int, float]) -> str:
    """The end of a wait: ``GPUs free after 2m10s on node 0 (gpu-a): starting``."""
    return "GPUs free after " + ", ".join(
        f"{span(s)} on node {k} ({plan.nodes[k].host})" for k, s in sorted(waited.items())) + \
        ": starting"


MAX_HOLDERS_SAID = 3  # a wait's line names this many holders, then counts the rest


def waiting_words(reply: dict, want: Any = None) -> str:
    """``waiting for free:2 (none free): GPUs 1,2 held by run a of bob``. The
    listing came from the node: only indexed GPUs count, each name cut short."""
    wanted = (f"GPU{'s' if len(want) > 1 else ''} {','.join(map(str, want))}"
              if isinstance(want, list) else str(want) if want else "its GPUs")
    free = reply.get("free") or []
    now = f"free now: {','.join(map(str, free))}" if free else "none free"
    head = f"waiting for {wanted} ({now})"
    listing = reply.get("gpus")
    if not isinstance(listing, list) or not listing:
        return f"{head}: {reply.get('error')}"
    users: dict[str, list[int]] = {}
    for gpu in listing:
        index = gpu.get("index") if isinstance(gpu, dict) else None
        if not isinstance(index, int) or index in free:
            continue
        if isinstance(want, list) and index not in want:
            continue
        who = _keeper(gpu, reply.get("apps") or [])
        if who:
            users.setdefault(who, []).append(index)
    said = [f"GPU{'s' if len(ks) > 1 else ''} {','.join(map(str, ks))} {who}"
            for who, ks in list(users.items())[:MAX_HOLDERS_SAID]]
    more = len(users) - len(said)
    return head + (": " + "; ".join(said) if said else "") + \
        (f"; and {more} more holder{'s' if more > 1 else ''}" if more > 0 else "")


def _keeper(gpu: dict, apps: list) -> str:
    """Who keeps ``gpu`` from the run, briefly; "" for one that is free."""
    holder = gpu.get("held_by")
    if isinstance(holder, dict):
        return f"held by run {_brief(holder.get('run_id'))} of {_brief(holder.get('user'))}"
    if holder is not None:
        return "held by another run"
    procs = sorted((a for a in apps if isinstance(a, dict) and a.get("gpu_uuid") == gpu.get("uuid")
                    and gpu.get("uuid")), key=lambda a: str(a.get("pid")))
    if procs:
        return "busy: " + ", ".join(f"pid {_brief(a.get('pid'))} {_brief(a.get('name'))} "
                                     f"({_brief(a.get('user'))})" for a in procs[:2]) + \
            (f" and {len(procs) - 2} more" if len(procs) > 2 else "")
    if gpu.get("mig"):
        return "in MIG mode"
    used = gpu.get("memory_used_mib")
    return f"busy: {_brief(used)} MiB in use, by no process visible here" if used else ""


def _brief(value: object, width: int = 60) -> str:
    """A value a node sent: ``?`` for none, cut to ``width`` characters."""
    text = "?" if value is None or value == "" else str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def checked(reply: object, host: str, torch: bool = False) -> dict:
    """A node's ``gpus`` answer, checked before it becomes the plan; with
    ``torch``, every answer (the one ending a wait too) must carry torch's view."""
    def strings(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) and len(v) <= 256
                                               for v in value)

    ok = isinstance(reply, dict) and isinstance(reply.get("ok"), bool)
    if ok and reply["ok"]:
        chosen = reply.get("chosen")
        ok = isinstance(chosen, list) and 0 < len(chosen) <= MAX_GPUS_PER_NODE and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < MAX_GPUS_PER_NODE
            for i in chosen) and len(set(chosen)) == len(chosen) \
            and all(strings(reply.get(key, [])) and len(reply.get(key, [])) in (0, len(chosen))
                    for key in ("uuids", "models")) and strings(reply.get("notes", []))
    elif ok:
        free = reply.get("free") or []
        ok = isinstance(reply.get("error"), str) and isinstance(free, list) \
            and strings([str(i) for i in free])
    seen = reply.get("torch", {}) if isinstance(reply, dict) else {}
    ok = ok and isinstance(seen, dict) and isinstance(seen.get("count", 0), int) \
        and (not torch or "torch" in reply)
    if not ok:
        raise TransportError(host, f"its agent's answer about its GPUs is malformed: "
                                   f"{str(reply)[:200]}")
    return reply  # type: ignore[return-value]


def choices(replies: Mapping[int, dict]) -> dict[int, GpuChoice]:
    """Each node's chosen GPUs from its (ok) answer."""
    return {k: GpuChoice(tuple(int(i) for i in reply["chosen"]),
                         tuple(map(str, reply.get("uuids") or ())),
                         tuple(map(str, reply.get("models") or ())))
            for k, reply in replies.items() if reply.get("ok")}


def refuse(plan: RunPlan, spec: ClusterSpec | None, replies: Mapping[int, dict],
           wait_s: float) -> None:
    """``ConfigError`` naming every refusing node at its ``gpus:`` line, one hint for all."""
    refused = [k for k in sorted(replies) if not replies[k].get("ok")]
    if not refused:
        return
    words = {}
    for k in refused:
        reply = replies[k]
        waited = f" (waited {span(wait_s)})" if wait_s and reply.get("waitable") else ""
        words[k] = f"node {k} ({plan.nodes[k].host}): {reply.get('error')}{waited}"
    first, *others = refused
    rest = "".join(f"\n  {_place(spec, k)}: {words[k]}" for k in others)
    raise ConfigError(words[first] + rest, **_where(spec, first),
                      hint=hint({k: replies[k] for k in refused}, wait_s))


# the way out for GPUs a node does not have, the same in ``check``, ``up`` and
# the localhost refusal (controller/refusals.py)
CPU_REHEARSAL = "set `device: cpu` for a CPU rehearsal (the listed GPUs become CPU processes)"


def hint(replies: Mapping[int, dict], wait_s: float = 0.0) -> str:
    """What to do about the GPU refusals: take the free ones, wait, or go anyway."""
    reasons = {reply.get("reason") for reply in replies.values()}
    fixes = [_fix(reply) for reply in replies.values()
             if reply.get("reason") in ("no-smi", "smi-failed", "mig", "unhealthy", "excluded")]
    if fixes:
        return "; ".join(dict.fromkeys(fixes))
    named = len(replies) > 1
    takes = [("node %d: " % k if named else "") + f"gpus: \"{','.join(map(str, reply['free']))}\""
             for k, reply in sorted(replies.items()) if reply.get("free")]
    actions = [f"launch on those now ({', '.join(takes)})"] if takes else []
    if reasons & {"held", "busy", "short"}:
        actions.append(f"wait longer than {span(wait_s)} (--wait-gpus SECONDS)" if wait_s
                       else "wait for them (--wait-gpus SECONDS)")
    if "busy" in reasons:
        actions.append("go on the busy ones anyway (--allow-busy-gpus; never on another run's)")
    if "missing" in reasons:
        actions.append(CPU_REHEARSAL)
    if not actions:
        return "`ddp-orch check` shows each node's GPUs, who holds them and who uses them"
    return actions[0] if len(actions) == 1 else \
        f"{', '.join(actions[:-1])} or {actions[-1]}"


def _fix(reply: dict) -> str:
    """What to do where nvidia-smi cannot say, or about GPUs no wait frees."""
    reason = reply.get("reason")
    if reason == "no-smi":
        return "list the GPUs by index (gpus: 0,1), or install the NVIDIA utilities there"
    if reason == "smi-failed":
        return "run nvidia-smi on that node: the driver must answer before a GPU run can start"
    free = reply.get("free") or []
    listed = ",".join(map(str, free))
    ready = f'launch on those now (gpus: "{listed}")' if free else ""
    return "; ".join(filter(None, [ready, *_fixes(reply.get("faults") or [])])) or \
        "`ddp-orch check` shows each node's GPUs, who holds them and who uses them"


# What to do about a GPU that cannot be taken whatever the wait, by health
# rule (``agent/node/gpus.HEALTH_RULES``): the fix on the node, as root.
_RESET = "reset it once nothing runs on it (`sudo nvidia-smi -r -i {i}`) or reboot the node"
RULE_FIXES = {
    "reset": _RESET,
    "ecc": _RESET + " (uncorrected errors count since the driver loaded)",
    "retired_pages": _RESET + ": the pages are retired then",
    "remapped_rows": _RESET + "; a remapping that failed does not heal: drain the node and "
                              "have the GPU replaced",
    "compute_mode": "`sudo nvidia-smi -i {i} -c DEFAULT` lets processes use it",
    "unreadable": "run `nvidia-smi -q -i {i}` there: if the driver cannot read it, drain the "
                  "node",
}


def _fixes(faults: "list[dict]") -> list[str]:
    """Each GPU fault's fix on the node, once per fix, and how to take it anyway."""
    out: list[str] = []
    relaxable: list[str] = []
    for fault in faults:
        if not isinstance(fault, dict) or not isinstance(fault.get("index"), int):
            continue
        i, reason = fault["index"], fault.get("reason")
        if reason == "mig":
            out.append(f"GPU {i}: turn MIG off once nothing runs on it "
                       f"(`sudo nvidia-smi -i {i} -mig 0`, then reset it), or leave its "
                       "instances to a launcher that takes MIG UUIDs (Slurm's gres)")
        elif reason == "excluded":
            out.append(f"GPU {i} is taken out by gpu_policy.exclude: remove it there to use it")
        elif reason == "unhealthy":
            rules = [str(r) for r in fault.get("rules") or ()]
            out += [f"GPU {i}: " + RULE_FIXES[r].format(i=i) for r in rules if r in RULE_FIXES]
            relaxable += [r for r in rules if r in HEALTH_RULES]
    if relaxable:
        out.append(f"gpu_policy: {{ignore: [{', '.join(dict.fromkeys(relaxable))}]}} takes such "
                   "GPUs anyway, at your risk")
    return list(dict.fromkeys(out))


def _where(spec: ClusterSpec | None, k: int) -> dict[str, Any]:
    if spec is None or spec.nodes[k].line is None:
        return {"path": "--gpus", "source": CLI}
    return {"path": f"nodes[{k}].gpus", "source": spec.source, "line": spec.nodes[k].line}


def _place(spec: ClusterSpec | None, k: int) -> str:
    """``cluster.yaml:5: nodes[1].gpus``: where node ``k``'s request is."""
    where = _where(spec, k)
    at = f"{where['source']}:{where['line']}" if "line" in where else where["source"]
    return f"{at}: {where['path']}"


def decide_device(plan: RunPlan, spec: ClusterSpec | None,
                  replies: Mapping[int, dict]) -> str | None:
    """``cuda`` for ``auto`` when every node's torch sees its GPUs (None:
    nothing to decide), else ``ConfigError`` naming the node that cannot."""
    asked = {k: reply["torch"] for k, reply in replies.items() if "torch" in reply}
    if not asked:
        return None
    for k in sorted(asked):
        problem = torch_problem(asked[k], replies[k])
        if problem:
            node = plan.nodes[k]
            raise ConfigError(
                f"node {k} ({node.host}): device {plan.device}, but {problem}",
                **_where(spec, k), hint=f"{torch_fix(asked[k])} (the node's python: "
                                        f"{node.python})")
    return "cuda" if plan.device == "auto" else None


def torch_fix(seen: dict) -> str:
    """What to do about the node's torch not seeing its GPUs (``torch_problem``)."""
    error = seen.get("cuda_error")
    if isinstance(error, dict) and isinstance(error.get("code"), int):
        fix = cuda_error_words(str(error.get("call") or "cuInit"), error["code"])[1]
        return f"{fix}; or set `device: cpu` for a CPU rehearsal"
    cuda, driver = str(seen.get("cuda") or ""), str(seen.get("driver_cuda") or "")
    if cuda and driver and _minor(driver)[0] < _minor(cuda)[0]:
        return (f"upgrade the node's NVIDIA driver to one for CUDA {cuda}, or install a torch "
                f"built for CUDA {driver} or older there")
    return NO_CUDA_FIX


def torch_problem(seen: dict, reply: dict) -> str | None:
    """Why the node's torch cannot run its ranks on their GPUs, or None."""
    if not seen.get("ok"):
        return f"its torch did not answer: {seen.get('error')}"
    if not seen.get("cuda"):
        return f"its torch {seen.get('torch')} is built without CUDA"
    count = int(seen.get("count") or 0)
    if not seen.get("available") or count == 0:
        why = f": {seen['why']}" if isinstance(seen.get("why"), str) else ""
        error = seen.get("cuda_error")
        if isinstance(error, dict) and isinstance(error.get("code"), int):
            why = ": " + cuda_error_words(str(error.get("call") or "cuInit"), error["code"])[0]
        return f"its torch {seen.get('torch')} (CUDA {seen.get('cuda')}) sees no GPU{why}"
    wanted = [int(i) for i in reply.get("chosen") or ()]
    beyond = [i for i in wanted if i >= count]
    if beyond:
        return (f"its torch sees {count} GPU(s) (indices 0-{count - 1}), and GPU "
                f"{','.join(map(str, beyond))} is not among them")
    return None


SHM_MIN_MIB = 512  # less /dev/shm than this, with 2 ranks or more on a node: NCCL runs out


def limit_problems(limits: object, ranks: int) -> list[str]:
    """What a node's limits cost NCCL: a small ``/dev/shm`` (about 9 MiB per
    rank pair and channel; Docker gives 64 MiB), capped memlock with InfiniBand."""
    if not isinstance(limits, dict):
        return []
    out = []
    shm = limits.get("shm_mib")
    if ranks > 1 and isinstance(shm, int) and shm < SHM_MIN_MIB:
        out.append(f"/dev/shm is {shm} MiB for {ranks} ranks, and NCCL's shared memory between "
                   f"them needs more: {SHM_FIX}")
    memlock, rdma = limits.get("memlock_kib"), limits.get("rdma") or []
    if rdma and isinstance(memlock, int):
        out.append(f"its locked-memory limit is {memlock} KiB with InfiniBand "
                   f"({', '.join(map(str, rdma[:4]))}): NCCL cannot register its buffers: "
                   f"{MEMLOCK_FIX}")
    return out


def _arch(word: str) -> tuple[str, int, int, str] | None:
    """``sm_86`` -> ("sm", 8, 6, ""), ``compute_90`` -> PTX 9.0, ``sm_90a`` -> 9.0 only."""
    kind, _, rest = word.partition("_")
    digits = rest.rstrip("af")
    if kind not in ("sm", "compute") or not digits.isdigit() or len(digits) < 2:
        return None
    return kind, int(digits[:-1]), int(digits[-1]), rest[len(digits):]


def kernel_problem(cap: object, arch: object) -> tuple[bool, str] | None:
    """Whether torch's ``arch`` list has kernels for capability ``cap`` ("8.6"):
    None when it does (or unknown), ``(False, words)`` when only PTX would be
    compiled at first use, ``(True, words)`` when nothing would run."""
    if not isinstance(cap, str) or not isinstance(arch, list) or not arch:
        return None
    try:
        major, minor = (int(part) for part in cap.split("."))
    except ValueError:
        return None
    built = [a for a in map(lambda w: _arch(str(w)), arch) if a is not None]
    if not built:
        return None
    for kind, a_major, a_minor, suffix in built:
        if kind == "sm" and a_major == major and a_minor <= minor and \
                (suffix != "a" or a_minor == minor):
            return None
    listed = " ".join(map(str, arch))
    if any(kind == "compute" and (a_major, a_minor) <= (major, minor)
           for kind, a_major, a_minor, _ in built):
        return False, (f"compute capability {cap} has no kernel built in its torch ({listed}): "
                       "its PTX is compiled at first use, slowly")
    return True, (f"compute capability {cap} has no kernel in its torch (built for {listed}): "
                  "its first kernel would fail with \"no kernel image is available\"")


def node_findings(seen: dict, chosen: "list[int] | tuple[int, ...]", limits: object,
                  device: str) -> list[tuple[str, bool, str]]:
    """``(check, fatal, words)`` for a GPU node; shared by the launch and ``check``."""
    out: list[tuple[str, bool, str]] = []
    cuda, driver = str(seen.get("cuda") or ""), str(seen.get("driver_cuda") or "")
    if cuda and driver and _minor(driver) < _minor(cuda) and \
            driver.split(".")[0] == cuda.split(".")[0]:
        out.append(("driver", False, f"its driver supports CUDA {driver}, older than the CUDA "
                                     f"{cuda} its torch was built with: it runs (minor version "
                                     "compatibility), but a kernel shipped as PTX only would "
                                     "not; upgrade the driver"))
    caps = seen.get("caps") if isinstance(seen.get("caps"), list) else []
    for index in chosen:
        cap = caps[index] if isinstance(index, int) and 0 <= index < len(caps) else None
        found = kernel_problem(cap, seen.get("arch"))
        if found is not None:
            out.append(("gpu-arch", found[0], f"GPU {index}'s {found[1]}"))
    if device != "cpu":
        out += [("nccl-limits", False, problem) for problem in limit_problems(limits,
                                                                                len(chosen))]
    return out


def arch_fix(words: str, host: str) -> str:
    """What to do about a GPU its node's torch has no kernel for."""
    cap = words.split("compute capability ", 1)[-1].split(" ", 1)[0]
    return (f"install a torch built for sm_{cap.replace('.', '')} on {host} (a newer GPU needs "
            f"a newer CUDA build: see pytorch.org's install matrix), or list GPUs it has "
            f"kernels for")


def gang_checks(plan: RunPlan, spec: ClusterSpec | None,
                replies: Mapping[int, dict]) -> list[str]:
    """``check``'s checks from the launch's answers: differing torch or a GPU
    nothing runs on is a ``ConfigError``, the rest warnings."""
    from .checknet import version_rows

    asked = {k: r["torch"] for k, r in replies.items()
             if isinstance(r.get("torch"), dict) and r["torch"].get("ok")}
    hosts = {n.node_rank: n.host for n in plan.nodes}
    notes = []
    for row in version_rows(asked, hosts, plan.device):
        if not row.ok:
            raise ConfigError(f"{row.detail} (asked as the launch chose the GPUs)",
                              path="python", source=spec.source if spec else CLI,
                              hint="one torch everywhere: install it on every node (each node's "
                                   "`python:` names its interpreter); `ddp-orch check` shows "
                                   "each node's versions")
        if row.warning:
            notes.append(f"warning: {row.detail}")
    for k in sorted(replies):
        node = plan.nodes[k]
        label = f"node {k} ({node.host})"
        for _check, fatal, words in node_findings(asked.get(k, {}),
                                                  list(replies[k].get("chosen") or ()),
                                                  replies[k].get("limits"), plan.device):
            if fatal:
                raise ConfigError(f"{label}: {words}", **_where(spec, k),
                                  hint=arch_fix(words, node.host))
            notes.append(f"warning: {label}: {words}")
    return notes


def _minor(version: str) -> tuple[int, int]:
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def node_notes(plan: RunPlan, reply: dict) -> list[str]:
    """A node's notes on its GPUs, less a missing nvidia-smi on a CPU rehearsal."""
    if plan.device == "cpu" and reply.get("smi") == "absent":
        return []
    return list(reply.get("notes") or ())


def notes(plan: RunPlan, replies: Mapping[int, dict]) -> list[str]:
    """What the launch says of its GPUs before any rank starts."""
    models = [m for k in sorted(replies) for m in replies[k].get("models") or ()]
    mixed = mixed_models(models)  # the gang's, which says each node's too
    out = [f"node {k} ({plan.nodes[k].host}): {note}"
           for k in sorted(replies) for note in node_notes(plan, replies[k])]
    if mixed:
        out.append(f"warning: {mixed}")
    smi_absent_torch = [k for k, r in replies.items() if r.get("smi") == "absent"
                        and (r.get("torch") or {}).get("count")]
    out += [f"node {k} ({plan.nodes[k].host}): no nvidia-smi; its torch sees "
            f"{replies[k]['torch']['count']} GPU(s), so the launch goes on from torch's count"
            for k in sorted(smi_absent_torch)]
    return out
