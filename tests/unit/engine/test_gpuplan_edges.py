"""The edges of the launch's GPUs on the controller's side
(``engine/gpuplan.py``) that ``test_gpuplan.py`` leaves open: a node's
answer checked field by field before it becomes the plan (it crossed the
network), torch's count at its bounds, and a refusal's words when waiting
could not help. Every case is a hand-made answer."""

from __future__ import annotations

import pytest

from orchestrator.engine import gpuplan
from orchestrator.engine.gpuplan import checked, torch_problem
from orchestrator.errors import ConfigError, TransportError

GOOD = {"ok": True, "chosen": [0, 1], "uuids": ["GPU-a", "GPU-b"], "models": ["H100", "H100"],
        "notes": ["a note"], "torch": {"ok": True, "count": 2}}
REFUSED = {"ok": False, "error": "GPU 1 is busy", "free": [0, 2], "reason": "busy"}


@pytest.mark.parametrize("reply", [
    GOOD, {"ok": True, "chosen": [0]}, {**GOOD, "uuids": [], "models": []},
    {**GOOD, "chosen": [1023, 0], "uuids": ["x" * 256, "y"]},
    {**GOOD, "chosen": list(range(1024)), "uuids": [], "models": [], "notes": []},
    REFUSED, {"ok": False, "error": ""}, {**REFUSED, "free": None},
    {**GOOD, "torch": {"ok": False, "error": "no torch"}},
])
def test_a_well_formed_answer_is_taken_as_it_is(reply):
    assert checked(reply, "gpu01") is reply


@pytest.mark.parametrize("reply", [
    None, [], "ok", {"chosen": [0]}, {"ok": 1, "chosen": [0]},
    {"ok": True}, {"ok": True, "chosen": []}, {"ok": True, "chosen": "0"},
    {"ok": True, "chosen": [True]}, {"ok": True, "chosen": [-1]}, {"ok": True, "chosen": [1024]},
    {"ok": True, "chosen": [0.0]}, {"ok": True, "chosen": [0, 0]},
    {"ok": True, "chosen": list(range(1025))},
    {**GOOD, "uuids": ["GPU-a"]}, {**GOOD, "models": ["H100", 7]}, {**GOOD, "uuids": "GPU-a"},
    {**GOOD, "uuids": ["x" * 257, "y"]}, {**GOOD, "notes": "a note"}, {**GOOD, "notes": [None]},
    {"ok": False}, {"ok": False, "error": 3}, {**REFUSED, "free": ["x" * 257]},
    {**REFUSED, "free": 5}, {**REFUSED, "free": "0,2"},  # was a TypeError, and taken
    {**GOOD, "torch": "yes"}, {**GOOD, "torch": {"count": "2"}}, {**REFUSED, "torch": []},
])
def test_a_malformed_answer_names_the_node_and_what_it_said(reply):
    with pytest.raises(TransportError) as refused:
        checked(reply, "gpu01")
    assert refused.value.host == "gpu01"
    assert str(refused.value).endswith(
        f"its agent's answer about its GPUs is malformed: {str(reply)[:200]}")


def test_the_malformed_answer_is_cut_to_200_characters():
    reply = {"ok": "x" * 500}
    with pytest.raises(TransportError) as refused:
        checked(reply, "gpu01")
    assert str(refused.value).endswith("malformed: " + str(reply)[:200])


# -- torch's count ------------------------------------------------------------------------------

def seen(**more) -> dict:
    return {"ok": True, "torch": "2.5", "cuda": "12.4", "available": True, **more}


def test_a_torch_with_no_count_sees_no_gpu_and_one_gpu_is_index_0():
    assert torch_problem(seen(), {"chosen": [0]}) == "its torch 2.5 (CUDA 12.4) sees no GPU"
    assert torch_problem(seen(count=1), {"chosen": [0]}) is None
    assert torch_problem(seen(count=1), {"chosen": [1]}) == (
        "its torch sees 1 GPU(s) (indices 0-0), and GPU 1 is not among them")
    assert torch_problem(seen(count=2), {"chosen": [0, 2, 3]}) == (
        "its torch sees 2 GPU(s) (indices 0-1), and GPU 2,3 is not among them")


def test_a_torch_that_cannot_use_its_gpus_says_why_where_it_knows():
    assert torch_problem(seen(available=False, count=4, why="cuInit: error 100"), {}) == (
        "its torch 2.5 (CUDA 12.4) sees no GPU: cuInit: error 100")
    assert torch_problem(seen(available=False, count=4, why=3), {}) == (
        "its torch 2.5 (CUDA 12.4) sees no GPU")


# -- waiting and refusing -------------------------------------------------------------------------

def test_a_wait_says_again_exactly_every_say_interval(monkeypatch):
    """Asked every 2 s, said every 4 s: at 0, 4 and 8 s (at exactly 4 s, not
    one ask later), and the last sleep is cut to the deadline, never longer."""
    now, slept, said = [1000.0], [], []
    monkeypatch.setattr(gpuplan.time, "monotonic", lambda: now[0])

    def sleep(s):
        slept.append(s)
        now[0] += s

    monkeypatch.setattr(gpuplan.time, "sleep", sleep)
    monkeypatch.setattr(gpuplan, "WAIT_POLL_S", 2.0)
    monkeypatch.setattr(gpuplan, "WAIT_SAY_S", 4.0)
    held = {"ok": False, "waitable": True, "error": "held"}
    got = gpuplan.wait_for_gpus(held, lambda: held, 9.0, said.append, "n")
    assert got is held and slept == [2.0, 2.0, 2.0, 2.0, 1.0]
    assert said == [f"n: waiting for its GPUs (none free): held; up to {s}s more"
                    for s in (9, 5, 1)]
    ok = {"ok": True, "chosen": [0]}
    assert gpuplan.wait_for_gpus(held, lambda: ok, 9.0, said.append, "n") is ok


def test_a_refusal_waiting_could_not_change_says_no_wait():
    from orchestrator.plan.build import build_plan
    from orchestrator.config.loader import load_cluster_text

    spec = load_cluster_text("nodes: [{host: a, gpus: [0]}]\nmaster: {addr: 10.0.0.1}\n"
                             "workload: {name: noop}\n", source="c.yaml")
    plan = build_plan(spec, run_id="r", local_run_dir="/runs/r")
    missing = {"ok": False, "waitable": False, "reason": "missing", "error": "no GPU 0"}
    with pytest.raises(ConfigError) as refused:
        gpuplan.refuse(plan, spec, {0: missing}, 60.0)
    assert refused.value.message == "node 0 (a): no GPU 0"
