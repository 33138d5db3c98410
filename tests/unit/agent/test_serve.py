"""The agent's request loop (``agent/wire/serve.py``) as a session: what one
channel's requests share lives in its ``Session``, not in the module, so
that every ``gpus`` reply after ``torch``, the ones that end a wait
included, carries the node torch's answer (the launch decides
``device: auto`` on the last of them)."""

from __future__ import annotations

import pytest

from orchestrator.agent.node import gpuclaim
from orchestrator.agent.wire import serve

GPUS = {"op": "gpus", "want": [0], "run_id": "r1", "node_rank": 0, "busy_mib": 1024}


class FakeProbe:
    """A torch probe that counts how often it is read."""

    made = 0

    def __init__(self) -> None:
        FakeProbe.made += 1
        self.reads = 0

    def result(self) -> dict:
        self.reads += 1
        return {"ok": True, "torch": "2.14.1+cpu", "cuda": None, "available": False,
                "reads": self.reads}


@pytest.fixture
def replies(monkeypatch):
    """Every reply the handlers make, as the fields they carry; ``gpus``
    answers a refusal that waiting could clear, then yes."""
    said: list[dict] = []
    answers = iter([{"ok": False, "reason": "busy", "waitable": True, "error": "busy", "free": []},
                    {"ok": False, "reason": "busy", "waitable": True, "error": "busy", "free": []},
                    {"ok": True, "chosen": [0], "gpus": []}])
    monkeypatch.setattr(serve, "reply", lambda payload=b"", **fields: said.append(fields))
    monkeypatch.setattr(gpuclaim, "TorchProbe", FakeProbe)
    monkeypatch.setattr(gpuclaim, "claim", lambda *a, **kw: next(answers))
    FakeProbe.made = 0
    return said


def test_every_gpus_reply_after_torch_carries_its_answer_read_once(replies):
    session = serve.Session()
    serve.ANSWERS["torch"](session, {"op": "torch"}, None)
    for _ in range(3):  # the first answer, a wait's look, the answer that ends it
        serve.ANSWERS["gpus"](session, dict(GPUS), None)
    gpus = replies[1:]
    assert [r["ok"] for r in gpus] == [False, False, True]
    assert [r.get("torch", {}).get("reads") for r in gpus] == [1, 1, 1]  # asked once, kept
    assert FakeProbe.made == 1


def test_without_torch_no_gpus_reply_carries_one_and_sessions_share_nothing(replies):
    asked, other = serve.Session(), serve.Session()
    serve.ANSWERS["torch"](asked, {"op": "torch"}, None)
    serve.ANSWERS["gpus"](other, dict(GPUS), None)
    assert "torch" not in replies[-1]
    assert asked.torch_answer()["ok"] and other.torch_answer() is None


def test_the_module_keeps_no_state_of_a_channel():
    """Nothing a request changes lives at module level (a second channel, a
    test, would see it): only constants, functions, classes and the lock."""
    import types

    from orchestrator.agent.wire import protocol

    mutable = {name: type(value).__name__ for name, value in vars(serve).items()
               if not name.startswith("__") and isinstance(value, (list, dict, set))
               and name != "ANSWERS" and value is not getattr(protocol, name, None)}
    assert mutable == {}
    assert all(isinstance(fn, types.FunctionType) for fn in serve.ANSWERS.values())


def test_no_agent_module_keeps_mutable_state_of_its_own():
    """Ports and GPU locks held for a run live in a ``Holdings`` a session,
    a Slurm node or a keeper owns, never in a module: a module-level list
    was how one session's hold leaked into the next (``--wait-gpus``).
    A module may keep declared tables (UPPER_CASE), nothing else mutable.
    (``agent/worker`` is not the agent: it runs in the user's ranks, where
    ``ddp_orch_progress.step`` is a function the training loop calls.)"""
    import importlib
    import pkgutil

    import orchestrator.agent as agent

    found = []
    for info in pkgutil.walk_packages(agent.__path__, "orchestrator.agent."):
        if info.name.startswith("orchestrator.agent.worker"):
            continue
        module = importlib.import_module(info.name)
        found += [f"{info.name}.{name}" for name, value in vars(module).items()
                  if isinstance(value, (list, dict, set)) and not name.startswith("__")
                  and not name.isupper() and getattr(value, "__module__", None) is None
                  and not any(value is vars(other).get(name) for other in _imported(module))]
    assert found == [], "keep it in a Holdings or a Session, not in the module"


def _imported(module) -> list:
    """The modules ``module`` took names from (a table imported is its owner's)."""
    import sys

    return [m for n, m in sys.modules.items()
            if n.startswith("orchestrator.agent") and m is not module]
