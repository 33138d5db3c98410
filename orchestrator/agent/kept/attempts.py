"""Node 0's record of a kept run's attempts, bounded by construction.

Each node's exit record is capped field by field (``compact``), whatever it
sent. What one ``finished`` line or keeper.json carries is cut to
``ATTEMPTS_BUDGET`` bytes, oldest detail first (``fit_attempts``), and past
``FULL_ATTEMPTS`` old attempts keep less (``shrink``), so a long run's memory
is bounded too. Likely root causes (``failed_itself``) keep detail longest.
"""

from __future__ import annotations

import json

from ..wire.protocol import MAX_CONTROL_LINE, Ended

# What one node's exit record may hold in the attempts that node 0 keeps and
# sends: ``finished`` is one control line, and a run may have many attempts.
MAX_FAILURES, MAX_MESSAGE, MAX_LAST_LINES, MAX_LINE = 3, 500, 3, 300
FULL_ATTEMPTS = 16  # older attempts keep only the records of nodes that failed
MAX_SURVIVORS, MAX_CMD, BRIEF_TEXT = 5, 200, 200
# What one ``finished`` line or one keeper.json (the ``keeper`` reply) may
# carry of the attempts: half a control line, so the envelope always fits.
ATTEMPTS_BUDGET = MAX_CONTROL_LINE // 2


def compact(event: dict) -> dict:
    """A node's exit record, capped (``MAX_*``): only the outcome's fields, checked."""
    out: dict = {} if _int(event.get("code")) is None else {"code": event["code"]}
    out["duration_s"] = _num(event.get("duration_s")) or 0
    if _num(event.get("stopped_at")) is not None:
        out["stopped_at"] = event["stopped_at"]
    for key in ("stepped", "stop_asked", "survivors_gone", "setup_failed"):
        if isinstance(event.get(key), bool):
            out[key] = event[key]
    if event.get("ended") in set(Ended):
        out["ended"] = str(event["ended"])
    out["reason"] = str(event.get("reason", ""))[:MAX_MESSAGE]
    out["failures"] = [_failure(f, MAX_MESSAGE) for f in _list(event.get("failures"))
                       if isinstance(f, dict)][:MAX_FAILURES]
    out["last_lines"] = [str(line)[-MAX_LINE:]
                         for line in _list(event.get("last_lines"))[-MAX_LAST_LINES:]]
    out["survivors"] = [{"pid": _int(s.get("pid")) or 0, "cmd": str(s.get("cmd", ""))[:MAX_CMD]}
                        for s in _list(event.get("survivors")) if isinstance(s, dict)
                        ][:MAX_SURVIVORS]
    if "lost" in event:
        out = {"lost": str(event["lost"])[:MAX_MESSAGE],
               **{k: event[k] for k in ("lost_at", "heard_at")
                  if _num(event.get(k)) is not None}}
    return out


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value) -> float | None:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _list(value) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def _failure(failure: dict, size: int) -> dict:
    stamp = failure.get("timestamp")
    path = failure.get("error_file")
    return {"local_rank": _int(failure.get("local_rank")) or 0,
            "message": str(failure.get("message", ""))[-size:],
            "timestamp": stamp if isinstance(stamp, (int, float))
            and not isinstance(stamp, bool) else 0,
            "error_file": str(path)[-size:] if path is not None else None}


def failed_itself(entry: dict) -> bool:
    """A node record that may be the root cause: lost, or failed before it
    was asked to stop (the controller's rule, ``exit_outcome``)."""
    if "lost" in entry or entry.get("hung"):
        return True
    if entry.get("code") in (0, None):
        return False
    if not entry.get("stop_asked") or entry.get("ended") == Ended.ITSELF:
        return True
    stopped = _num(entry.get("stopped_at"))
    stamps = [_num(f.get("timestamp")) for f in _list(entry.get("failures"))
              if isinstance(f, dict)]
    return stopped is not None and any(
        t is not None and t + (1 if float(t).is_integer() else 0) <= stopped for t in stamps)


def _brief(entry: dict, failures: int = 1, text: int = BRIEF_TEXT) -> dict:
    """A node record without its detail, still a whole exit record."""
    if "lost" in entry:
        return {"lost": str(entry["lost"])[:text]}
    out = {k: entry[k] for k in ("code", "ended", "stop_asked", "stopped_at", "stepped",
                                 "survivors_gone", "hung") if k in entry}
    out.update(reason=str(entry.get("reason", ""))[:text], last_lines=[],
               duration_s=_num(entry.get("duration_s")) or 0,
               failures=[_failure(f, text) for f in _list(entry.get("failures"))
                         if isinstance(f, dict)][:failures],
               survivors=[{"pid": _int(s.get("pid")) or 0, "cmd": str(s.get("cmd", ""))[:80]}
                          for s in _list(entry.get("survivors")) if isinstance(s, dict)
                          ][:failures])
    return out


def shrink(record: dict, level: int) -> dict:
    """An attempt's record with less detail: level 1, every node brief; level 2,
    only ``failed_itself`` nodes brief, the others bare; level 3, only those."""
    nodes = dict(record.get("nodes") or {})
    kept = {k: _brief(e) if level == 1 or failed_itself(e) else _brief(e, 0, 80)
            for k, e in nodes.items() if level < 3 or failed_itself(e)}
    out = {**record, "nodes": kept}
    if len(kept) < len(nodes):
        out["nodes_omitted"] = int(record.get("nodes_omitted", 0)) + len(nodes) - len(kept)
    return out


def _size(value) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def fit_attempts(attempts: list[dict], budget: int = ATTEMPTS_BUDGET) -> tuple[list[dict], int]:
    """The attempts' records cut to ``budget`` bytes of JSON, and how many of
    the oldest were dropped. Cut until they fit: older attempts shrunk, oldest
    first; then the last (the run's outcome) brief; then the oldest dropped;
    then the last shrunk further, its nodes dropped from the highest rank."""
    out = list(attempts)
    sizes = [_size(a) for a in out]

    def fits() -> bool:
        return sum(sizes) + len(sizes) + 1 <= budget

    def shrink_at(i: int, level: int) -> None:
        out[i] = shrink(out[i], level)
        sizes[i] = _size(out[i])

    for level in (1, 2):
        for i in range(len(out) - 1):
            if fits():
                return out, 0
            shrink_at(i, level)
    if not out or fits():
        return out, 0
    shrink_at(-1, 1)
    omitted = 0
    while len(out) > 1 and not fits():
        out.pop(0)
        sizes.pop(0)
        omitted += 1
    for level in (2, 3):
        if not fits():
            shrink_at(-1, level)
    if not fits():
        last = dict(out[-1])
        nodes = dict(last.get("nodes") or {})
        over = sum(sizes) + len(sizes) + 1 - budget
        for k in sorted(nodes, key=lambda k: -int(k) if k.lstrip("-").isdigit() else 0):
            if over <= 0:
                break
            over -= _size({k: nodes.pop(k)})
            last["nodes_omitted"] = int(last.get("nodes_omitted", 0)) + 1
        out[-1] = {**last, "nodes": nodes}
    return out, omitted
