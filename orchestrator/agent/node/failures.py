"""A node's worker failures, from torchrun's error files, its summary and
each rank's own stderr.

torchrun writes error files only for ``@record`` scripts, and its summary
has a useless message and a whole-second time. So a failure is refined from
the rank's ``stderr.log``: its last exception line, and its sub-second write
time. A rank killed by a signal keeps the summary's time, rounded down.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from typing import Callable

from .. import layout

_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning)"
                             r"(?::.*)?)$")
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+)')
_UNHELPFUL = ("To enable traceback", "exitcode", "")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")  # torch prefixes redirected lines
STDERR_TAIL = 65536
MAX_MESSAGE = 2000  # characters of a failure's message kept: its end, where the error is


def collect(run_dir: str, torchrun_tail: list[str], log_dir: str | None = None,
            mask: Callable[[str], str] = lambda text: text) -> list[dict]:
    """Worker failures, earliest first, each message masked *before* the cut
    to ``MAX_MESSAGE``: a secret cut in two would keep its tail in clear."""
    found = _collect(run_dir, torchrun_tail, log_dir)
    return [dict(f, message=mask(f["message"])[-MAX_MESSAGE:]) for f in found]


def _collect(run_dir: str, torchrun_tail: list[str], log_dir: str | None) -> list[dict]:
    out = []
    log_dir = log_dir or os.path.join(run_dir, layout.TORCHRUN_LOGS)
    pattern = os.path.join(log_dir, "*", "attempt_*", "*", "error.json")
    for path in glob.glob(pattern):
        try:
            with open(path, encoding="utf-8") as fh:
                record = json.load(fh).get("message", {})
            stamp = os.stat(path).st_mtime
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(record, str):
            record = {"message": record}
        message = str(record.get("message", "")).strip()
        extra = record.get("extraInfo") if isinstance(record.get("extraInfo"), dict) else {}
        where = _user_frame(str(extra.get("py_callstack", "")).splitlines())
        if where and where not in message:
            message += f" ({where})"
        out.append({"local_rank": int(os.path.basename(os.path.dirname(path))),
                    "message": message,
                    "timestamp": stamp, "error_file": os.path.relpath(path, run_dir)})
    if not out:  # no @record: torchrun's summary names the first failure
        out = [_refine(log_dir, f) for f in _root_cause_from_summary(torchrun_tail)]
    if not out:  # no summary either (torchrun was stopped mid-way): the ranks' own words
        out = _from_stderr(log_dir)
    return sorted(out, key=lambda f: (f["timestamp"], f["local_rank"]))


def _refine(log_dir: str, failure: dict) -> dict:
    """The exception and its time from the rank's own stderr, when it wrote one."""
    if not failure["message"].startswith(_UNHELPFUL[:2]) and failure["message"]:
        return failure
    found = glob.glob(os.path.join(log_dir, "*", "attempt_*",
                                   str(failure["local_rank"]), "stderr.log"))
    traceback = _last_exception(found[0]) if found else None
    if traceback is None:  # no exception: an exit code, with the rank's last words
        said = _last_line(found[0]) if found else ""
        return {**failure, "message": f"{failure['message']}: {said}"} \
            if said and failure["message"].startswith(_UNHELPFUL[1]) else failure
    message, stamp = traceback
    # The traceback's write time, unless the file is stale (then it is not
    # this failure's): torchrun noticed the failure after it, within seconds.
    if stamp < failure["timestamp"] - 5:
        stamp = failure["timestamp"]
    return {**failure, "message": message, "timestamp": stamp}


def _from_stderr(log_dir: str) -> list[dict]:
    """Ranks that ended on an exception, from stderr alone (torchrun left nothing)."""
    out = []
    for path in glob.glob(os.path.join(log_dir, "*", "attempt_*", "*", "stderr.log")):
        traceback = _last_exception(path)
        if traceback is not None:
            out.append({"local_rank": int(os.path.basename(os.path.dirname(path))),
                        "message": traceback[0], "timestamp": traceback[1], "error_file": None})
    return out


def _last_exception(path: str) -> tuple[str, float] | None:
    """The last exception line of a rank's stderr, with the user's frame, and its write time."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - STDERR_TAIL))
            lines = [_RANK_PREFIX.sub("", line, count=1)
                     for line in fh.read().decode("utf-8", "replace").splitlines()]
        stamp = os.stat(path).st_mtime
    except OSError:
        return None
    exception = next((i for i in range(len(lines) - 1, -1, -1)
                      if _EXCEPTION_LINE.match(lines[i])), None)
    if exception is None:
        return None
    where = _user_frame(lines[:exception])
    message = lines[exception].strip()
    if where:
        message += f" ({where})"
    return message, stamp


def _last_line(path: str) -> str:
    """The last line a rank wrote to its stderr (argparse's, before exit 2), or ""."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.path.getsize(path) - STDERR_TAIL))
            lines = fh.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    said = [_RANK_PREFIX.sub("", line, count=1).strip() for line in lines]
    return next((line for line in reversed(said) if line), "")[-300:]


def _user_frame(traceback_lines: list[str]) -> str:
    """``train.py:42``: the innermost frame of the user's code (else any), or ""."""
    frames = [m for m in map(_FRAME_LINE.match, traceback_lines) if m]
    own = [m for m in frames if not re.search(r"/(site|dist)-packages/|/lib/python3", m.group(1))]
    where = (own or frames or [None])[-1]
    return f"{os.path.basename(where.group(1))}:{where.group(2)}" if where else ""


def _root_cause_from_summary(lines: list[str]) -> list[dict]:
    """The "Root Cause" block of torchrun's ChildFailedError summary, if printed."""
    try:
        start = max(i for i, line in enumerate(lines) if "Root Cause" in line)
    except ValueError:
        return []
    fields = {}
    for line in lines[start + 1:start + 12]:
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("time", "rank", "exitcode", "traceback"):
            fields[key.strip()] = value.strip()
    match = re.search(r"local_rank:\s*(\d+)", fields.get("rank", ""))
    if not match:
        return []
    try:
        stamp = int(time.mktime(time.strptime(fields.get("time", ""), "%Y-%m-%d_%H:%M:%S")))
    except ValueError:
        stamp = 0
    # Without @record the "traceback" is only a pointer to torch's docs: the
    # exit code says more (``restarts.will_recur`` reads a usage error's 2).
    traceback = fields.get("traceback", "")
    message = traceback if traceback and not traceback.startswith(_UNHELPFUL[0]) \
        else f"exitcode {(fields.get('exitcode') or '?').split()[0]}"  # "2 (pid: 123)"
    return [{"local_rank": int(match.group(1)), "message": message, "timestamp": stamp,
             "error_file": None}]
