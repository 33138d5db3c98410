"""The launch's GPUs, from the controller's side: what each node is asked,
how long to wait, and the gang's one decision from the nodes' answers.

Every GPU node's agent gets a ``gpus`` request before anything starts
(``agent/node/gpuclaim.py``): its list, or ``all``/``free``/``free:N``,
checked against nvidia-smi and the other runs' holds, and locked for the
run. Its answers become the plan's launch-time facts (``plan.model.GpuChoice``,
``plan.build.resolve_plan``): the indices each node's ranks take, their
UUIDs and models. A refusal names every node that refused, once each, at
its line in the cluster file: the GPU, who uses it and which GPUs are free;
its hint says what to do about them all. A wait says, every 30 s, a short
line per waiting node (what it waits for, who holds it), and its end.

``device: auto`` is decided here, once for the gang: CUDA on every node, or
a refusal naming the node whose torch cannot (no CUDA build, fewer GPUs
than listed). Never a silent CPU fallback in one process while the rest
of the gang waits for it on NCCL.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ..agent.node.gpus import mixed_models
from ..config.spec import DEFAULT_GPU_BUSY_MIB, ClusterSpec
from ..errors import ConfigError, TransportError
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
    """The ``gpus`` request for ``node``; None for CPU processes (``procs:``)
    and for GPUs a scheduler allocates."""
    if node.gpu_request is not None:
        want: Any = node.gpu_request
    elif node.gpus is not None:
        want = list(node.gpus)
    else:
        return None
    return {"want": want, "run_id": plan.run_id, "node_rank": node.node_rank,
            "busy_mib": spec.gpu_busy_mib if spec else DEFAULT_GPU_BUSY_MIB,
            "allow_busy": allow_busy, "rehearsal": plan.device == "cpu"}


def wants_torch(plan: RunPlan, node: NodePlan) -> bool:
    """Is the node's torch asked whether it sees its GPUs? Wherever the run
    uses CUDA (``cuda``, and ``auto``, decided here): not on a CPU rehearsal."""
    return plan.device != "cpu" and (node.gpus is not None or node.gpu_request is not None)


def wait_for_gpus(first: dict, ask: Callable[[], dict], wait_s: float,
                  say: Callable[[str], None], label: str, want: Any = None) -> dict:
    """The node's answer once it is not a refusal that waiting could clear,
    or once ``wait_s`` is over; ``ask`` asks again. Says every ``WAIT_SAY_S``,
    in one short line, what the node waits for and who holds or uses it
    (``waiting_words``; ``want``: the node's request)."""
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
    """The end of a wait, said once every node has its GPUs: ``GPUs free
    after 2m10s on node 0 (gpu-a): starting`` (``waited``: each node that
    waited, and how long)."""
    return "GPUs free after " + ", ".join(
        f"{span(s)} on node {k} ({plan.nodes[k].host})" for k, s in sorted(waited.items())) + \
        ": starting"


MAX_HOLDERS_SAID = 3  # a wait's line names this many holders, then counts the rest


def waiting_words(reply: dict, want: Any = None) -> str:
    """``waiting for free:2 (none free): GPUs 1,2 held by run a of bob; GPU 0
    busy: pid 4 python (alice)``: what a node waits for and who keeps each
    GPU it waits on, each holder once, from its refusal's GPU listing (the
    refusal's own words, whole, where it has none). The listing came from
    the node: what is not a GPU with an index is left out, and each name
    is cut short (``_brief``)."""
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
    """Who keeps ``gpu`` from the run, briefly: the run holding it, the
    processes on it, or its memory in use; "" for one that is free."""
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
    """A value a node sent, as a wait's line shows it: ``?`` for none, cut
    to ``width`` characters."""
    text = "?" if value is None or value == "" else str(value)
    return text if len(text) <= width else text[:width - 3] + "..."


def checked(reply: object, host: str) -> dict:
    """A node's ``gpus`` answer, as far as the launch reads it: what crosses
    the network is checked before it becomes the plan (``TransportError``
    naming the node otherwise)."""
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
    ok = ok and isinstance(seen, dict) and isinstance(seen.get("count", 0), int)
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
    """``ConfigError`` naming every node that refused its GPUs, once each,
    each at its ``gpus:`` line (the first in the error's head, the others
    on a line of their own), with what to do for all of them."""
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
    """What to do about the GPU refusals in ``replies`` (by node rank), in
    words their messages do not have: the GPUs free now as ``gpus:`` takes
    them, and the options that wait or go anyway; ``wait_s``: how long the
    launch waited already."""
    reasons = {reply.get("reason") for reply in replies.values()}
    fixes = [_fix(reply) for reply in replies.values()
             if reply.get("reason") in ("no-smi", "smi-failed", "mig")]
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
    """What to do where nvidia-smi cannot say (``no-smi``, ``smi-failed``) or
    a GPU is in MIG mode."""
    reason = reply.get("reason")
    if reason == "no-smi":
        return "list the GPUs by index (gpus: 0,1), or install the NVIDIA utilities there"
    if reason == "smi-failed":
        return "run nvidia-smi on that node: the driver must answer before a GPU run can start"
    return "MIG instances are not plain indices: run under Slurm, or set " \
        "CUDA_VISIBLE_DEVICES=MIG-<uuid> in your own launch"


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
    """The gang's device once every GPU node's torch has answered: ``cuda``
    for ``auto`` when each sees its GPUs (None: nothing to decide), or a
    ``ConfigError`` naming the node that cannot."""
    asked = {k: reply["torch"] for k, reply in replies.items() if "torch" in reply}
    if not asked:
        return None
    for k in sorted(asked):
        problem = torch_problem(asked[k], replies[k])
        if problem:
            node = plan.nodes[k]
            raise ConfigError(
                f"node {k} ({node.host}): device {plan.device}, but {problem}",
                **_where(spec, k), hint=f"{NO_CUDA_FIX} (the node's python: {node.python})")
    return "cuda" if plan.device == "auto" else None


def torch_problem(seen: dict, reply: dict) -> str | None:
    """Why the node's torch cannot run its ranks on their GPUs, or None."""
    if not seen.get("ok"):
        return f"its torch did not answer: {seen.get('error')}"
    if not seen.get("cuda"):
        return f"its torch {seen.get('torch')} is built without CUDA"
    count = int(seen.get("count") or 0)
    if not seen.get("available") or count == 0:
        why = f": {seen['why']}" if isinstance(seen.get("why"), str) else ""
        return f"its torch {seen.get('torch')} (CUDA {seen.get('cuda')}) sees no GPU{why}"
    wanted = [int(i) for i in reply.get("chosen") or ()]
    beyond = [i for i in wanted if i >= count]
    if beyond:
        return (f"its torch sees {count} GPU(s) (indices 0-{count - 1}), and GPU "
                f"{','.join(map(str, beyond))} is not among them")
    return None


def node_notes(plan: RunPlan, reply: dict) -> list[str]:
    """A node's notes on its GPUs, less, on a CPU rehearsal, the missing
    nvidia-smi (nothing of a GPU is used then)."""
    if plan.device == "cpu" and reply.get("smi") == "absent":
        return []
    return list(reply.get("notes") or ())


def notes(plan: RunPlan, replies: Mapping[int, dict]) -> list[str]:
    """What the launch says of its GPUs before any rank starts: a node
    without nvidia-smi, and GPU models that differ across the gang."""
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
