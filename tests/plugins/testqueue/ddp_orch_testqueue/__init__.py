"""``testqueue``: a scheduler backend for ddp-orch that lives outside its tree.

It is the proof that a site can add its scheduler without forking: a
distribution on ``PYTHONPATH`` (not installed into the venv) whose entry
point in the ``ddp_orch.backends`` group names ``Backend``, which fills in
ddp-orch's scheduler base (``orchestrator.backends.scheduler``) with the
few methods a scheduler has: submit, state, cancel, placement variables.

The "scheduler" is a queue in a directory (``$TESTQUEUE_DIR``): a job is a
sub-directory, and a runner process (``runner.py``) per job holds it while
a ``hold`` file is there (PENDING: the plugin's own cluster-file block,
``block.py``, says ``testqueue: {hold: true}``), then starts one task per node on this
machine, each running the node agent with its placement variables set
(RUNNING), and records how it ended. A ``cancel`` file is its scancel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

from orchestrator.agent.node.jobfile import Placement
from orchestrator.backends.base import Capabilities
from orchestrator.backends.scheduler.backend import SchedulerBackend, agent_argv, job_dir
from orchestrator.engine.preflight import CheckResult, Preflight

QUEUE_ENV = "TESTQUEUE_DIR"  # where the queue keeps its jobs


@dataclasses.dataclass(frozen=True)
class QueueState:
    """A job as the queue lists it (``state.json`` in its directory)."""

    state: str
    reason: str = ""
    nodelist: str = ""

    @property
    def queued(self) -> bool:
        return self.state == "PENDING"

    @property
    def running(self) -> bool:
        return self.state == "RUNNING"

    @property
    def ended(self) -> bool:
        return self.state in ("COMPLETED", "FAILED", "CANCELLED")

    @property
    def cancelled(self) -> bool:
        return self.state == "CANCELLED"

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(self.nodelist.split(",")) if self.nodelist else ()


class Backend(SchedulerBackend):
    name = "testqueue"
    interface = 2  # the ddp-orch backend interface this was built for
    can = Capabilities(scheduler=True, scheduler_does="the test queue keeps the job",
                       queue=True, queue_wait="how long a job may wait in the test queue",
                       restarts=False,
                       instead_of_restarts="the test queue reruns nothing; submit again")
    placement = Placement(scheduler="TestQueue", node_name="TESTQUEUE_NODENAME",
                          node_index="TESTQUEUE_NODEID", gpus="TESTQUEUE_GPUS",
                          whole_node="a node of your own")
    job_key = "testqueue_job"

    def submit_job(self, plan, run, env):
        queue = _queue_dir()
        os.makedirs(queue, exist_ok=True)
        number = 1
        while True:  # the next free job number; mkdir is the lock
            try:
                os.mkdir(os.path.join(queue, str(number)))
                break
            except FileExistsError:
                number += 1
        job = os.path.join(queue, str(number))
        with open(os.path.join(job, "job.json"), "w", encoding="utf-8") as fh:
            json.dump({"argv": agent_argv(plan), "hosts": [n.host for n in plan.nodes],
                       "cwd": job_dir(plan), "placement": dataclasses.asdict(self.placement)},
                      fh)
        # the plugin's own block of the cluster file (``block.py``): testqueue: {hold: true}
        hold = self.spec is not None and self.spec.block("testqueue").hold
        if hold:
            open(os.path.join(job, "hold"), "w").close()
        _write_state(job, {"state": "PENDING", "reason": "Held" if hold else "Priority"})
        with open(os.path.join(job, "runner.log"), "wb") as log:
            subprocess.Popen([sys.executable, "-m", "ddp_orch_testqueue.runner", job],
                             env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        return str(number)

    def job_state(self, job_id):
        try:
            with open(os.path.join(_queue_dir(), job_id, "state.json"), encoding="utf-8") as fh:
                return QueueState(**json.load(fh))
        except FileNotFoundError:
            return None  # the queue forgot it

    def cancel_job(self, job_id, signal=None):
        job = os.path.join(_queue_dir(), job_id)
        if os.path.isdir(job):
            with open(os.path.join(job, "cancel"), "w", encoding="utf-8") as fh:
                fh.write(signal or "TERM")

    def check(self, plan):
        queue = os.environ.get(QUEUE_ENV)
        ok = bool(queue)
        return Preflight((CheckResult(-1, "localhost", "queue", ok,
                                      f"{QUEUE_ENV}={queue}" if ok else f"set {QUEUE_ENV}"),))


def _queue_dir() -> str:
    queue = os.environ.get(QUEUE_ENV)
    if not queue:
        raise RuntimeError(f"{QUEUE_ENV} is not set")
    return queue


def _write_state(job: str, state: dict) -> None:
    path = os.path.join(job, "state.json")
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(path + ".tmp", path)
