"""``prune``'s rules for runs a node of which cannot be reached (issue #32
item 3), with a stand-in backend: no node is contacted."""

from __future__ import annotations

import time

import pytest

from conftest import run_cli
from orchestrator.backends.base import PruneResult
from orchestrator.controller import prune as prune_module
from orchestrator.controller.prune import prune_run
from orchestrator.records.outcome import RunState
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, find_run, write_state


class Unreachable:
    """Node 0 answers and frees its directory; node 1 cannot be reached."""

    def __init__(self, *_args):
        pass

    def prune(self, record):
        return [PruneResult(0, "a", freed=10),
                PruneResult(1, "b", error="unreachable: cannot resolve host name 'b'")]


def recorded(tmp_path, run_id: str, *, started: bool):
    run = RunDir.create(str(tmp_path), run_id)
    nodes = [NodeRecord(k, host, f"/w/runs/{run_id}/node-{k}", "python3")
             for k, host in ((0, "a"), (1, "b"))]
    if started:
        run.write_text("plan.json", "{}")
    write_state(run, run_id=run_id, backend="ssh", state=RunState.FAILED, started=time.time(),
                nodes=nodes, error="" if started else "connecting to the nodes failed")
    return find_run(str(tmp_path), run_id)


@pytest.fixture(autouse=True)
def no_nodes(monkeypatch):
    monkeypatch.setattr(prune_module, "backend_of", lambda *a, **k: Unreachable())


def test_a_run_that_started_is_kept_while_a_node_cannot_be_reached(tmp_path):
    pruned = prune_run(recorded(tmp_path, "ran", started=True), None)
    assert not pruned.removed and (tmp_path / "ran").exists()
    assert pruned.why_kept == ("kept for a later prune: node 1 (b): unreachable: cannot "
                               "resolve host name 'b'")


def test_a_run_refused_before_it_started_needs_none_of_its_nodes(tmp_path):
    """Its nodes were connecting when it was refused, and gave back what they
    had prepared: nothing of it can be on node 1."""
    pruned = prune_run(recorded(tmp_path, "refused", started=False), None)
    assert pruned.removed and not (tmp_path / "refused").exists()
    assert pruned.left == ()


def test_forget_unreachable_removes_it_here_and_names_what_stays(tmp_path):
    pruned = prune_run(recorded(tmp_path, "ran", started=True), None, forget_unreachable=True)
    assert pruned.removed and not (tmp_path / "ran").exists()
    assert pruned.left == ("node 1 (b): /w/runs/ran/node-1 left there (unreachable: cannot "
                           "resolve host name 'b')",)
    text = prune_module.render_pruned([pruned])
    assert "  not reached: node 1 (b): /w/runs/ran/node-1 left there" in text


def test_a_live_node_is_never_forgotten(tmp_path, monkeypatch):
    class Live(Unreachable):
        def prune(self, record):
            return [PruneResult(0, "a", error="the run is alive here", live=True)]

    monkeypatch.setattr(prune_module, "backend_of", lambda *a, **k: Live())
    pruned = prune_run(recorded(tmp_path, "live", started=False), None, forget_unreachable=True)
    assert not pruned.removed and pruned.why_kept.startswith("live on a node: ")


def test_one_unknown_id_does_not_stop_the_others(tmp_path):
    """`prune A B C` with B unknown: A and C are pruned, B is named, exit 1."""
    for run_id in ("first", "third"):
        run = RunDir.create(str(tmp_path), run_id)
        write_state(run, run_id=run_id, backend="local", state=RunState.SUCCEEDED,
                    started=time.time(), nodes=[])
    result = run_cli("prune", "first", "nosuch", "third", "--runs-dir", str(tmp_path))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "pruned first:" in result.stdout and "pruned third:" in result.stdout
    assert "kept   nosuch: no run matching 'nosuch'" in result.stdout
    assert not (tmp_path / "first").exists() and not (tmp_path / "third").exists()
