"""When a failed attempt of a run is worth starting again (``--max-restarts``).

A restart costs a teardown and a new rendezvous, and pays off only when the
next attempt can get further. **No restart** when the run was stopped on
purpose; a node was lost; processes of the attempt would not die (a restart
would start on top of them, on GPUs they may hold); a node's ``setup:``
failed (it runs once per run); or a rank failed with an error that recurs
(``RECURRING``, argparse's exit 2) **before any rank's first step**: after
one, the error may depend on the data, and a restart may get past it.
"""

from __future__ import annotations

import re

RECURRING = ("ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
             "NameError")
_RECURRING = re.compile(r"(?:^|[\s.:])(" + "|".join(RECURRING) + r")\b")
USAGE_EXIT = 2
_USAGE = re.compile(rf"exit ?code {USAGE_EXIT}(?::|$)")


def survivors_left(ended: dict[int, dict]) -> str:
    """Why not restart on top of what the last attempt left ("" if nothing)."""
    for node_rank in sorted(ended):
        left = [s for s in ended[node_rank].get("survivors") or () if isinstance(s, dict)]
        if left:
            shown = ", ".join(f"pid {s.get('pid')} ({str(s.get('cmd', ''))[:80]})"
                              for s in left[:3])
            return (f"node {node_rank}: {len(left)} process(es) of the attempt would not die "
                    f"({shown}); a restart would start on top of them")
    return ""


def setup_failed(ended: dict[int, dict]) -> str:
    """Why not restart after a failed ``setup:`` ("" if none failed)."""
    for node_rank in sorted(ended):
        if ended[node_rank].get("setup_failed"):
            return (f"node {node_rank}'s setup failed; setup runs once per run, so a restart "
                    f"would start on a node that is not set up")
    return ""


def will_recur(ended: dict[int, dict], stepped: bool) -> str:
    """Why restarting this attempt would fail the same way ("" if it would
    not); ``stepped``: did any rank report a step in it."""
    if stepped:
        return ""
    for node_rank in sorted(ended):
        for failure in ended[node_rank].get("failures") or ():
            message = str(failure.get("message", ""))
            found = _RECURRING.search(message)
            if found:
                return (f"node {node_rank} failed with {found.group(1)} before the first step, "
                        f"which a restart meets again")
            if _USAGE.match(message.strip()):  # "exitcode 2", maybe with the rank's last words
                return (f"node {node_rank} exited with a usage error (exit {USAGE_EXIT}) before "
                        f"the first step, which a restart meets again")
    return ""
