"""The scheduler base (``backends/scheduler/backend.py``) with a scheduler
of the test's own (``labs/fakesched.py``): what every scheduler backend
shares, tested as any of them would use it and without one. The queue
wait, the rendezvous, the early end, the settle and the close of a job;
``describe`` of a job (listed, no longer listed, and its agents' records);
the dry-run's words; ``cancel``, ``reconnect`` and ``stacks``.

Time is a fake clock in both modules (``clock``), so a 120 s give-up or a
cancel's wait passes at once. Each expected value is worked out by hand."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import tempfile
import threading
from pathlib import Path

import pytest

from fakesched import Clock, FakeScheduler, FakeState, fake_time
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.backends.base import CancelResult
from orchestrator.backends.scheduler import backend as sched
from orchestrator.backends.scheduler import job as jobmod
from orchestrator.backends.scheduler.job import Job
from orchestrator.config.loader import load_cluster_text
from orchestrator.console import Console
from orchestrator.engine.options import LaunchOptions
from orchestrator.engine.preflight import CheckResult
from orchestrator.errors import LaunchError, OrchestratorError
from orchestrator.plan.dryrun import ByHand
from orchestrator.plan.render import dryrun_to_dict
from orchestrator.records.outcome import (EndReason, NodeOutcome, NodeState, RunOutcome,
                                          RunState, WorkerFailure)
from orchestrator.records.rundir import RunDir
from orchestrator.records.store import NodeRecord, RunRecord

PINNED = "nodes: [{host: n0, procs: 1}, {host: n1, procs: 1}]\nworkload: {name: noop}\n"
PLACED = "nodes: {count: 2, procs: 1}\nworkload: {name: noop}\n"
RUNNING, PENDING = FakeState("RUNNING", nodelist="c1,c2"), FakeState("PENDING", "Priority")
DONE, CANCELLED = FakeState("COMPLETED"), FakeState("CANCELLED")


@pytest.fixture
def clock(monkeypatch) -> Clock:
    return fake_time(monkeypatch, sched, jobmod)


def job_of(text: str, tmp_path, options: LaunchOptions | None = None, base_dir: str = ".",
           **fake):
    """The backend, its run directory and resolved-so-far dry-run for ``text``."""
    spec = load_cluster_text(text, source="c.yaml", base_dir=base_dir)
    backend = FakeScheduler(options, spec, **fake)
    run = RunDir.create(tempfile.mkdtemp(dir=tmp_path), "r")
    return backend, run, backend.dryrun(backend.plan("r", run.path))


class Stubborn(FakeScheduler):
    """A scheduler whose cancel is taken but does not end the job."""

    def cancel_job(self, job_id, signal=None):
        self.cancels.append((job_id, signal))


def console() -> Console:
    return Console("all", stream=io.StringIO())


def said(out: Console) -> list[str]:
    out.close()  # all written
    return out.stream.getvalue().splitlines()


# -- the job's files and words (pure) -------------------------------------------------------

def test_each_task_runs_node_0s_python_isolated_on_the_agent_zipapp_and_the_job_file(tmp_path):
    backend, run, info = job_of(PINNED, tmp_path)
    assert sched.job_dir(info.plan) == run.path
    assert sched.agent_argv(info.plan) == [info.plan.nodes[0].python, "-I", "-S",
                                           f"{run.path}/agent.pyz", "job",
                                           f"{run.path}/job.json"]


def test_the_dry_run_says_where_each_task_runs_and_who_picks_the_hosts(tmp_path):
    backend, run, pinned = job_of(PINNED, tmp_path)
    assert [n.where for n in pinned.nodes] == ["TestQueue task on node n0",
                                               "TestQueue task on node n1"]
    assert not any("chosen by" in note for note in pinned.notes)
    assert (pinned.backend, pinned.owner) == ("testqueue", Owner(Holder.SCHEDULER))
    assert pinned.plan.master_addr == "<testqueue node 0>"
    backend, run, placed = job_of(PLACED, tmp_path)
    assert [n.where for n in placed.nodes] == ["TestQueue task on the allocation's node 0",
                                               "TestQueue task on the allocation's node 1"]
    assert "hosts      chosen by TestQueue when the job starts" in placed.notes
    # until node 0 picks it, the free port is a placeholder in every node's argv
    assert all("<free port on testqueue node 0>" in n.argv for n in placed.nodes)
    assert placed.plan.master_port == "auto" and placed.extras == {}


def test_each_node_launch_carries_the_setup_and_the_dry_run_its_source(tmp_path):
    text = PINNED + ("setup: {commands: ['pip install -r r.txt'], when_changed: [r.txt]}\n"
                     "setup_timeout: 90\n")
    backend, run, info = job_of(text, tmp_path)
    assert [(n.setup, n.setup_timeout_s, n.setup_when_changed) for n in info.nodes] == \
        [(info.plan.setup, 90.0, info.plan.setup_when_changed)] * 2
    assert info.plan.setup and info.plan.setup_when_changed and info.source == "c.yaml"


def test_a_script_that_would_not_reach_the_nodes_is_refused_at_its_files_line(tmp_path):
    from orchestrator.errors import ConfigError

    (tmp_path / ".secret.py").write_text("")
    spec = load_cluster_text(PINNED.replace("{name: noop}", "{script: .secret.py}"),
                             source="c.yaml", base_dir=str(tmp_path))
    backend = FakeScheduler(None, spec)
    with pytest.raises(ConfigError) as refused:
        backend.dryrun(backend.plan("r", str(tmp_path / "runs" / "r")))
    assert (refused.value.source, refused.value.path) == ("c.yaml", "workload.script")
    plan = backend.plan("r", str(tmp_path / "runs" / "r"))
    with pytest.raises(LaunchError, match="needs a cluster file"):
        FakeScheduler().dryrun(dataclasses.replace(plan, code=None))


def test_the_placed_note_is_the_schedulers_for_this_plan(tmp_path):
    class Noting(FakeScheduler):
        def placed_note(self, plan):
            return f"hosts      {len(plan.nodes)} chosen by TestQueue"

    spec = load_cluster_text(PLACED, source="c.yaml")
    backend = Noting(None, spec)
    info = backend.dryrun(backend.plan("r", str(tmp_path / "r")))
    assert "hosts      2 chosen by TestQueue" in info.notes


def test_a_single_node_jobs_directory_and_agent_are_its_own_and_node_0s_python(tmp_path):
    backend, run, info = job_of("nodes: [{host: n0, procs: 1, python: /opt/a/python}]\n"
                                "workload: {name: noop}\n", tmp_path)
    assert sched.job_dir(info.plan) == run.path
    backend, run, info = job_of("nodes: [{host: n0, procs: 1, python: /opt/a/python}, "
                                "{host: n1, procs: 1, python: /opt/b/python}]\n"
                                "workload: {name: noop}\n", tmp_path)
    assert sched.agent_argv(info.plan)[0] == "/opt/a/python"


def test_what_a_scheduler_need_not_fill_in():
    backend = FakeScheduler()
    assert (backend.job_extras(None), backend.by_hand(None)) == ({}, ByHand())
    assert sched.SchedulerBackend.job_output(backend, "7", None) == ""
    assert sched.SchedulerBackend.accounted(backend, "7") == ""
    with pytest.raises(LaunchError, match="^the testqueue backend cannot dump a running job's "
                                          "stacks$"):
        sched.SchedulerBackend.job_stacks(backend, "7", (), "r")


# -- submit ---------------------------------------------------------------------------------------

def test_a_job_that_cannot_run_as_planned_is_not_submitted(tmp_path):
    problems = (CheckResult(-1, "*", "queue", True, "fine"),
                CheckResult(1, "n1", "python", False, "python3 not found"),
                CheckResult(0, "n0", "shared dir", False, "not shared"))
    backend, run, info = job_of(PINNED, tmp_path, problems=problems)
    with pytest.raises(LaunchError) as refused:
        backend.submit(info, run, console())
    assert str(refused.value) == ("the job cannot run as planned; nothing was submitted:\n"
                                  "  n1: python: python3 not found\n"
                                  "  n0: shared dir: not shared")
    assert backend.submitted == [] and not os.path.exists(run.file("job.json"))


def test_a_submitted_job_is_pending_with_its_id_on_record(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path)
    out = console()
    handle = backend.submit(info, run, out)
    assert said(out) == [f"ddp-orch: submitted TestQueue job 7; run directory {run.path}"]
    assert handle.pending and handle.streams == {} and handle.channels == {}
    assert handle.job.job_id == "7" and handle.started == 1000.0
    assert [r.connection for r in handle.records] == [{"testqueue_job": "7"}] * 2
    assert handle.run is run and handle.backend is backend
    (plan, where, env), = backend.submitted
    assert (plan, where, env["DDP_ORCH_RUN"]) == (info.plan, run, "r")  # the run's own marker
    assert backend.asked == [("check", info.plan)]  # not the job's state: the engine's to ask
    job = json.loads(open(run.file("job.json"), encoding="utf-8").read())
    assert [n["host"] for n in job["nodes"]] == ["n0", "n1"]
    assert [n["spec"]["bundle"] for n in job["nodes"]] == [run.file("bundle.tar.gz")] * 2
    assert [n["spec"]["master_port"] for n in job["nodes"]] == [0, 0]  # node 0 publishes it
    assert open(run.file("job.id"), encoding="utf-8").read() == "7\n"
    assert (job["run_id"], job["master_addr"], job["master_port"]) == ("r", None, None)
    handle.close(left=True)


def test_a_master_the_file_names_goes_in_the_job_file(tmp_path):
    backend, run, info = job_of(PINNED + "master: {addr: 10.0.0.1, port: 29500}\n", tmp_path)
    backend.write_job(info, run)
    job = json.loads(open(run.file("job.json"), encoding="utf-8").read())
    assert (job["master_addr"], job["master_port"]) == ("10.0.0.1", 29500)
    assert all("29500" in n.argv and "<free port" not in " ".join(n.argv) for n in info.nodes)


def test_the_bundle_carries_the_cluster_file_with_its_secrets_masked(tmp_path):
    """The cluster file in the code directory goes as its stand-in, never
    with the secret it holds."""
    import tarfile

    (tmp_path / "train.py").write_text("")
    text = f"nodes: [{{host: n0, procs: 1}}]\nworkload: {{script: train.py}}\nenv: {{HF_TOKEN: {SECRET}}}\n"
    (tmp_path / "c.yaml").write_text(text)
    spec = load_cluster_text(text, source=str(tmp_path / "c.yaml"), base_dir=str(tmp_path))
    backend = FakeScheduler(None, spec)
    run = RunDir.create(tempfile.mkdtemp(dir=tmp_path), "r")
    info = backend.dryrun(backend.plan("r", run.path))
    backend.write_job(info, run)
    with tarfile.open(run.file("bundle.tar.gz")) as tar:
        carried = tar.extractfile("project/c.yaml").read().decode()
    assert SECRET not in carried and "HF_TOKEN" in carried


def test_ctrl_c_as_the_scheduler_takes_the_job_waits_for_its_id_then_cancels_it(tmp_path,
                                                                                 clock):
    """The id is written beside the run (``job.id``) and the job cancelled
    before the KeyboardInterrupt goes on: nothing stays queued unknown."""

    class Interrupted(FakeScheduler):
        def submit_job(self, plan, run, env):
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C while the scheduler answers
            return super().submit_job(plan, run, env)

    backend = Interrupted(None, load_cluster_text(PINNED, source="c.yaml"), states=[RUNNING])
    run = RunDir.create(tempfile.mkdtemp(dir=tmp_path), "r")
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        backend.submit(backend.dryrun(backend.plan("r", run.path)), run, console())
    assert open(run.file("job.id"), encoding="utf-8").read() == "7\n"
    assert backend.cancels == [("7", None)]
    assert signal.getsignal(signal.SIGINT) is before


def test_held_interrupts_are_sigint_and_sigterm_and_only_on_the_main_thread():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with sched.interrupts_held() as held:
        assert signal.getsignal(signal.SIGINT) is not before[signal.SIGINT]
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # as a SIGTERM: held
    assert held.caught == [signal.SIGTERM]
    with pytest.raises(KeyboardInterrupt):
        held.raise_if_interrupted()
    assert {sig: signal.getsignal(sig) for sig in before} == before
    quiet = sched.interrupts_held()
    with quiet:
        pass
    quiet.raise_if_interrupted()  # nothing caught: nothing raised
    off_main = []

    def elsewhere():
        with sched.interrupts_held() as held:
            off_main.append((held._previous, signal.getsignal(signal.SIGINT)))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert off_main == [({}, before[signal.SIGINT])]


# -- the queue --------------------------------------------------------------------------------------

def queued_job(backend: FakeScheduler, clock: Clock) -> Job:
    job = Job("7", backend, poll=False)
    clock.on_sleep = job.refresh  # the poller's work, at each of the wait's looks
    return job


def test_the_wait_in_the_queue_says_each_new_reason_once_and_ends_when_it_runs(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, states=[
        PENDING, PENDING, FakeState("PENDING", "Resources"), FakeState("PENDING"), RUNNING])
    out = console()
    assert backend.await_running(queued_job(backend, clock), out) == ""
    assert said(out) == ["ddp-orch: TestQueue job 7 pending (Priority)",
                         "ddp-orch: TestQueue job 7 pending (Resources)",
                         "ddp-orch: TestQueue job 7 pending"]


def test_a_job_gone_from_the_queue_ends_the_wait_for_its_streams_to_tell(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, states=[PENDING, None])
    assert backend.await_running(queued_job(backend, clock), console()) == ""


def test_a_job_still_queued_after_the_queue_timeout_is_cancelled(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(queue_timeout_s=1.0),
                                states=[PENDING])
    out = console()
    job = queued_job(backend, clock)
    assert backend.await_running(job, out) == (
        "the TestQueue job was still queued after the queue timeout of 1s (Priority); it was "
        "cancelled and never ran")
    assert said(out)[-1] == ("ddp-orch: TestQueue job 7 still queued after 1s (Priority); "
                             "cancelling it")
    assert backend.cancels == [("7", None)] and job.ended
    # looks every 0.2 s: at 1001.0 the timeout is not past yet; at 1001.2 it is, and the
    # cancel shows at the wait's first look, at once
    assert clock.now == 1001.2


def test_a_job_a_cancel_does_not_end_is_waited_for_30s_more(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(queue_timeout_s=1.0),
                                states=[PENDING])
    backend.__class__ = Stubborn
    assert backend.await_running(queued_job(backend, clock), console()).startswith(
        "the TestQueue job was still queued after the queue timeout of 1s")
    assert clock.now == 1031.2


def test_a_job_queued_without_a_reason_times_out_without_one(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(queue_timeout_s=0.5),
                                states=[FakeState("PENDING")])
    out = console()
    assert backend.await_running(queued_job(backend, clock), out).startswith(
        "the TestQueue job was still queued after the queue timeout of 0.5s; it was")
    assert said(out)[-1] == "ddp-orch: TestQueue job 7 still queued after 0.5s; cancelling it"


def test_a_scheduler_that_cannot_be_asked_for_120s_is_given_up(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path,
                                states=[OrchestratorError("squeue: timed out")])
    job = queued_job(backend, clock)
    with pytest.raises(LaunchError, match=r"^cannot follow TestQueue job 7 for 120s: "
                                          r"squeue: timed out$"):
        backend.await_running(job, console())
    # failing since the first look (1000.2): 120 s at 1120.2 is not over 120 s yet
    assert clock.now == 1120.4


# -- the rendezvous ---------------------------------------------------------------------------------

def publish(run: RunDir, text: str) -> None:
    with open(run.file("rendezvous.json"), "w", encoding="utf-8") as fh:
        fh.write(text)


def test_node_0s_rendezvous_fills_in_the_master_and_the_allocation_the_hosts(tmp_path, clock):
    backend, run, info = job_of(PLACED, tmp_path, states=[RUNNING])
    publish(run, '{"addr": "10.0.0.5", "port": "29511"}')
    resolved = backend.resolve(info, Job("7", backend, poll=False))
    plan = resolved.plan
    assert (plan.master_addr, plan.master_port) == ("10.0.0.5", 29511)
    assert [n.host for n in plan.nodes] == ["c1", "c2"]
    assert [n.where for n in resolved.nodes] == ["TestQueue task on node c1",
                                                 "TestQueue task on node c2"]


def test_a_master_the_file_names_is_kept_and_pinned_hosts_are_not_asked(tmp_path, clock):
    backend, run, info = job_of(PINNED + "master: {addr: 10.0.0.1}\n", tmp_path, states=[])
    publish(run, '{"addr": "10.0.0.5", "port": 29511}')
    plan = backend.resolve(info, Job("7", backend, poll=False)).plan
    assert (plan.master_addr, plan.master_port) == ("10.0.0.1", 29511)
    assert [n.host for n in plan.nodes] == ["n0", "n1"]


def test_no_rendezvous_when_the_allocation_has_no_hosts_or_the_job_ends_first(tmp_path, clock):
    backend, run, info = job_of(PLACED, tmp_path, states=[FakeState("RUNNING")])
    publish(run, '{"addr": "10.0.0.5", "port": 29511}')
    assert backend.resolve(info, Job("7", backend, poll=False)) is None  # no hosts yet
    backend.states = [None]
    assert backend.resolve(info, Job("7", backend, poll=False)) is None  # no longer listed
    backend, run, info = job_of(PINNED, tmp_path, states=[DONE])
    publish(run, "{half")  # being written, and the job over: nothing will come
    job = Job("7", backend, poll=False)
    job.refresh()
    assert backend.resolve(info, job) is None and clock.now == 1000.0


def test_a_rendezvous_that_never_comes_is_waited_for_start_timeout_s(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(start_timeout_s=2.0),
                                states=[RUNNING])
    assert backend.resolve(info, Job("7", backend, poll=False)) is None
    assert clock.now == 1002.05  # a look every 0.05 s, until one past the 2 s
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(start_timeout_s=2.0),
                                states=[RUNNING])
    clock.on_sleep = lambda: clock.now >= 1003.0 and publish(run, '{"addr": "a", "port": 1}')
    assert backend.resolve(info, Job("7", backend, poll=False)).plan.master_port == 1


# -- a job that ended before its rendezvous ------------------------------------------------------------

def early(tmp_path, clock, states, *, wrote=(), output="", started=990.0, dirs=()):
    backend, run, info = job_of(PINNED, tmp_path, states=states, output=output)
    for k in dirs:
        os.makedirs(info.plan.nodes[k].run_dir)
    for k in wrote:
        os.makedirs(info.plan.nodes[k].run_dir, exist_ok=True)
        with open(os.path.join(info.plan.nodes[k].run_dir, "agent.out"), "wb") as fh:
            fh.write(b"python3: can't open file\n")
    job = queued_job(backend, clock)
    job.refresh()
    return backend, run, backend.ended_early(info.plan, run, job, started)


def test_a_job_cancelled_before_its_nodes_started(tmp_path, clock):
    backend, run, outcome = early(tmp_path, clock, [RUNNING])
    assert backend.cancels == [("7", None)]  # still running: cancelled first
    why = "the TestQueue job was cancelled before its nodes started"
    assert [(n.state, n.exit_code, n.reason) for n in outcome.nodes] == [
        (NodeState.FAILED, None, why)] * 2
    # from the start (990) to the cancel seen, at the first look at 1000
    assert (outcome.state, outcome.root_cause.node_rank) == (RunState.FAILED, 0)
    assert outcome.wall_s == pytest.approx(10.0)
    assert (outcome.run_id, [n.host for n in outcome.nodes]) == ("r", ["n0", "n1"])


def test_a_job_a_cancel_does_not_end_is_waited_for_its_grace_and_30s(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, LaunchOptions(grace_s=5.0), states=[RUNNING])
    backend.__class__ = Stubborn
    job = queued_job(backend, clock)
    job.refresh()
    backend.ended_early(info.plan, run, job, 990.0)
    assert clock.now == 1035.0


def test_a_job_that_ended_before_any_node_wrote_says_what_the_nodes_need(tmp_path, clock):
    backend, run, outcome = early(tmp_path, clock, [DONE], output="slurmstepd: error",
                                  dirs=(0,))  # node 0's directory, but no stream in it
    assert backend.cancels == []
    assert backend.asked[-1] == ("output", "7", run)
    assert outcome.nodes[1].reason == (
        f"the TestQueue job ended (COMPLETED) before any node wrote to {run.path}: the compute "
        "nodes must see the run directory (a shared file system), and the node's python must "
        "run the agent; the job's output: slurmstepd: error")
    backend, run, outcome = early(tmp_path, clock, [None])
    assert outcome.nodes[0].reason.startswith("the TestQueue job ended (gone) before any node")


def test_a_job_whose_node_wrote_but_published_no_rendezvous_keeps_what_it_wrote(tmp_path, clock):
    backend, run, outcome = early(tmp_path, clock, [DONE], wrote=(1,))
    assert outcome.nodes[0].reason == ("the TestQueue job ended (COMPLETED) before node 0 "
                                       "published the rendezvous")
    with open(run.node_log(1), "rb") as fh:
        assert fh.read() == b"python3: can't open file\n"
    assert not os.path.exists(run.node_log(0))


def test_a_stream_over_1_mib_is_not_copied_into_the_node_log(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, states=[DONE])
    os.makedirs(info.plan.nodes[0].run_dir)
    with open(os.path.join(info.plan.nodes[0].run_dir, "agent.out"), "wb") as fh:
        fh.write(b"x" * ((1 << 20) + 1))
    sched._copy_stream(info.plan.nodes[0], run)
    assert not os.path.exists(run.node_log(0))


def test_read_capped_reads_a_file_up_to_its_cap_and_nothing_past_it(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"12345")
    assert sched.read_capped(str(path), 5) == b"12345"
    assert sched.read_capped(str(path), 4) is None
    assert sched.read_capped(str(tmp_path / "none"), 5) is None


# -- the handle: running, settle, close ----------------------------------------------------------------

def submitted(tmp_path, clock, states, text=PINNED, **options):
    backend, run, info = job_of(text, tmp_path, LaunchOptions(**options), states=states)
    handle = sched.JobRun(backend, info, run, Job("7", backend, poll=False), 990.0)
    clock.on_sleep = handle.job.refresh
    return backend, run, handle


def test_a_job_that_runs_and_meets_gets_its_streams_and_its_final_records(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [PENDING, RUNNING], text=PLACED)
    publish(run, '{"addr": "10.0.0.5", "port": 29511}')
    try:
        assert handle.running(console()) is None
    finally:
        handle.job.close()
    assert handle.pending is False and handle.channels is handle.streams
    assert all(s.job is handle.job for s in handle.streams.values())
    assert {k: (s.path, s.host) for k, s in handle.streams.items()} == {
        0: (f"{run.path}/node-0/agent.out", "<slurm node 0>"),  # the loader's placeholders
        1: (f"{run.path}/node-1/agent.out", "<slurm node 1>")}
    assert handle.dryrun.plan.master_port == 29511
    assert [(r.host, r.connection) for r in handle.records] == [
        ("c1", {"testqueue_job": "7"}), ("c2", {"testqueue_job": "7"})]
    assert handle.running(console()) is None  # no longer pending: nothing to wait for


def test_a_job_that_never_ran_ends_as_the_wait_says(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [PENDING], queue_timeout_s=1.0)
    outcome = handle.running(console())
    handle.job.close()
    assert outcome.state is RunState.FAILED and outcome.nodes[0].reason.startswith(
        "the TestQueue job was still queued after the queue timeout of 1s")
    assert handle.pending and handle.streams == {}


def test_a_job_that_ended_before_the_rendezvous_ends_early(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [DONE])
    os.makedirs(f"{run.path}/node-1")
    with open(f"{run.path}/node-1/agent.out", "wb") as fh:
        fh.write(b"Traceback\n")
    outcome = handle.running(console())
    handle.job.close()
    assert outcome.nodes[0].reason == ("the TestQueue job ended (COMPLETED) before node 0 "
                                       "published the rendezvous")
    assert handle.pending and set(handle.streams) == {0, 1}
    assert open(run.node_log(1), "rb").read() == b"Traceback\n"


@pytest.mark.parametrize("where, why", [("await_running", "cancelled while queued (Ctrl-C)"),
                                        ("resolve", "cancelled while starting (Ctrl-C)")])
def test_ctrl_c_while_queued_or_starting_cancels_the_job(tmp_path, clock, monkeypatch, where,
                                                         why):
    backend, run, handle = submitted(tmp_path, clock, [RUNNING])

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(backend, where, interrupted)
    out = console()
    outcome = handle.running(out)
    handle.job.close()
    assert backend.cancels == [("7", None)]
    assert outcome.state is RunState.INTERRUPTED and outcome.wall_s == 10.0
    assert [(n.state, n.reason) for n in outcome.nodes] == [(NodeState.NOT_STARTED, why)] * 2
    assert ("ddp-orch: interrupted; cancelling TestQueue job 7" in said(out)) == \
        (where == "await_running")


def lost(k: int, **more) -> NodeOutcome:
    return NodeOutcome(k, f"n{k}", NodeState.LOST, None, "no word", None, **more, why=EndReason.AGENT_DIED)


def test_settle_explains_each_silent_node_with_the_schedulers_view(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [DONE])
    handle.streams = handle._streams(handle.dryrun)
    handle.job.refresh()
    failed = NodeOutcome(0, "n0", NodeState.FAILED, 1, "torchrun exited 1", 995.0, why=EndReason.FAILED)
    settled = handle.settle(RunOutcome("r", RunState.FAILED, 3.0, (failed, lost(1)), failed,
                                       None))
    assert settled.nodes == (failed, dataclasses.replace(lost(1), reason=(
        "the TestQueue job ended (COMPLETED) without a report from this node's agent "
        "(killed, or the node failed)"), why=EndReason.SCHEDULER_ENDED))
    assert (settled.state, settled.root_cause, settled.wall_s) == (RunState.FAILED, failed,
                                                                   10.0)
    assert settled.run_id == "r"
    assert all(s._closed for s in handle.streams.values()) and backend.cancels == []


def test_settle_cancels_a_job_that_outlives_its_gang(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [RUNNING], grace_s=5.0)
    handle.job.refresh()
    ran = RunOutcome("r", RunState.INTERRUPTED, 3.0, (lost(0), lost(1)), None, None)
    settled = handle.settle(ran)
    assert backend.cancels == [("7", None)] and 1035.0 <= clock.now < 1036.0
    assert settled.state is RunState.INTERRUPTED


def test_settle_and_close_wait_for_a_job_its_cancel_does_not_end(tmp_path, clock):
    """settle: grace + 30 s for the job to end, then a cancel and 30 s more;
    close: a cancel and grace + 60 s."""
    backend, run, handle = submitted(tmp_path, clock, [RUNNING], grace_s=5.0)
    backend.__class__ = Stubborn
    handle.settle(RunOutcome("r", RunState.FAILED, 3.0, (lost(0), lost(1)), None, None))
    assert clock.now == 1065.0 and backend.cancels == [("7", None)]
    backend, run, handle = submitted(tmp_path, clock, [RUNNING], grace_s=5.0)
    backend.__class__ = Stubborn
    handle.close()
    assert clock.now == 1130.0 and handle.job._closed.is_set()


def test_close_cancels_what_is_left_of_the_job_unless_it_was_left_to_the_scheduler(tmp_path,
                                                                                   clock):
    backend, run, handle = submitted(tmp_path, clock, [RUNNING])
    handle.job.refresh()
    handle.close(left=True)
    assert backend.cancels == [] and handle.job._closed.is_set()
    backend, run, handle = submitted(tmp_path, clock, [RUNNING], grace_s=5.0)
    handle.job.refresh()
    handle.close()
    assert backend.cancels == [("7", None)] and handle.job.ended
    backend, run, handle = submitted(tmp_path, clock, [DONE])
    handle.job.refresh()
    handle.close()
    assert backend.cancels == []


def test_the_handles_stack_dump_asks_the_scheduler_with_the_jobs_nodes(tmp_path, clock):
    backend, run, handle = submitted(tmp_path, clock, [RUNNING])
    assert handle.dump_stacks() == "stacks"
    assert backend.stacks_asked == [("7", handle.records, "r", False)]


# -- what a finished job brings home -------------------------------------------------------------

SECRET = "hf-s3cret-value-xyz"


def test_a_finished_job_brings_home_its_result_error_files_and_outputs_masked(tmp_path,
                                                                             monkeypatch):
    """From the shared run directory: node 0's result; node 1's error files
    that stay inside its run directory (not one a link takes out, and one
    that is no file is noted in its log); node 0's outputs, a file that a
    link replaced after the listing refused. The secret is masked in all."""
    (tmp_path / "train.py").write_text("")
    text = ("nodes: [{host: n0, procs: 1}, {host: n1, procs: 2}]\nworkload: {script: train.py}\n"
            f"outputs: [model.pt, 'ckpt/*']\nenv: {{HF_TOKEN: {SECRET}}}\n")
    backend, run, info = job_of(text, tmp_path, base_dir=str(tmp_path))
    node0, node1 = (Path(n.run_dir) for n in info.plan.nodes)
    (node0 / "project" / "ckpt").mkdir(parents=True)
    (node0 / "result.json").write_text('{"metrics": {"loss": 0.5}}')
    (node0 / "project" / "model.pt").write_text(f"weights {SECRET}")
    (node0 / "project" / "ckpt" / "a.pt").write_text("a")
    (node1 / "torchrun").mkdir(parents=True)
    (node1 / "torchrun" / "err.json").write_text(f'{{"message": "{SECRET} boom"}}')
    (node1 / "torchrun" / "dir.json").mkdir()
    (node1 / "torchrun" / "big.json").write_bytes(b"x" * ((1 << 20) + 1))  # over 1 MiB
    os.symlink("/etc/hostname", node1 / "torchrun" / "out.json")
    failures = (WorkerFailure(0, "m", 1.0, "torchrun/out.json"),
                WorkerFailure(0, "m", 1.0, "torchrun/dir.json"),
                WorkerFailure(0, "m", 1.0, "torchrun/big.json"),
                WorkerFailure(1, "m", 1.0, "torchrun/err.json"))
    outcome = RunOutcome("r", RunState.FAILED, 3.0, (
        NodeOutcome(0, "n0", NodeState.SUCCEEDED, 0, "torchrun exited 0", None, why=EndReason.EXITED),
        NodeOutcome(1, "n1", NodeState.FAILED, 1, "torchrun exited 1", None, failures, why=EndReason.FAILED)),
        None, None)
    listing = sched.outputs.collect

    def listed_then_replaced(**request):
        found = listing(**request)  # a.pt, as it was when listed: a link now
        os.remove(node0 / "project" / "ckpt" / "a.pt")
        os.symlink("/etc/hostname", node0 / "project" / "ckpt" / "a.pt")
        return found

    monkeypatch.setattr(sched.outputs, "collect", listed_then_replaced)
    handle = sched.JobRun(backend, info, run, Job("7", backend, poll=False), 990.0)
    assert handle.fetch(outcome) == {"metrics": {"loss": 0.5}}
    assert open(run.file("errors/node-1/rank-2.json")).read() == '{"message": "******** boom"}'
    assert sorted(os.listdir(run.file("errors/node-1"))) == ["rank-2.json"]
    assert open(run.node_log(1)).read() == (
        f"ddp-orch: {node1}/torchrun/dir.json: not fetched: not a regular file\n"
        f"ddp-orch: {node1}/torchrun/big.json: not fetched: 1048577 bytes, more than the "
        "1048576 accepted\n")
    assert open(run.file("outputs/model.pt")).read() == "weights ********"
    record = json.loads(open(run.file("outputs.json")).read())
    assert [f["path"] for f in record["files"]] == ["model.pt"]
    assert record["refused"] == [{"path": "ckpt/a.pt", "why": (
        f"{node0}/project/ckpt/a.pt: not fetched: it leads out of {node0}/project (a symbolic "
        "link?)")}]


def test_outputs_that_changed_since_listed_are_refused_in_the_transfers_words(tmp_path,
                                                                             monkeypatch):
    """Listed as files of a byte each (the cap is 4 bytes here), then one is a
    directory and one has grown past the cap when fetched; and a result that
    is no JSON object is none."""
    from orchestrator.engine import results

    monkeypatch.setattr(results, "MAX_OUTPUT_FILE_BYTES", 4)
    (tmp_path / "train.py").write_text("")
    text = "nodes: [{host: n0, procs: 1}]\nworkload: {script: train.py}\noutputs: ['*.pt']\n"
    backend, run, info = job_of(text, tmp_path, base_dir=str(tmp_path))
    root = Path(info.plan.nodes[0].code_root)
    root.mkdir(parents=True)
    (root / "a.pt").write_text("a")
    (root / "b.pt").write_text("b")
    (root.parent / "result.json").write_text("[1, 2]")
    listing = sched.outputs.collect

    def listed_then_changed(**request):
        found = listing(**request)
        os.remove(root / "a.pt")
        os.mkdir(root / "a.pt")
        (root / "b.pt").write_text("b" * 10)
        return found

    monkeypatch.setattr(sched.outputs, "collect", listed_then_changed)
    done = RunOutcome("r", RunState.SUCCEEDED, 1.0, (
        NodeOutcome(0, "n0", NodeState.SUCCEEDED, 0, "torchrun exited 0", None, why=EndReason.EXITED),), None, None)
    assert backend.collect(info, done, run) is None
    record = json.loads(open(run.file("outputs.json")).read())
    assert record["refused"] == [
        {"path": "a.pt", "why": f"{root}/a.pt: not fetched: not a regular file"},
        {"path": "b.pt", "why": f"{root}/b.pt: not fetched: 10 bytes, more than the 4 accepted"}]


# -- explain ----------------------------------------------------------------------------------------------

def explained(outcome, nodes, state, stops=""):
    backend = FakeScheduler(stops_the_rest=stops, states=[state])
    job = Job("7", backend, poll=False)
    job.refresh()
    return backend.explain(outcome, nodes, job)


def test_a_silent_node_is_stopped_by_the_scheduler_where_it_stops_the_rest():
    failed = NodeOutcome(1, "n1", NodeState.FAILED, 1, "torchrun exited 1", None, why=EndReason.FAILED)
    got = explained(lost(0), (lost(0), failed), FAILED_STATE, "srun --kill-on-bad-exit")
    assert (got.state, got.reason) == (NodeState.STOPPED, "ended by TestQueue when node 1 "
                                                          "failed (srun --kill-on-bad-exit)")
    got = explained(lost(0), (lost(0), failed), FAILED_STATE)  # a scheduler that does not
    assert (got.state, got.reason) == (NodeState.LOST, "the TestQueue job ended (FAILED) "
                                       "without a report from this node's agent (killed, or "
                                       "the node failed)")


FAILED_STATE = FakeState("FAILED")


def test_a_silent_node_is_not_blamed_on_a_node_that_only_cascaded():
    """Slurm's step teardown after node 0's agent was killed reached node 1's
    rank first: its own SIGTERM handler exited 143. Node 1 did not fail on
    its own, so node 0 was not 'ended by Slurm when node 1 failed'."""
    cascaded = NodeOutcome(1, "n1", NodeState.FAILED, 1, "torchrun exited 1; rank 1 (local "
                           "rank 0) failed: SystemExit: 143", None,
                           (WorkerFailure(0, "SystemExit: 143", 5.0),), why=EndReason.FAILED)
    got = explained(lost(0), (lost(0), cascaded), FAILED_STATE, "srun --kill-on-bad-exit")
    assert got.state is NodeState.LOST
    assert "without a report from this node's agent" in got.reason


def test_a_node_with_its_own_word_is_left_as_it_said():
    failed = NodeOutcome(1, "n1", NodeState.FAILED, 1, "torchrun exited 1", None, why=EndReason.FAILED)
    reported = lost(0, failures=(WorkerFailure(0, "boom", 1.0),))
    assert explained(failed, (failed,), FAILED_STATE, "stops") is failed
    assert explained(reported, (reported, failed), FAILED_STATE, "stops") is reported
    assert explained(lost(0), (lost(0),), None).reason.startswith(
        "the TestQueue job ended (no longer listed) without a report")


# -- describe --------------------------------------------------------------------------------------------

FAILED_1 = NodeOutcome(1, "n1", NodeState.FAILED, 1, "torchrun exited 1", 950.0, why=EndReason.FAILED)


def recorded(tmp_path, *, job: str | None = "7", state=RunState.RUNNING, pid=None, dirs=2,
             run: RunDir | None = None):
    """A scheduler's run as its records hold it (node 1 failed, as its
    controller recorded), each node's python one of its own."""
    run = run or RunDir.create(tempfile.mkdtemp(dir=tmp_path), "r")
    nodes = []
    for k in range(dirs):
        nodes.append(NodeRecord(k, f"n{k}", f"{run.path}/node-{k}", f"/opt/py{k}/bin/python",
                                {"testqueue_job": job} if job else {}))
    return RunRecord(run_id="r", run=run, state=state, backend="testqueue", started=900.0,
                     wall_s=None, ended=None, controller_pid=pid, nodes=tuple(nodes),
                     outcomes=(FAILED_1,), root_cause=FAILED_1, owner=Owner(Holder.SCHEDULER))


def test_a_run_with_no_job_on_record_is_interrupted_once_its_controller_is_gone(tmp_path):
    backend = FakeScheduler()
    gone = backend.describe(recorded(tmp_path, job=None))
    assert (gone.state, gone.detail) == (RunState.INTERRUPTED, "no TestQueue job on record")
    assert (gone.nodes, gone.root_cause) == ((FAILED_1,), FAILED_1)
    alive = backend.describe(recorded(tmp_path, job=None, pid=os.getpid()))
    assert (alive.state, alive.detail) == (RunState.RUNNING, "")
    over = backend.describe(recorded(tmp_path, job=None, state=RunState.FAILED))
    assert (over.state, over.detail) == (RunState.FAILED, "")
    assert backend.job_of(recorded(tmp_path, job=None)) is None


def test_a_listed_job_is_described_in_the_schedulers_words(tmp_path):
    def described(listed, **more):
        return FakeScheduler(states=[listed]).describe(recorded(tmp_path, **more))

    backend = FakeScheduler(states=[FakeState("RUNNING", "", "c1,c2")])
    got = backend.describe(recorded(tmp_path, pid=os.getpid()))
    assert (got.state, got.detail, got.progress) == (RunState.RUNNING,
                                                     "TestQueue job 7: RUNNING on c1,c2", ())
    assert (got.nodes, got.root_cause) == ((FAILED_1,), FAILED_1)
    assert backend.asked == [("state", "7")]  # and not its accounts: it is listed
    assert described(FakeState("RUNNING", "Prolog"), pid=os.getpid()).detail == \
        "TestQueue job 7: RUNNING (Prolog)"
    got = described(FakeState("PENDING", "Priority", "c1"))
    assert (got.state, got.detail) == (RunState.PENDING, "TestQueue job 7: PENDING (Priority)")
    # the record already says how it ended: the queue's word is the detail only
    got = described(RUNNING, state=RunState.SUCCEEDED)
    assert (got.state, got.detail) == (RunState.SUCCEEDED, "TestQueue job 7: RUNNING on c1,c2")


def test_an_ended_job_is_what_its_record_says_once_recorded(tmp_path):
    record = dataclasses.replace(recorded(tmp_path, state=RunState.FAILED), ended=950.0)
    listed = FakeScheduler(states=[DONE])
    got = listed.describe(record)
    assert (got.state, got.detail, got.ended) == (RunState.FAILED, "TestQueue job 7: COMPLETED",
                                                  None)
    assert (got.nodes, got.root_cause, listed.asked) == ((FAILED_1,), FAILED_1,
                                                         [("state", "7")])
    forgotten = FakeScheduler(states=[None], accounts="COMPLETED (exit 0, from sacct)")
    got = forgotten.describe(record)
    assert got.detail == "TestQueue job 7: COMPLETED (exit 0, from sacct)"
    assert forgotten.asked == [("state", "7"), ("accounted", "7")]
    got = FakeScheduler(states=[None]).describe(record)
    assert got.detail == "TestQueue job 7: no longer listed by TestQueue"


def supervisor(record: RunRecord, k: int, text: str | None, mtime: float) -> None:
    os.makedirs(record.nodes[k].run_dir, exist_ok=True)
    if text is not None:
        path = os.path.join(record.nodes[k].run_dir, "supervisor.json")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.utime(path, (mtime, mtime))


# the words of an agent killed before it wrote its end, as the controller
# gives them when it hears the agent's link close
LOST_WORDS = "the node agent ended without reporting (no exit status on record)"


def test_a_job_whose_controller_is_gone_ended_as_its_agents_recorded(tmp_path):
    record = recorded(tmp_path, dirs=5)
    supervisor(record, 0, '{"exit_code": 0}', 1500.0)
    supervisor(record, 1, '{"exit_code": 3}', 2000.0)
    supervisor(record, 2, '{"exit_code": null}', 3000.0)  # still running when it went
    supervisor(record, 3, "{half", 4000.0)
    # node 4: never started (no directory)
    got = FakeScheduler(states=[DONE]).describe(record)
    assert [(n.node_rank, n.state, n.exit_code, n.reason) for n in got.nodes] == [
        (0, NodeState.SUCCEEDED, 0, "torchrun exited 0"),
        (1, NodeState.FAILED, 3, "torchrun exited 3"),
        (2, NodeState.LOST, None, LOST_WORDS),
        (3, NodeState.LOST, None, LOST_WORDS),
        (4, NodeState.NOT_STARTED, None, "never started: no run directory")]
    assert [n.host for n in got.nodes] == ["n0", "n1", "n2", "n3", "n4"]
    assert (got.state, got.root_cause.node_rank, got.detail, got.ended) == (
        RunState.FAILED, 1, "TestQueue job 7: COMPLETED", 2000.0)
    record = recorded(tmp_path)
    supervisor(record, 0, '{"exit_code": 0}', 1500.0)
    supervisor(record, 1, '{"exit_code": 0}', 1400.0)
    got = FakeScheduler(states=[None]).describe(record)
    assert (got.state, got.root_cause, got.ended, got.detail) == (
        RunState.SUCCEEDED, None, 1500.0, "TestQueue job 7: no longer listed by TestQueue")
    silent = FakeScheduler(states=[DONE]).describe(recorded(tmp_path))  # no agent recorded
    assert (silent.state, silent.ended) == (RunState.FAILED, None)
    assert [n.state for n in silent.nodes] == [NodeState.NOT_STARTED] * 2


def test_a_detached_jobs_end_is_read_from_the_exit_events_its_agents_recorded(tmp_path):
    """Issue #43, the fault matrix's Slurm detached cells: rank 1 raised on
    node 1, and Slurm stopped node 0 (``got SIGTERM``). With no controller
    to hear the exit events, both read "torchrun exited 1" and node 0 was
    blamed; the agents record their exit events, and the root cause is node
    1's rank, in the words the controller gives."""
    import json as json_

    record = recorded(tmp_path)
    record.run.write_plan({"nodes": [{"node_rank": 0, "ranks": [0, 1]},
                                     {"node_rank": 1, "ranks": [2, 3]}]})
    stopped = {"event": "exit", "code": 1, "reason": "got SIGTERM", "ended": "signal", "failures": [],
               "stopped_at": 1999.0, "last_lines": [], "survivors": [], "duration_s": 9.0}
    failed = {**stopped, "reason": "torchrun exited", "ended": "itself", "stopped_at": None, "failures": [
        {"local_rank": 1, "message": "RuntimeError: boom (train.py:3)", "timestamp": 1990.0,
         "error_file": None}]}
    supervisor(record, 0, json_.dumps({"exit_code": 1, "exit": stopped}), 2001.0)
    supervisor(record, 1, json_.dumps({"exit_code": 1, "exit": failed}), 2000.0)
    got = FakeScheduler(states=[DONE]).describe(record)
    assert [(n.node_rank, n.state) for n in got.nodes] == [(0, NodeState.STOPPED),
                                                           (1, NodeState.FAILED)]
    assert got.root_cause.node_rank == 1
    assert "rank 3 (local rank 1) failed: RuntimeError: boom (train.py:3)" in \
        got.root_cause.reason, got.root_cause.reason
    # an exit event this version cannot read: its exit code, as before
    supervisor(record, 1, json_.dumps({"exit_code": 1, "exit": {"event": "exit"}}), 2000.0)
    got = FakeScheduler(states=[DONE]).describe(record)
    assert (got.nodes[1].state, got.nodes[1].reason) == (NodeState.FAILED, "torchrun exited 1")


# -- cancel, stacks, reconnect ------------------------------------------------------------------------------

def test_cancel_without_a_job_on_record_says_so_for_each_node(tmp_path):
    assert FakeScheduler().cancel(recorded(tmp_path, job=None)) == [
        CancelResult(0, "n0", (), "no TestQueue job on record (never submitted)"),
        CancelResult(1, "n1", (), "no TestQueue job on record (never submitted)")]


def test_cancel_ends_the_job_and_says_when_it_is_still_listed(tmp_path, clock):
    backend = FakeScheduler(states=[RUNNING])
    assert backend.cancel(recorded(tmp_path)) == [CancelResult(0, "n0", (), ""),
                                                  CancelResult(1, "n1", (), "")]
    assert backend.cancels == [("7", None)]

    stubborn = Stubborn(LaunchOptions(grace_s=5.0), states=[RUNNING])
    results = stubborn.cancel(recorded(tmp_path))
    assert [r.error for r in results] == ["TestQueue job 7 is still listed after its cancel"] * 2
    assert 1065.0 <= clock.now < 1065.5  # grace + 60 s


def test_stacks_need_a_job_on_record(tmp_path):
    backend = FakeScheduler()
    with pytest.raises(LaunchError, match="^run r has no TestQueue job on record$"):
        backend.stacks(recorded(tmp_path, job=None))
    record = recorded(tmp_path)
    assert backend.stacks(record, native=True) == backend.stacks(record) == "stacks"
    assert backend.stacks_asked == [("7", record.nodes, "r", True), ("7", record.nodes, "r", False)]


def test_reconnect_follows_each_node_from_its_last_lines(tmp_path, clock):
    backend, run, info = job_of(PINNED, tmp_path, states=[RUNNING])
    run.write_plan(dryrun_to_dict(info))
    record = recorded(tmp_path, run=run)
    with pytest.raises(LaunchError, match="^run r has no TestQueue job on record$"):
        backend.reconnect(recorded(tmp_path, job=None))
    stream = b"one\ntwo\n::ddp-orch:: {}\nthree\n"
    os.makedirs(f"{run.path}/node-0")
    with open(f"{run.path}/node-0/agent.out", "wb") as fh:
        fh.write(stream)
    handle = backend.reconnect(record, lines=2)
    try:
        assert handle.watching and not handle.pending and handle.records == record.nodes
        assert (handle.backend, handle.run, handle.started) == (backend, run, 1000.0)
        assert handle.dryrun.owner == Owner(Holder.SCHEDULER) and handle.job.job_id == "7"
        assert {k: s.offset for k, s in handle.streams.items()} == {0: stream.index(b"two"),
                                                                   1: 0}
        assert handle.job.state == RUNNING  # asked at once
    finally:
        handle.close(left=True)
    handle = backend.reconnect(record)
    handle.close(left=True)
    assert [s.offset for s in handle.streams.values()] == [0, 0]


@pytest.mark.parametrize("written, found", [
    (b"4242\n", "4242"), (b"4242", "4242"), (b"1" * 64, "1" * 64),
    (b"1" * 65, None),  # past the 64 bytes an id may have
    (b"\xff42\n", None),  # no ASCII: no id (and no UnicodeDecodeError)
    (b"42 43\n", None), (b"\n", None),
])
def test_a_job_id_file_is_read_as_an_ascii_word_of_64_bytes_at_most(tmp_path, written, found):
    record = recorded(tmp_path, job=None)
    with open(record.run.file("job.id"), "wb") as fh:
        fh.write(written)
    assert FakeScheduler().job_of(record) == found
