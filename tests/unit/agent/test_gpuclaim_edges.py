"""The edges of a node's part in a launch's GPUs (``agent/node/gpuclaim.py``)
that ``test_gpuclaim.py`` leaves open: each answer whole (its keys and its
words), a rehearsal whose indices are all or none on the node, the hold's
record and its retries, and torch's child: its environment, a hang, a
failure and its last words. Against the stand-in nvidia-smi
(``labs/fakesmi.py``), real locks, and a stand-in ``python`` for torch."""

from __future__ import annotations

import os

import pytest

from fakesmi import DRIVER, fake_nvidia_smi, state
from orchestrator.agent.node import gpuclaim, gpulocks
from orchestrator.agent.node.holdings import Holdings


@pytest.fixture
def node(tmp_path, monkeypatch):
    """GPUs 0-2 on PATH, GPU 2 with 500 MiB in use; locks in ``tmp_path``."""
    smi = fake_nvidia_smi(tmp_path / "smi", [{}, {}, {"memory_used": 500}])
    monkeypatch.setenv("PATH", smi + os.pathsep + os.environ["PATH"])
    locks = str(tmp_path / "locks")

    holdings = Holdings()

    def claim(want, hold=True, **kw):
        kw = {"run_id": "r1", "node_rank": 2, "busy_mib": 1024, "lock_dir": locks,
              "holdings": holdings if hold else None, **kw}
        return gpuclaim.claim(want, **kw)

    claim.locks, claim.uuids = locks, [g["uuid"] for g in state(smi)["hosts"]["local"]["gpus"]]
    claim.holdings = holdings
    yield claim
    holdings.release_gpus()


def test_an_answer_has_every_gpu_the_processes_and_the_driver_and_the_hold_its_node(node):
    answer = node([1])
    assert answer["ok"] and answer["chosen"] == [1]
    assert (answer["apps"], answer["driver"]) == ([], DRIVER)
    assert [g["index"] for g in answer["gpus"]] == [0, 1, 2]
    holder = gpulocks.holders([node.uuids[1]], node.locks)[node.uuids[1]]
    assert (holder["run_id"], holder["node_rank"]) == ("r1", 2)
    look = node([0], hold=False)
    assert (look["apps"], look["driver"]) == ([], DRIVER)


def test_another_runs_hold_is_shown_on_its_gpu(node):
    with gpulocks.hold([node.uuids[0]], {"run_id": "other"}, node.locks):
        answer = node("all", hold=False, allow_busy=True)
        assert answer["gpus"][0]["held_by"]["run_id"] == "other"
        assert "held_by" not in answer["gpus"][1]


def test_the_busy_threshold_is_the_requests_and_busy_gpus_are_refused_unless_allowed(node):
    assert node([2], busy_mib=100)["reason"] == "busy"  # 500 MiB used is over 100
    assert node([2], busy_mib=1024)["ok"]  # and under 1024
    node.holdings.release_gpus()
    assert node([2], busy_mib=100, allow_busy=True)["ok"]


def test_a_gpu_taken_between_the_look_and_the_lock_is_looked_at_again(node, monkeypatch):
    hold, tries = gpulocks.hold, []

    def taken_once(keys, holder, directory):
        tries.append(keys)
        if len(tries) == 1:
            raise gpulocks.Held(keys[0], {"run_id": "quick"})
        return hold(keys, holder, directory)

    monkeypatch.setattr(gpulocks, "hold", taken_once)
    assert node("free:1")["ok"] and len(tries) == 2


def test_gpus_taken_at_every_try_are_a_refusal_that_can_wait(node, monkeypatch):
    def always_taken(keys, holder, directory):
        raise gpulocks.Held(keys[0], None)

    monkeypatch.setattr(gpulocks, "hold", always_taken)
    assert node("free:1") == {
        "ok": False, "reason": "held", "waitable": True, "free": [],
        "error": "other runs kept taking these GPUs while this one chose (3 tries)"}


def test_a_hung_nvidia_smi_is_given_up_after_smi_timeout_s(tmp_path, monkeypatch):
    smi = fake_nvidia_smi(tmp_path / "smi", [{}], hang=True)
    monkeypatch.setenv("PATH", smi + os.pathsep + os.environ["PATH"])
    monkeypatch.setattr(gpuclaim, "SMI_TIMEOUT_S", 0.5)
    answer = gpuclaim.claim([0], run_id="r", node_rank=0, busy_mib=1024)
    assert (answer["ok"], answer["reason"], answer["waitable"], answer["free"]) == (
        False, "smi-failed", False, [])


# -- rehearsals ---------------------------------------------------------------------------------

def test_a_rehearsal_whose_indices_are_all_on_the_node_is_a_plain_claim(node):
    answer = node([1, 0], rehearsal=True)
    assert answer["chosen"] == [1, 0] and len(answer["uuids"]) == 2
    assert not any("CPU rehearsal" in note for note in answer["notes"])


def test_a_rehearsal_of_indices_none_on_the_node_holds_nothing_and_says_so(node):
    assert node([7, 9], rehearsal=True) == {
        "ok": True, "gpus": [], "chosen": [7, 9], "uuids": [], "models": [],
        "notes": ["a CPU rehearsal: GPU 7,9 is not on this node, and its index runs a CPU "
                  "process"]}


def test_a_rehearsals_real_gpus_are_claimed_as_asked(node):
    """Its node rank on the hold, its busy rule, its hold or look."""
    assert node([2, 8], rehearsal=True, busy_mib=100)["reason"] == "busy"
    answer = node([8, 2], rehearsal=True, busy_mib=100, allow_busy=True)
    assert answer["ok"] and answer["chosen"] == [8, 2] and len(answer["gpus"]) == 3
    assert answer["notes"][-1] == ("a CPU rehearsal: GPU 8 is not on this node, and its index "
                                   "runs a CPU process")
    holder = gpulocks.holders([node.uuids[2]], node.locks)[node.uuids[2]]
    assert (holder["run_id"], holder["node_rank"]) == ("r1", 2)
    node.holdings.release_gpus()
    node([0, 8], rehearsal=True, hold=False)
    assert gpulocks.holders([node.uuids[0]], node.locks)[node.uuids[0]] is None


# -- without nvidia-smi ----------------------------------------------------------------------------

def test_without_nvidia_smi_the_answers_whole(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpuclaim.claim([1, 0], run_id="r", node_rank=0, busy_mib=1024) == {
        "ok": True, "chosen": [1, 0], "uuids": [], "models": [], "gpus": [], "smi": "absent",
        "notes": ["nvidia-smi is not on this node's PATH: GPUs 1,0 are taken as listed, with "
                  "no busy check and no hold against other runs"]}
    assert gpuclaim.claim("free:2", run_id="r", node_rank=0, busy_mib=1024) == {
        "ok": False, "reason": "no-smi", "waitable": False, "free": [],
        "error": "gpus: free:2 needs nvidia-smi to see which GPUs there are and which are "
                 "free, and it is not on this node's PATH"}


# -- torch's child ---------------------------------------------------------------------------------

def python(tmp_path, body: str) -> str:
    """A stand-in ``python`` for the probe: a shell script, whatever it is asked."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_the_probe_sees_every_gpu_in_bus_order_and_reads_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    probe = gpuclaim.TorchProbe(python(tmp_path, (
        'read line; echo "{\\"cvd\\": \\"${CUDA_VISIBLE_DEVICES-unset}\\", '
        '\\"order\\": \\"$CUDA_DEVICE_ORDER\\", \\"stdin\\": \\"$line\\"}"\n')))
    assert probe.result() == {"ok": True, "cvd": "unset", "order": "PCI_BUS_ID", "stdin": ""}


def test_a_probe_that_fails_says_its_last_line_of_300_characters_at_most(tmp_path):
    last = "E" * 100 + "x" * 300
    probe = gpuclaim.TorchProbe(python(tmp_path, (
        f'echo \'{{"torch": "2.1"}}\'\necho "Traceback" >&2\necho "{last}" >&2\nexit 1\n')))
    assert probe.result() == {"ok": False, "error": "x" * 300}
    quiet = gpuclaim.TorchProbe(python(tmp_path / ".." / tmp_path.name, "exit 3\n"))
    assert quiet.result() == {"ok": False, "error": "exit 3"}


def test_a_probe_that_says_no_json_is_a_failure_in_its_words(tmp_path):
    probe = gpuclaim.TorchProbe(python(tmp_path, 'echo "not json"\necho "why" >&2\n'))
    assert probe.result() == {"ok": False, "error": "why"}


def test_a_probe_that_hangs_is_given_up_and_ended(tmp_path):
    probe = gpuclaim.TorchProbe(python(tmp_path, "exec sleep 30\n"))
    assert probe.result(timeout_s=0.5) == {"ok": False, "error": "asking torch took over 0.5s"}
    assert probe.child.returncode is not None  # killed, and reaped
