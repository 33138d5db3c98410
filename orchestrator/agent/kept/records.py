"""The shape of a kept run's records, checked wherever they are read.

Node 0's keeper keeps the gang's attempts (``head.py``, ``attempts.py``) and every keeper
its state (``keeper.json``); the controller reads them back from the
``finished`` line, the ``keeper`` reply (``status``, ``ps``) and ``attach``.
They come from a node and from a file on it, so they are checked field by
field like any control message (``protocol.validate``): a field of the
wrong type, a time that is no time (``1e300``, ``NaN``), an attempt or a
node's part that is not a record, is dropped, and a note says so. What is
left is safe to use with plain indexing; a reader never raises on a node's
bad record.

Stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

from typing import Any

from ..wire.protocol import ProtocolError, is_count, is_time, validate

_INT, _STR, _BOOL = (int,), (str,), (bool,)


def _typed(value: Any, types: tuple[type, ...]) -> bool:
    return isinstance(value, types) and (bool in types or not isinstance(value, bool))


# field -> check, for what a keeper writes; a field that fails is dropped.
_KEEPER_FIELDS = {
    "pid": lambda v: _typed(v, _INT) and v > 0, "start_time": lambda v: _typed(v, _INT),
    "node_rank": lambda v: _typed(v, _INT) and v >= 0, "run_id": lambda v: _typed(v, _STR),
    "rule": lambda v: _typed(v, _STR), "state": lambda v: _typed(v, _STR),
    "code": lambda v: v is None or _typed(v, _INT), "attempt": lambda v: _typed(v, _INT) and v >= 0,
    "updated": is_time, "attempts": lambda v: isinstance(v, list),
    "progress": lambda v: isinstance(v, dict),
}
# A rank's last step in the keeper's ``progress`` (``keeper._record_progress``):
# null for a rank whose GPU is sampled but that sends no step heartbeat.
_PROGRESS_FIELDS = {"step": lambda v: v is None or _typed(v, _INT),
                    "last_progress": lambda v: v is None or is_time(v)}
# When the rank last printed a line (null: it printed none); absent in the
# records of keepers older than it, so optional.
_OUTPUT_FIELD = {"last_output": lambda v: v is None or is_time(v)}
# The training samples its step heartbeat says it processed so far (null: it
# says none); optional too, for the same reason.
_SAMPLES_FIELD = {"samples": lambda v: v is None or is_count(v)}
# Its GPU now, where the node's nvidia-smi answers (all three or none).
_GPU_FIELDS = {"gpu": lambda v: _typed(v, _INT) and 0 <= v < 1 << 20,
               "gpu_util": lambda v: v is None or (_typed(v, _INT) and 0 <= v <= 100),
               "gpu_mem_mib": lambda v: v is None or (_typed(v, _INT) and 0 <= v < 1 << 40)}
_ATTEMPT_FIELDS = {
    "attempt": lambda v: _typed(v, _INT) and v >= 0,
    "master_port": lambda v: _typed(v, _INT) and 0 <= v < 65536,
    "state": lambda v: _typed(v, _STR), "stop_reason": lambda v: _typed(v, _STR),
    "restart": lambda v: _typed(v, _STR), "no_restart": lambda v: _typed(v, _STR),
    "nodes": lambda v: isinstance(v, dict),
}
# A node's part of an attempt beyond its exit event (``protocol``'s checks).
_PART_FIELDS = {"stop_asked": lambda v: _typed(v, _BOOL), "stepped": lambda v: _typed(v, _BOOL),
                "hung": lambda v: _typed(v, _STR)}  # the hang rule's root cause, on its node


def _fields(record: dict, checks: dict, what: str, notes: list[str]) -> dict:
    out = dict(record)
    for name, check in checks.items():
        if name in out and not check(out[name]):
            notes.append(f"ignored {what}'s {name!r}: {_shown(out.pop(name))}")
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def clean_part(part: Any, what: str, notes: list[str]) -> dict | None:
    """A node's part of an attempt: ``{"lost": why}``, or its exit event with
    ``stop_asked`` and ``stepped``; None (with a note) when it is neither."""
    if not isinstance(part, dict):
        notes.append(f"ignored {what}: not a record")
        return None
    if "lost" in part:
        if not isinstance(part["lost"], str):
            notes.append(f"ignored {what}: 'lost' is not text")
            return None
        return {"lost": part["lost"]}
    try:
        validate({**part, "event": "exit"})
    except ProtocolError as exc:
        notes.append(f"ignored {what}: {exc}")
        return None
    return _fields(part, _PART_FIELDS, what, notes)


def clean_attempts(attempts: Any, notes: list[str]) -> list[dict]:
    """Node 0's attempts, each checked (``_ATTEMPT_FIELDS``) with each node's
    part (``clean_part``); what fails is dropped, and ``notes`` says what."""
    if not isinstance(attempts, list):
        notes.append("ignored node 0's attempts: not a list")
        return []
    out = []
    for i, entry in enumerate(attempts):
        if not isinstance(entry, dict):
            notes.append(f"ignored attempt record {i}: not a record")
            continue
        entry = _fields(entry, _ATTEMPT_FIELDS, f"attempt record {i}", notes)
        nodes = {}
        for key, part in (entry.get("nodes") or {}).items():
            if not (isinstance(key, str) and key.isdigit()):
                notes.append(f"ignored attempt record {i}'s node {_shown(key)}")
                continue
            part = clean_part(part, f"attempt {i}'s record of node {key}", notes)
            if part is not None:
                nodes[key] = part
        entry["nodes"] = nodes
        out.append(entry)
    return out


def clean_keeper_state(recorded: Any, notes: list[str]) -> dict | None:
    """A keeper's ``keeper.json`` as read: None if it is not a record, else
    its fields checked (``_KEEPER_FIELDS``) and its attempts cleaned."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        notes.append("ignored the keeper's record: not a JSON object")
        return None
    out = _fields(recorded, _KEEPER_FIELDS, "the keeper's record", notes)
    if "attempts" in out:
        out["attempts"] = clean_attempts(out["attempts"], notes)
    if "progress" in out:
        out["progress"] = clean_progress(out["progress"], notes)
    return out


def clean_progress(progress: dict, notes: list[str]) -> dict[str, dict]:
    """A keeper's ranks' last steps: ``{rank: {"step", "last_progress"}}``,
    each rank's record whole (both fields, of their type) or dropped, with
    ``last_output`` and ``samples`` where each is good, and
    its GPU (``gpu``, ``gpu_util``, ``gpu_mem_mib``) where all three are good."""
    out = {}
    for rank, seen in progress.items():
        what = f"the keeper's progress of rank {_shown(rank)}"
        if not (isinstance(rank, str) and rank.isdigit() and isinstance(seen, dict)):
            notes.append(f"ignored {what}: not a rank's record")
            continue
        seen = _fields(seen, {**_PROGRESS_FIELDS, **_OUTPUT_FIELD, **_SAMPLES_FIELD,
                              **_GPU_FIELDS}, what, notes)
        if all(name in seen for name in _PROGRESS_FIELDS):
            out[rank] = {name: seen[name] for name in (*_PROGRESS_FIELDS, *_OUTPUT_FIELD,
                                                       *_SAMPLES_FIELD) if name in seen}
            if all(name in seen for name in _GPU_FIELDS):
                out[rank].update({name: seen[name] for name in _GPU_FIELDS})
        else:
            notes.append(f"ignored {what}: it lacks {' or '.join(_PROGRESS_FIELDS)}")
    return out
