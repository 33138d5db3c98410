"""The root cause of a gang's end (``records/outcome.gang_outcome``) where time
alone would name the wrong node: a peer-loss cascade stamped *before* the
failure that caused it (another host's clock behind, torchrun's whole-second
times), lost nodes, and interrupts. Each case's root cause is written out."""

from __future__ import annotations

import pytest

from orchestrator.records.outcome import (EndReason, NodeOutcome, NodeState, RunState,
                                          WorkerFailure, gang_outcome)

GLOO = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1"
NCCL = "torch.distributed.DistBackendError: NCCL communicator was aborted on rank 3"
RESET = "RuntimeError: Connection reset by peer"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
VALUE = "ValueError: bad batch at step 17"


def failed(k: int, *stamped: tuple[str, float], ended_at: float = 1000.0) -> NodeOutcome:
    return NodeOutcome(k, f"h{k}", NodeState.FAILED, 1, "torchrun exited 1", ended_at,
                       tuple(WorkerFailure(i, m, t)
                             for i, (m, t) in enumerate(stamped)), why=EndReason.FAILED)


def stopped(k: int) -> NodeOutcome:
    return NodeOutcome(k, f"h{k}", NodeState.STOPPED, 143, "stopped by the controller", 1000.0, why=EndReason.STOPPED)


def lost(k: int, heard_at: float) -> NodeOutcome:
    return NodeOutcome(k, f"h{k}", NodeState.LOST, None, "nothing from the node for 30s",
                       heard_at, why=EndReason.SILENT)


def root_of(*nodes: NodeOutcome, interrupted: bool = False) -> tuple[RunState, int | None]:
    outcome = gang_outcome("r", nodes, 1.0, interrupted=interrupted)
    return outcome.state, outcome.root_cause.node_rank if outcome.root_cause else None


@pytest.mark.parametrize("nodes, root", [
    # clock skew: node 1's clock is 3 s behind, so its cascade reads earlier
    ((failed(0, (OOM, 103.2)), failed(1, (GLOO, 100.0))), 0),
    ((failed(0, (GLOO, 100.0)), failed(1, (OOM, 103.2))), 1),
    # whole-second rounding: torchrun's time of a rank killed by a signal is
    # rounded down (50 for 50.9); the cascade it caused reads 50.3
    ((failed(0, (NCCL, 50.3)), failed(1, ("Signal 9 (SIGKILL) received by PID 7", 50))), 1),
    ((failed(0, (VALUE, 51)), failed(1, (RESET, 50.5)), failed(2, (GLOO, 50.9))), 0),
    # several cascades on one node, all earlier than the original
    ((failed(0, (GLOO, 10.0), (RESET, 10.1)), failed(1, (VALUE, 12.0))), 1),
    # one real failure among a node's cascades: that node is no cascade
    ((failed(0, (GLOO, 10.0), (VALUE, 10.5)), failed(1, (OOM, 11.0))), 0),
    # only cascades on record: then the earliest, then the lower rank
    ((failed(0, (GLOO, 10.0)), failed(1, (RESET, 9.0))), 1),
    ((failed(0, (GLOO, 9.0)), failed(1, (RESET, 9.0))), 0),
])
def test_an_original_failure_is_the_root_cause_even_after_its_cascades(nodes, root):
    assert root_of(*nodes) == (RunState.FAILED, root)


def test_a_lost_node_is_the_root_cause_before_the_cascades_it_caused():
    """Node 2 froze (last heard at 200); the others' ranks then failed with
    peer-loss errors stamped earlier by their clocks (150, 160)."""
    nodes = (failed(0, (GLOO, 150.0)), failed(1, (NCCL, 160.0)), lost(2, 200.0))
    assert root_of(*nodes) == (RunState.FAILED, 2)
    # a lost node with no time at all is still before a cascade
    assert root_of(failed(0, (GLOO, 1.0)), lost(1, None)) == (RunState.FAILED, 1)


def test_between_a_lost_node_and_an_original_failure_the_earlier_is_the_root_cause():
    assert root_of(failed(0, (OOM, 190.0)), lost(1, 200.0)) == (RunState.FAILED, 0)
    assert root_of(failed(0, (OOM, 210.0)), lost(1, 200.0)) == (RunState.FAILED, 1)


def test_an_interrupt_keeps_the_root_cause_and_says_interrupted():
    nodes = (failed(0, (GLOO, 5.0)), failed(1, (OOM, 6.0)), stopped(2))
    assert root_of(*nodes, interrupted=True) == (RunState.INTERRUPTED, 1)
    assert root_of(stopped(0), stopped(1), interrupted=True) == (RunState.INTERRUPTED, None)
    assert root_of(lost(0, 5.0), failed(1, (RESET, 1.0)), interrupted=True) == (
        RunState.INTERRUPTED, 0)


def test_stopped_nodes_are_never_the_root_cause():
    """Stopped nodes ended because of the others; a run with a stopped node
    and no failure still failed (someone else's teardown), with no root cause."""
    assert root_of(stopped(0), failed(1, (GLOO, 99.0))) == (RunState.FAILED, 1)
    assert root_of(stopped(0), NodeOutcome(1, "h1", NodeState.SUCCEEDED, 0, "exited 0", 5.0, why=EndReason.EXITED)) \
        == (RunState.FAILED, None)
