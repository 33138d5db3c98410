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
``(job id, signal)``.
"""

from __future__ import annotations

import os
import sys

from conftest import ROOT
from orchestrator.engine.options import LaunchOptions

# the out-of-tree test queue's backend and job state, its queue directory replaced by a script
sys.path.insert(0, os.path.join(ROOT, "tests", "plugins", "testqueue"))
from ddp_orch_testqueue import Backend, QueueState as FakeState  # noqa: E402


class FakeScheduler(Backend):
    def __init__(self, options: LaunchOptions | None = None, spec=None, *,
                 states: list | None = None, accounts: str = "", stops_the_rest: str = ""):
        super().__init__(options or LaunchOptions(), spec)
        self.states = list(states or [])
        self.accounts = accounts
        self.stops_the_rest = stops_the_rest
        self.asked: list[str] = []
        self.cancels: list[tuple[str, str | None]] = []

    def job_state(self, job_id: str) -> FakeState | None:
        self.asked.append(job_id)
        answer = self.states.pop(0) if len(self.states) > 1 else \
            (self.states[0] if self.states else None)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def cancel_job(self, job_id: str, signal: str | None = None) -> None:
        self.cancels.append((job_id, signal))

    def submit_job(self, plan, run, env) -> str:
        raise AssertionError("nothing is submitted in a unit test")

    def accounted(self, job_id: str) -> str:
        return self.accounts

    def check(self, plan):
        raise AssertionError("nothing is checked in a unit test")
