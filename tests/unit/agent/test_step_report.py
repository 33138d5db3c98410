"""``ddp_orch_progress.step(n, samples=None)``: a user program's step report
(``orchestrator/agent/worker/progress.py``, shipped as
``code/ddp_orch_progress.py``): a no-op outside ddp-orch, and inside it the
record the node agent reads as the rank's progress."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from types import SimpleNamespace

import pytest

from orchestrator.agent.node.outputsteps import OutputSteps
from orchestrator.agent.node.supervisor import Supervisor
from orchestrator.agent.worker import progress
from orchestrator.engine.bundle import build_bundle
from workloads import contract


@pytest.fixture
def fresh(monkeypatch):
    """A process that has reported no step yet, at monotonic time 1000."""
    monkeypatch.setattr(progress, "_last", [float("-inf")])
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock.now)
    return clock


def test_outside_ddp_orch_it_returns_at_once_and_writes_nothing(tmp_path, monkeypatch, fresh):
    monkeypatch.delenv("DDP_ORCH_RESULT_FILE", raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.chdir(tmp_path)
    assert progress.step(5) is None
    assert os.listdir(tmp_path) == []


def test_inside_ddp_orch_the_node_agent_reads_the_ranks_step(tmp_path, monkeypatch, fresh):
    """The record is the built-ins' heartbeat file: ``progress/rank-3`` in
    the node's run directory holding ``"<step> <time>"``, which the
    supervisor reports as rank 3's step and its age."""
    run_dir = tmp_path / "node-0"
    run_dir.mkdir()
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(run_dir / "result.json"))
    monkeypatch.setenv("RANK", "3")
    progress.step(41)
    step, stamp = (run_dir / "progress" / "rank-3").read_text().split()
    assert step == "41"
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(run_dir), output_steps=OutputSteps()))
    assert list(seen) == ["3"] and seen["3"][0] == 41 and 0 <= seen["3"][1] < 5
    assert sorted(os.listdir(run_dir / "progress")) == ["rank-3"]  # no .tmp left


def report_with(writer: str, monkeypatch):
    """``ddp_orch_progress.step`` or ``workloads.contract.heartbeat``, each
    free to write now (no report in the last second)."""
    if writer == "step":
        return progress.step
    monkeypatch.setattr(contract, "_last_heartbeat", [float("-inf")])
    return contract.heartbeat


@pytest.mark.parametrize("writer", ["step", "heartbeat"])
def test_samples_ride_as_a_third_field_that_the_node_agent_reads(tmp_path, monkeypatch, fresh,
                                                                  writer):
    run_dir = tmp_path / "node-0"
    run_dir.mkdir()
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(run_dir / "result.json"))
    monkeypatch.setenv("RANK", "2")
    report_with(writer, monkeypatch)(40, samples=1280)
    step, _stamp, samples = (run_dir / "progress" / "rank-2").read_text().split()
    assert (step, samples) == ("40", "1280")
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(run_dir), output_steps=OutputSteps()))
    assert seen["2"][0] == 40 and 0 <= seen["2"][1] < 5 and seen["2"][2] == 1280


@pytest.mark.parametrize("writer", ["step", "heartbeat"])
@pytest.mark.parametrize("samples", [None, -1, 2.5, True, "12", [3]])
def test_no_samples_or_bad_ones_leave_the_step_report_as_it_was(tmp_path, monkeypatch, fresh,
                                                                writer, samples):
    """Best effort: a bad count is left out, the step still recorded."""
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "0")
    report_with(writer, monkeypatch)(7, samples=samples)
    fields = (tmp_path / "progress" / "rank-0").read_text().split()
    assert len(fields) == 2 and fields[0] == "7"
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(tmp_path), output_steps=OutputSteps()))
    assert len(seen["0"]) == 2 and seen["0"][0] == 7


def test_it_writes_at_most_once_a_second(tmp_path, monkeypatch, fresh):
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(tmp_path / "result.json"))
    monkeypatch.setenv("RANK", "0")
    record = tmp_path / "progress" / "rank-0"
    progress.step(1)
    fresh.now += 0.9
    progress.step(2)
    assert record.read_text().split()[0] == "1"
    fresh.now += 0.1
    progress.step(3)
    assert record.read_text().split()[0] == "3"


def test_a_run_dir_it_cannot_write_never_reaches_the_training_loop(tmp_path, monkeypatch,
                                                                    fresh):
    (tmp_path / "progress").write_text("a file where the directory goes")
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(tmp_path / "result.json"))
    progress.step(1)  # no exception


def test_the_bundle_ships_it_so_a_rank_imports_it_by_name(tmp_path):
    """As on a node: the bundle's ``code/`` on PYTHONPATH (the plan's env)
    and the rank's working directory elsewhere (the project's copy)."""
    build_bundle(str(tmp_path / "b.tar.gz"))
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        tar.extractall(tmp_path / "node-0", filter="data")
    cwd = tmp_path / "project"
    cwd.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tmp_path / "node-0" / "code"),
           "DDP_ORCH_RESULT_FILE": str(tmp_path / "node-0" / "result.json"), "RANK": "1"}
    subprocess.run([sys.executable, "-c", "import ddp_orch_progress\n"
                    "for i in range(3): ddp_orch_progress.step(i, samples=32 * i)"],
                   cwd=cwd, env=env, check=True, timeout=60)
    fields = (tmp_path / "node-0" / "progress" / "rank-1").read_text().split()
    assert (fields[0], fields[2]) == ("0", "0")


# What programs print, as they print it (issue 43): the step each line says.
PRINTED = [
    (b"[rank0]: step 120 loss 2.3100", 120),
    (b"[rank0]: Step: 7 | lr 3e-4", 7),
    (b"[rank0]: global_step=4000 loss=0.2", 4000),
    (b"[rank0]: iter 120: loss 2.3456, time 32.10ms, mfu 12.34%", 120),  # nanoGPT
    (b"[rank0]:  45%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8c     | "
     b"45/100 [00:04<00:05, 10.00it/s]", 45),  # tqdm
    (b"[rank0]: Epoch 0:  24%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x8d       | 120/500 "
     b"[00:02<00:07, 52.14it/s, v_num=0, train_loss=0.500]", 120),  # Lightning
    (b"[rank0]:  10%|\xe2\x96\x88         | 50/500 [00:12<01:48,  4.16it/s]", 50),  # Trainer
    (b"[rank0]:  10%|#         | 10/100 [00:01<00:09]\r 20%|##        | 20/100 [00:02<00:08]",
     20),  # a bar redrawn with \r, its last state
]
SILENT = [b"[rank0]: steps 5 done", b"[rank0]: step_size=3", b"[rank0]: loss 2.31",
          b"[rank0]: {'loss': 2.3456, 'grad_norm': 1.23, 'learning_rate': 4.5e-05, 'epoch': 0.1}",
          b"[rank0]: saved 2026/11/28 [ok]", b"no rank prefix: step 9"]


@pytest.mark.parametrize("line, step", PRINTED)
def test_a_ranks_step_is_read_from_the_lines_it_prints(line, step):
    steps = OutputSteps()
    steps.feed(b"[rank0]: starting\n" + line + b"\n", at=100.0)
    assert steps.progress(now=102.5) == {"0": [step, 2.5]}


@pytest.mark.parametrize("line", SILENT)
def test_a_line_that_says_no_step_gives_none(line):
    steps = OutputSteps()
    steps.feed(line + b"\n", at=100.0)
    assert steps.progress(now=101.0) == {}


def test_a_bar_that_starts_again_counts_on_and_each_rank_has_its_own():
    """Lightning's bar starts again each epoch: 500/500, then 3/500 is the
    503rd step, never a step back (a rate would read it as one)."""
    steps = OutputSteps()
    steps.feed(b"[rank1]: Epoch 0: 100%| 500/500 [00:09<00:00]\n[rank0]: step 7\n", at=10.0)
    steps.feed(b"[rank1]: Epoch 1:   1%| 3/500 [00:00<00:10]\n", at=11.0)
    steps.feed(b"[rank1]: Epoch 1:   2%| 9/500 [00:00<00:10]\n", at=12.0)
    assert steps.progress(now=12.0) == {"0": [7, 2.0], "1": [509, 0.0]}


def test_a_pattern_of_the_users_own_reads_its_group():
    steps = OutputSteps(r"(?P<epoch>\d+)\.(?P<step>\d+) batches")
    steps.feed(b"[rank2]: 3.41 batches done, step 99\n", at=5.0)
    assert steps.progress(now=5.0) == {"2": [41, 0.0]}  # the default patterns are off


def test_a_ranks_own_step_report_wins_over_its_lines(tmp_path, monkeypatch):
    """Rank 3 reports its step and prints another; rank 4 only prints: the
    heartbeat's progress has rank 3's report and rank 4's line."""
    run_dir = tmp_path / "node-0"
    run_dir.mkdir()
    monkeypatch.setenv("DDP_ORCH_RESULT_FILE", str(run_dir / "result.json"))
    monkeypatch.setenv("RANK", "3")
    progress.step(41)
    printed = OutputSteps()
    printed.feed(b"[rank3]: step 900\n[rank4]: step 12\n", at=time.time())
    seen = Supervisor.progress(SimpleNamespace(run_dir=str(run_dir), output_steps=printed))
    assert sorted(seen) == ["3", "4"] and seen["3"][0] == 41 and seen["4"][0] == 12
