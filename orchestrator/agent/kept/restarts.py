"""When a failed attempt of a run is worth starting again (``--max-restarts``).

A gang restart costs a whole teardown and a new rendezvous, and pays off
only when the next attempt can get further: a crashed rank, an OOM-killed
process, a node that dropped out of NCCL. It cannot when the program
itself is wrong in a way the next attempt meets again at the same place.

The rule, stated once here and used by the head keeper: **no restart**
when

* the run was stopped on purpose (``down``, Ctrl-C, a signal), or
* a node was lost (its keeper is gone, so it cannot take part again), or
* processes of the failed attempt would not die on some node (``survivors``
  in its exit record, still there after the keeper waited for them): a next
  attempt would start on top of them, on GPUs they may still hold, or
* a node's ``setup:`` failed (``setup_failed`` in its exit record): setup
  runs once per run, so a restart would start torchrun on a node that is
  not set up, or
* a failing rank raised an error that will recur (``RECURRING``: an
  import or syntax error, a name that does not exist) or exited with a
  usage error (exit code 2, as ``argparse`` exits), **before any rank of
  that attempt reported its first step** (``workloads.contract.heartbeat``).
  After a step, the same exception is data- or state-dependent, and a
  restart from a checkpoint may get past it.

Stdlib only, like the rest of the agent package.
"""

from __future__ import annotations

import re

RECURRING = ("ImportError", "ModuleNotFoundError", "SyntaxError", "IndentationError",
             "NameError")
_RECURRING = re.compile(r"(?:^|[\s.:])(" + "|".join(RECURRING) + r")\b")
USAGE_EXIT = 2
_USAGE = re.compile(rf"exit ?code {USAGE_EXIT}(?::|$)")


def survivors_left(ended: dict[int, dict]) -> str:
    """Why not restart on top of what the last attempt left ("" if nothing
    was left): the first node whose exit record still lists survivors."""
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
    """Why restarting this attempt would fail the same way ("" if it would not).

    ``ended``: each node's supervisor exit event; ``stepped``: did any rank
    report a step in this attempt."""
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
