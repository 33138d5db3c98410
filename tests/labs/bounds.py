"""The "gone within" bounds of docs/failures.md, measured on the run's own records.

Each node's supervisor records its teardown in ``supervisor.json``
(``stopped_at``: when a stop was asked for, ``reason``, ``torn_down_at``:
when nothing of the run was left there; wall clock), a guardian that had
to act in ``guardian.json``, node 0's keeper each loss in its attempts
(``lost_at``, ``heard_at``). A test takes the time of the fault with
``time.time()`` right before it injects it and compares: the event itself
is measured, not the wall clock around it, which a loaded 2-core machine
stretches (a controller's exit, a process scan). The labs' nodes are this
machine, so their records are files here.
"""

from __future__ import annotations

import json
import os

# "At once": a stop on EOF, a closed link, an exit event, on a loaded 2-core
# machine; well under every timeout it would otherwise fall back to (the
# controller's and the supervisors' 30 s of silence, the keepers' 10 s link
# timeout), so a test that holds it shows the fallback was not taken.
AT_ONCE_S = 5.0
# After the grace period: the SIGKILL, the reaping, the record.
MARGIN_S = 1.5
# torchrun ending a node's own ranks after one of them raised: the failing
# rank's interpreter exit (torch's teardown, seconds when the machine is busy
# importing torch elsewhere), torchrun's 0.1 s monitor, SIGTERM to the others.
# That is torchrun's, not ddp-orch's; well under the 30 s torchrun itself
# waits before SIGKILL, so a test that holds it shows nothing waited on that.
TORCHRUN_ENDS_S = 15.0


def node_dirs(runs_dir, run_id: str) -> list[str]:
    """Each node's run directory, as the run's record (state.json) names it."""
    with open(os.path.join(str(runs_dir), run_id, "state.json"), encoding="utf-8") as fh:
        return [node["run_dir"] for node in json.load(fh)["nodes"]]


def teardowns(runs_dir, run_id: str) -> list[dict]:
    """Each node's supervisor record of its teardown (``supervisor.json``)."""
    out = []
    for path in node_dirs(runs_dir, run_id):
        with open(os.path.join(path, "supervisor.json"), encoding="utf-8") as fh:
            out.append(json.load(fh))
    return out


def guardian_record(node_dir: str) -> dict | None:
    """What a node's guardian recorded of the teardown it did, if it did one."""
    try:
        with open(os.path.join(node_dir, "guardian.json"), encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None


def assert_stopped_at_once(record: dict, fault_at: float, reason: str) -> None:
    """A node asked to stop by ``reason`` at once after the fault."""
    assert record.get("torn_down_at"), f"no teardown recorded: {record}"
    assert record["reason"] == reason, record
    assert record["stopped_at"] - fault_at < AT_ONCE_S, (fault_at, record)


def assert_gone_within(records: list[dict], fault_at: float, grace_s: float,
                       stop_within: float = AT_ONCE_S) -> float:
    """Every node's teardown: a node asked to stop is torn down a grace
    period later; every node within ``stop_within`` (the stop; "at once"
    unless docs/failures.md says otherwise) and the grace period of the fault.
    Returns the seconds from the fault to nothing left, for the log."""
    for record in records:
        assert record.get("torn_down_at"), f"no teardown recorded: {record}"
        if record["stopped_at"] is not None:
            assert record["torn_down_at"] - record["stopped_at"] < grace_s + MARGIN_S, record
        assert record["torn_down_at"] - fault_at < stop_within + grace_s + MARGIN_S, \
            (fault_at, record)
    return max(r["torn_down_at"] for r in records) - fault_at
