"""A scheduler of the test's own for unit tests of the scheduler base
(``backends/scheduler/``): the out-of-tree test queue's backend
(``tests/plugins/testqueue``, placement ``TestQueue``) with what a backend
fills in (``job_state``, ``cancel_job``, ``submit_job``, ``accounted``)
answered from a script the test writes instead of a queue directory, so
the shared part (the queue wait, ``describe``, ``explain``, the early end)
is tested without a scheduler, as any scheduler would use it.

``FakeScheduler(states=[...])`` answers ``job_state`` with each state
(``FakeState``: the test queue's ``QueueState``, whose hosts are its
comma-separated ``nodelist``; None: no longer listed) in turn and repeats
the last; an ``OrchestratorError`` in the list is raised instead (the
scheduler cannot be asked). Each cancel is recorded in ``cancels`` as
``(job id, signal)``, and lists the job as cancelled from then on; a
submission is job 7, its plan, run and environment kept in ``submitted``;
``check`` finds ``problems`` (none: one row that passes); ``job_output``
is ``output``; ``asked`` records each question with its arguments (the
job's state, its accounts, its output, a check) and ``stacks_asked`` each
stack dump.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types

from conftest import ROOT
from orchestrator.engine.options import LaunchOptions
from orchestrator.engine.preflight import CheckResult, Preflight


def _testqueue():
    """The out-of-tree test queue's module, loaded from its file: not put on
    sys.path, where its dist-info would make it an installed plugin backend
    for every test after (``config.limits.plugins``)."""
    path = os.path.join(ROOT, "tests", "plugins", "testqueue", "ddp_orch_testqueue",
                        "__init__.py")
    spec = importlib.util.spec_from_file_location("fakesched_testqueue", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


# its backend and job state, its queue directory replaced by a script
_queue = _testqueue()
Backend, FakeState = _queue.Backend, _queue.QueueState


class FakeScheduler(Backend):
    def __init__(self, options: LaunchOptions | None = None, spec=None, *,
                 states: list | None = None, accounts: str = "", stops_the_rest: str = "",
                 problems: tuple[CheckResult, ...] = (), output: str = ""):
        super().__init__(options or LaunchOptions(), spec)
        self.states = list(states or [])
        self.accounts = accounts
        self.stops_the_rest = stops_the_rest
        self.problems = problems
        self.output = output
        self.submitted: list[tuple] = []
        self.cancels: list[tuple[str, str | None]] = []
        self.stacks_asked: list[tuple] = []
        self.asked: list[tuple] = []  # (what, its arguments) of every other question

    def job_state(self, job_id: str) -> FakeState | None:
        self.asked.append(("state", job_id))
        answer = self.states.pop(0) if len(self.states) > 1 else \
            (self.states[0] if self.states else None)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def cancel_job(self, job_id: str, signal: str | None = None) -> None:
        """As a scheduler's cancel: the job is listed as cancelled from now on."""
        self.cancels.append((job_id, signal))
        self.states = [FakeState("CANCELLED")]

    def submit_job(self, plan, run, env) -> str:
        self.submitted.append((plan, run, env))
        return "7"

    def accounted(self, job_id: str) -> str:
        self.asked.append(("accounted", job_id))
        return self.accounts

    def job_output(self, job_id: str, run) -> str:
        self.asked.append(("output", job_id, run))
        return self.output

    def job_stacks(self, job_id, nodes, run_id, native=False):
        self.stacks_asked.append((job_id, tuple(nodes), run_id, native))
        return "stacks"

    def check(self, plan) -> Preflight:
        self.asked.append(("check", plan))
        return Preflight(self.problems or (CheckResult(-1, "*", "queue", True, "fine"),))


class Clock:
    """``time`` for the scheduler modules (``fake_time``): ``sleep`` moves
    ``monotonic`` by exactly the seconds slept (to the nanosecond: ten
    looks of 0.1 s are 1.0 s) and runs ``on_sleep`` (a job's state asked
    again, say), so a 120 s give-up passes at once."""

    def __init__(self):
        self.now = 1000.0
        self.on_sleep = lambda: None

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now = round(self.now + seconds, 9)
        self.on_sleep()


def fake_time(monkeypatch, *modules) -> Clock:
    """One ``Clock`` as the ``time`` of each of ``modules``."""
    clock = Clock()
    for module in modules:
        monkeypatch.setattr(module, "time", types.SimpleNamespace(monotonic=clock.monotonic,
                                                                  sleep=clock.sleep))
    return clock
