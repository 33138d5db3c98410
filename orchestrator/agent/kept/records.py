"""The shape of a kept run's records, checked wherever they are read.

They come from a node, so they are checked field by field like any control
message: a field of the wrong type, a time that is no time (``1e300``,
``NaN``), a part that is not a record, is dropped with a note. What is left
is safe to index; a reader never raises on a node's bad record.
"""

from __future__ import annotations

from typing import Any

from ..wire import fields
from ..wire.fields import TEXT, TIME, Field, count, is_int, is_number, of_types, optional, shown
from ..wire.protocol import PACE_KEYS, ProtocolError, validate

_RANK, _INT = count(0), of_types(int)
# field -> what it must be, for what a keeper writes; a field that is not is
# dropped, with a note (``fields.keep_good``).
_KEEPER_FIELDS = {
    "pid": count(1), "start_time": _INT, "node_rank": _RANK,
    # ``state``: a RunState word as the keepers write it; text here, so that a
    # record with another word still settles the run (a note says what was shown)
    "run_id": TEXT, "owner?": fields.RECORD, "state": TEXT, "code": optional(_INT),
    "attempt": _RANK, "updated": TIME, "attempts": fields.LIST, "progress": fields.RECORD,
}
# A rank's last step in the keeper's ``progress`` (``keeper._record_progress``):
# null for a rank whose GPU is sampled but that sends no step heartbeat.
_PROGRESS_FIELDS = {"step": optional(_INT), "last_progress": optional(TIME)}
# When the rank last printed a line (null: it printed none); absent in the
# records of keepers older than it, so optional.
_OUTPUT_FIELD = {"last_output": optional(TIME),
                 # when it last reported a step (null: never); absent likewise
                 "last_step": optional(TIME)}
# The training samples its step heartbeat says it processed so far (null: it
# says none); optional too, for the same reason.
_SAMPLES_FIELD = {"samples": optional(count(0))}
# Its seconds per step outside collectives (both or neither), absent from older
# keepers' records and where its step heartbeat says none.
_PACE_FIELDS = {key: Field(lambda v: is_number(v) and 0 <= v < 1e9, "seconds")
                for key in PACE_KEYS}
# Its GPU now, where the node's nvidia-smi answers (all three or none).
_GPU_FIELDS = {"gpu": Field(lambda v: is_int(v) and 0 <= v < 1 << 20, "a GPU index"),
               "gpu_util": optional(Field(lambda v: is_int(v) and 0 <= v <= 100, "a percentage")),
               "gpu_mem_mib": optional(Field(lambda v: is_int(v) and 0 <= v < 1 << 40, "MiB"))}
_ATTEMPT_FIELDS = {
    "attempt": _RANK, "master_port": fields.PORT, "state": TEXT, "stop_reason": TEXT,
    "restart": TEXT, "no_restart": TEXT, "nodes": fields.RECORD,
}
# A node's part of an attempt beyond its exit event (``protocol``'s checks).
_PART_FIELDS = {"stop_asked": fields.FLAG, "stepped": fields.FLAG,
                "hung": TEXT}  # the hang rule's root cause, on its node

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
    return fields.keep_good(part, _PART_FIELDS, what, notes)


def clean_attempts(attempts: Any, notes: list[str]) -> list[dict]:
    """Node 0's attempts, checked; what fails is dropped, with a note."""
    if not isinstance(attempts, list):
        notes.append("ignored node 0's attempts: not a list")
        return []
    out = []
    for i, entry in enumerate(attempts):
        if not isinstance(entry, dict):
            notes.append(f"ignored attempt record {i}: not a record")
            continue
        entry = fields.keep_good(entry, _ATTEMPT_FIELDS, f"attempt record {i}", notes)
        nodes = {}
        for key, part in (entry.get("nodes") or {}).items():
            if not (isinstance(key, str) and key.isdigit()):
                notes.append(f"ignored attempt record {i}'s node {shown(key)}")
                continue
            part = clean_part(part, f"attempt {i}'s record of node {key}", notes)
            if part is not None:
                nodes[key] = part
        entry["nodes"] = nodes
        out.append(entry)
    return out


def clean_keeper_state(recorded: Any, notes: list[str]) -> dict | None:
    """A keeper's ``keeper.json`` as read, checked (None: not a record)."""
    if recorded is None:
        return None
    if not isinstance(recorded, dict):
        notes.append("ignored the keeper's record: not a JSON object")
        return None
    out = fields.keep_good(recorded, _KEEPER_FIELDS, "the keeper's record", notes)
    if "attempts" in out:
        out["attempts"] = clean_attempts(out["attempts"], notes)
    if "progress" in out:
        out["progress"] = clean_progress(out["progress"], notes)
    return out


def clean_progress(progress: dict, notes: list[str]) -> dict[str, dict]:
    """A keeper's ranks' last steps: a rank without a good ``step`` and
    ``last_progress`` is dropped; the pace and GPU fields come all or none."""
    out = {}
    for rank, seen in progress.items():
        what = f"the keeper's progress of rank {shown(rank)}"
        if not (isinstance(rank, str) and rank.isdigit() and isinstance(seen, dict)):
            notes.append(f"ignored {what}: not a rank's record")
            continue
        seen = fields.keep_good(seen, {**_PROGRESS_FIELDS, **_OUTPUT_FIELD, **_SAMPLES_FIELD,
                              **_PACE_FIELDS, **_GPU_FIELDS}, what, notes)
        if all(name in seen for name in _PROGRESS_FIELDS):
            out[rank] = {name: seen[name] for name in (*_PROGRESS_FIELDS, *_OUTPUT_FIELD,
                                                       *_SAMPLES_FIELD) if name in seen}
            if all(name in seen for name in _PACE_FIELDS):
                out[rank].update({name: seen[name] for name in _PACE_FIELDS})
            if all(name in seen for name in _GPU_FIELDS):
                out[rank].update({name: seen[name] for name in _GPU_FIELDS})
        else:
            notes.append(f"ignored {what}: it lacks {' or '.join(_PROGRESS_FIELDS)}")
    return out
