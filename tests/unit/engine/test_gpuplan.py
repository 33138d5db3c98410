"""Unit tests of engine/gpuplan.py: what each node is asked for its GPUs,
the wait for free ones (on a fake clock), the gang's decision from the
nodes' answers, and the words of every refusal and note."""

from __future__ import annotations

import textwrap

import pytest
from wording import shared_words

from orchestrator.config.loader import load_cluster_text
from orchestrator.engine import gpuplan
from orchestrator.engine.gpuplan import (choices, decide_device, gpu_request, hint, node_notes,
                                         notes, refuse, torch_problem, wait_for_gpus,
                                         wants_torch)
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan
from orchestrator.plan.model import GpuChoice

FILE = """\
    gpu_policy: {busy_memory_mib: 2048, busy_utilization: 90, ignore: ecc, exclude: ['b:4', 'a:7', 'b:0'],
                 lock_dir: /var/lock/gpus}
    nodes:
      - {host: a, gpus: '5,1,3'}
      - {host: b, gpus: free:2}
      - {host: c, procs: 2}
    workload: {name: linear}
    """
TORCH_OK = {"ok": True, "torch": "2.6.0", "cuda": "12.4", "available": True, "count": 8}


def spec_plan(text: str = FILE):
    spec = load_cluster_text(textwrap.dedent(text), source="c.yaml")
    return spec, build_plan(spec, run_id="r1", local_run_dir="/tmp/runs/r1")


def gpu_spec_plan(device: str = "auto"):
    return spec_plan(f"device: {device}\nnodes:\n  - {{host: a, gpus: '0,1'}}\n"
                     "  - {host: b, gpus: free:2}\nworkload: {name: linear}\n")


# what a node is asked -----------------------------------------------------------------


def test_each_node_is_asked_for_its_list_in_order_or_its_request():
    spec, plan = spec_plan()
    a, b, c = plan.nodes
    policy = {"busy_util": 90, "ignore": ["ecc"], "lock_dir": "/var/lock/gpus"}
    assert gpu_request(plan, a, spec, False) == {
        "want": [5, 1, 3], "run_id": "r1", "node_rank": 0, "busy_mib": 2048,
        "allow_busy": False, "rehearsal": True, "exclude": [7], **policy}
    assert gpu_request(plan, b, spec, True) == {
        "want": "free:2", "run_id": "r1", "node_rank": 1, "busy_mib": 2048, "allow_busy": True,
        "rehearsal": True, "exclude": [4, 0], **policy}
    assert gpu_request(plan, c, spec, False) is None  # CPU processes
    local = gpu_request(plan, b, None, False)  # --local without a file: the defaults
    assert (local["busy_mib"], "busy_util" in local, "lock_dir" in local) == (1024, False, False)


def test_torch_is_asked_on_gpu_nodes_unless_the_run_is_on_cpu():
    _, plan = spec_plan()
    assert [wants_torch(plan, n) for n in plan.nodes] == [False, False, False]  # procs: cpu
    _, plan = gpu_spec_plan("auto")
    assert [wants_torch(plan, n) for n in plan.nodes] == [True, True]
    _, plan = gpu_spec_plan("cpu")
    assert [wants_torch(plan, n) for n in plan.nodes] == [False, False]


# waiting --------------------------------------------------------------------------------


class Clock:
    """time.monotonic and time.sleep for ``wait_for_gpus``, without waiting."""

    def __init__(self):
        self.now = 1000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(gpuplan.time, "monotonic", fake.monotonic)
    monkeypatch.setattr(gpuplan.time, "sleep", fake.sleep)
    monkeypatch.setattr(gpuplan, "WAIT_POLL_S", 2.0)
    monkeypatch.setattr(gpuplan, "WAIT_SAY_S", 5.0)
    return fake


HELD = {"ok": False, "waitable": True, "reason": "held", "error": "GPU 3 is held by run x"}
OK = {"ok": True, "chosen": [3, 4]}


def test_a_wait_asks_again_until_the_gpus_are_free_and_says_so_every_say_interval(clock):
    replies = iter([HELD] * 5 + [OK])
    said: list[str] = []
    got = wait_for_gpus(HELD, lambda: next(replies), 60, said.append, "node 1 (b)", "free:2")
    assert got is OK
    assert clock.slept == [2.0] * 6  # asked six times, two seconds apart
    # no GPU listing in the refusal: its own words stand for who holds them
    assert said == ["node 1 (b): waiting for free:2 (none free): GPU 3 is held by run x; "
                    "up to 1m00s more",
                    "node 1 (b): waiting for free:2 (none free): GPU 3 is held by run x; "
                    "up to 54s more"]


H100 = "NVIDIA H100 80GB HBM3"
BOB = {"run_id": "train-b", "user": "bob", "started": 1764000000, "pid": 7, "host": "gpu-a"}
LISTING = [{"index": 0, "name": H100, "uuid": "U0", "held_by": BOB},
           {"index": 1, "name": H100, "uuid": "U1", "held_by": BOB},
           {"index": 2, "name": H100, "uuid": "U2", "memory_used_mib": 40960},
           {"index": 3, "name": H100, "uuid": "U3", "memory_used_mib": 5000},
           {"index": 4, "name": H100, "uuid": "U4", "memory_used_mib": 0}]
APPS = [{"gpu_uuid": "U2", "pid": 48211, "name": "python", "user": "alice", "used_mib": 40960}]


def test_a_waits_line_says_each_holder_once_whatever_the_gpus_it_holds():
    """Issue #45: a wait repeated the holder's whole text (run, user, start,
    pid and host) for every GPU, about 600 characters a node every 30 s."""
    short = {"ok": False, "reason": "short", "waitable": True, "free": [4], "gpus": LISTING,
             "apps": APPS, "error": "free:3 asks for 3 free GPUs; 1 is free on this node; ..."}
    assert gpuplan.waiting_words(short, "free:3") == (
        "waiting for free:3 (free now: 4): GPUs 0,1 held by run train-b of bob; GPU 2 busy: "
        "pid 48211 python (alice); GPU 3 busy: 5000 MiB in use, by no process visible here")
    listed = {**short, "reason": "held", "free": [2, 4]}
    assert gpuplan.waiting_words(listed, [1, 4]) == \
        "waiting for GPUs 1,4 (free now: 2,4): GPU 1 held by run train-b of bob"


def test_a_waits_line_takes_nothing_a_node_sent_on_trust():
    """The listing crosses the network: an entry that is no GPU with an
    index is left out, and a name too long is cut short."""
    listing = [None, {"uuid": "U9"}, {"index": "1", "held_by": BOB},
               {"index": 2, "held_by": {"run_id": "r" * 500, "user": "bob"}}]
    words = gpuplan.waiting_words({"free": [], "gpus": listing}, "free:1")
    assert words == f"waiting for free:1 (none free): GPU 2 held by run {'r' * 57}... of bob"


def test_a_waits_line_names_three_holders_then_counts_the_rest():
    listing = [{"index": k, "uuid": f"U{k}", "held_by": {"run_id": f"r{k}", "user": "u"}}
               for k in range(5)]
    words = gpuplan.waiting_words({"free": [], "gpus": listing}, "all")
    assert words == ("waiting for all (none free): GPU 0 held by run r0 of u; GPU 1 held by run "
                     "r1 of u; GPU 2 held by run r2 of u; and 2 more holders")


def test_the_end_of_a_wait_names_each_node_that_waited_and_for_how_long():
    _, plan = spec_plan()
    assert gpuplan.wait_over(plan, {1: 130.2}) == "GPUs free after 2m10s on node 1 (b): starting"
    assert gpuplan.wait_over(plan, {1: 4, 0: 61}) == \
        "GPUs free after 1m01s on node 0 (a), 4s on node 1 (b): starting"


def test_a_wait_gives_up_at_its_deadline_with_the_last_answer(clock):
    asked = []

    def ask():
        asked.append(clock.now)
        return dict(HELD, error=f"still held at {clock.now:g}")

    got = wait_for_gpus(HELD, ask, 7, lambda line: None, "node 0 (a)")
    assert not got["ok"] and got["error"] == "still held at 1007"
    assert clock.slept == [2.0, 2.0, 2.0, 1.0]  # the last sleep ends at the deadline
    assert clock.now == 1007.0


@pytest.mark.parametrize("first", [
    OK, {"ok": False, "waitable": False, "reason": "missing", "error": "no GPU 9"}, HELD])
def test_nothing_waits_for_an_answer_waiting_cannot_change_or_with_no_wait(clock, first):
    wait = 0 if first is HELD else 60
    assert wait_for_gpus(first, lambda: pytest.fail("asked again"), wait,
                         lambda line: pytest.fail("said"), "n") is first
    assert clock.slept == []


# the answers --------------------------------------------------------------------------


def test_choices_takes_the_ok_answers_in_their_order():
    replies = {0: {"ok": True, "chosen": ["5", 1], "uuids": ["U5", "U1"], "models": ["H", "H"]},
               1: {"ok": False, "error": "no"},
               2: {"ok": True, "chosen": [2]}}
    assert choices(replies) == {0: GpuChoice((5, 1), ("U5", "U1"), ("H", "H")),
                                2: GpuChoice((2,), (), ())}


def test_a_refusal_names_the_node_at_its_gpus_line_with_the_free_gpus_to_paste():
    spec, plan = spec_plan()
    replies = {0: {"ok": True, "chosen": [5, 1, 3]},
               1: {"ok": False, "reason": "busy", "waitable": True, "free": [6, 7],
                   "error": "GPU 2 is busy (pid 9 python (bob, 30000 MiB)); free now: 6,7"}}
    with pytest.raises(ConfigError) as caught:
        refuse(plan, spec, replies, 30)
    error = caught.value
    assert str(error).startswith("c.yaml:5: nodes[1].gpus: node 1 (b): GPU 2 is busy "
                                 "(pid 9 python (bob, 30000 MiB)); free now: 6,7 (waited 30s)")
    assert (error.path, error.line, error.source) == ("nodes[1].gpus", 5, "c.yaml")
    assert error.hint == ('launch on those now (gpus: "6,7"), wait longer than 30s '
                          "(--wait-gpus SECONDS) or go on the busy ones anyway "
                          "(--allow-busy-gpus; never on another run's)")
    with pytest.raises(ConfigError) as unwaited:
        refuse(plan, spec, replies, 0)
    assert "(waited" not in str(unwaited.value)


def test_a_refusal_on_two_nodes_names_both_once_each_at_their_lines():
    """Issue #45: GPUs held on two nodes named only the first."""
    spec, plan = spec_plan()
    replies = {1: {"ok": False, "reason": "held", "waitable": True, "free": [],
                   "error": "GPU 0 (H100) is held by run x of bob; none free now"},
               0: {"ok": False, "reason": "held", "waitable": True, "free": [3],
                   "error": "GPU 5 (H100) is held by run x of bob; free now: 3"}}
    with pytest.raises(ConfigError) as caught:
        refuse(plan, spec, replies, 0)
    error = caught.value
    assert str(error).splitlines() == [
        "c.yaml:4: nodes[0].gpus: node 0 (a): GPU 5 (H100) is held by run x of bob; free now: 3",
        "  c.yaml:5: nodes[1].gpus: node 1 (b): GPU 0 (H100) is held by run x of bob; none "
        "free now",
        '  hint: launch on those now (node 0: gpus: "3") or wait for them '
        "(--wait-gpus SECONDS)"]
    assert (error.path, error.line) == ("nodes[0].gpus", 4)


def test_a_refusal_without_a_file_is_the_gpus_option():
    _, plan = spec_plan()
    with pytest.raises(ConfigError) as caught:
        refuse(plan, None, {0: {"ok": False, "reason": "missing", "error": "no GPU 9 here"}}, 0)
    assert (caught.value.path, caught.value.source) == ("--gpus", "command line")
    assert "node 0 (a): no GPU 9 here" in str(caught.value)


def test_refuse_passes_when_every_node_said_yes():
    spec, plan = spec_plan()
    assert refuse(plan, spec, {0: {"ok": True}, 1: {"ok": True}}, 0) is None


@pytest.mark.parametrize("reply, words", [
    ({"reason": "held", "free": [0]}, 'launch on those now (gpus: "0") or wait for them '
                                      "(--wait-gpus SECONDS)"),
    ({"reason": "short", "free": []}, "wait for them (--wait-gpus SECONDS)"),
    ({"reason": "busy"}, "wait for them (--wait-gpus SECONDS) or go on the busy ones anyway "
                         "(--allow-busy-gpus; never on another run's)"),
    ({"reason": "missing", "free": [1, 2]}, 'launch on those now (gpus: "1,2") or set `device: '
                                            "cpu` for a CPU rehearsal (the listed GPUs become "
                                            "CPU processes)"),
    ({"reason": "missing"}, "set `device: cpu` for a CPU rehearsal (the listed GPUs become CPU "
                            "processes)"),
    ({"reason": "other"}, "`ddp-orch check` shows each node's GPUs, who holds them and who "
                          "uses them"),
    ({"reason": "no-smi"}, "list the GPUs by index (gpus: 0,1), or install the NVIDIA "
                           "utilities there"),
    ({"reason": "smi-failed"}, "run nvidia-smi on that node: the driver must answer before a "
                               "GPU run can start"),
    ({"reason": "mig", "free": [0], "faults": [{"index": 1, "reason": "mig"}]},
     'launch on those now (gpus: "0"); GPU 1: turn MIG off once nothing runs on it '
     "(`sudo nvidia-smi -i 1 -mig 0`, then reset it), or leave its instances to a launcher "
     "that takes MIG UUIDs (Slurm's gres)"),
    ({"reason": "excluded", "free": [], "faults": [{"index": 3, "reason": "excluded"}]},
     "GPU 3 is taken out by gpu_policy.exclude: remove it there to use it"),
    ({"reason": "unhealthy", "free": [2], "faults": [
        {"index": 0, "reason": "unhealthy", "rules": ["ecc"]},
        {"index": 1, "reason": "unhealthy", "rules": ["compute_mode", "unreadable"]}]},
     'launch on those now (gpus: "2"); GPU 0: reset' " it once nothing runs on it (`sudo nvidia-smi -r "
     "-i 0`) or reboot the node (uncorrected errors count since the driver loaded); GPU 1: "
     "`sudo nvidia-smi -i 1 -c DEFAULT` lets processes use it; GPU 1: run `nvidia-smi -q -i 1` "
     "there: if the driver cannot read it, drain the node; gpu_policy: {ignore: [ecc, "
     "compute_mode]} takes such GPUs anyway, at your risk"),
])
def test_each_refusal_has_its_hint(reply, words):
    assert hint({0: reply}) == words


def test_a_hint_says_what_to_do_not_again_what_is_free():
    """Issue #45: each hint adds something its message does not say. The
    message says which GPUs are free now ("free now: 0,1,6", the agent's
    words); the hint was "gpus: 0,1,6 are free there now; ...": the same
    fact again. Now it says what to do with them."""
    from orchestrator.agent.node.gpus import choose

    listing = [{"index": k, "name": "H100", "uuid": f"U{k}", "memory_used_mib": 0}
               for k in range(4)]
    busy = choose([3], listing, [{"gpu_uuid": "U3", "pid": 5, "name": "python", "user": "al",
                                  "used_mib": 9000}], threshold_mib=1024, held={})
    assert busy["error"].endswith("free now: 0,1,2")
    words = hint({0: busy})
    assert "free" not in words
    assert words.startswith('launch on those now (gpus: "0,1,2")')


@pytest.mark.parametrize("faults", [
    [{"index": 1, "reason": "mig"}], [{"index": 3, "reason": "excluded"}],
    [{"index": 0, "reason": "unhealthy", "rules": ["reset"]}],
    [{"index": 0, "reason": "unhealthy", "rules": ["remapped_rows"]}],
])
def test_a_hint_adds_what_its_message_does_not_say(faults):
    """The refusal says what is wrong; its hint says what to do, in words
    the message has not used (it once repeated the MIG refusal), and never
    sets a reserved variable the file refuses."""
    from orchestrator.agent.node.gpus import choose

    gpus = [{"index": i, "uuid": f"G{i}", "name": "H100", "memory_used_mib": 0,
             "utilization": 0, "mig": False} for i in range(4)]
    fault = faults[0]
    if fault["reason"] == "mig":
        gpus[1]["mig"] = True
    elif fault["reason"] == "unhealthy":
        gpus[0]["reset_required" if fault["rules"] == ["reset"] else "remapped_failed"] = True
    refused = choose([fault["index"]], gpus, [], exclude=[3])
    assert refused["faults"] == faults
    advice = hint({0: refused})
    message_words = set(refused["error"].lower().replace(";", " ").split())
    new = [w for w in advice.lower().replace(";", " ").split() if w not in message_words]
    assert len(new) >= 8, (refused["error"], advice)
    assert "CUDA_VISIBLE_DEVICES" not in advice


# the device --------------------------------------------------------------------------------


def test_auto_becomes_cuda_when_every_nodes_torch_sees_its_gpus():
    spec, plan = gpu_spec_plan("auto")
    replies = {0: {"ok": True, "chosen": [0, 1], "torch": TORCH_OK},
               1: {"ok": True, "chosen": [6, 7], "torch": TORCH_OK}}
    assert decide_device(plan, spec, replies) == "cuda"
    spec, plan = gpu_spec_plan("cuda")
    assert decide_device(plan, spec, replies) is None  # nothing to decide
    assert decide_device(plan, spec, {0: {"ok": True, "chosen": [0]}}) is None  # torch not asked


@pytest.mark.parametrize("seen, words", [
    ({"ok": True, "torch": "2.6.0+cpu", "cuda": None, "available": False},
     "its torch 2.6.0+cpu is built without CUDA"),
    ({"ok": True, "torch": "2.6.0", "cuda": "12.4", "available": False},
     "its torch 2.6.0 (CUDA 12.4) sees no GPU"),
    ({"ok": False, "error": "No module named 'torch'"},
     "its torch did not answer: No module named 'torch'"),
    ({**TORCH_OK, "count": 2}, "its torch sees 2 GPU(s) (indices 0-1), and GPU 6,7 is not "
                               "among them"),
])
def test_a_node_whose_torch_cannot_is_named_and_nothing_falls_back_to_cpu(seen, words):
    spec, plan = gpu_spec_plan("auto")
    replies = {0: {"ok": True, "chosen": [0, 1], "torch": TORCH_OK},
               1: {"ok": True, "chosen": [6, 7], "torch": seen}}
    assert torch_problem(seen, replies[1]) == words
    with pytest.raises(ConfigError) as caught:
        decide_device(plan, spec, replies)
    error = caught.value
    assert f"nodes[1].gpus: node 1 (b): device auto, but {words}" in str(error)
    assert (error.path, error.line) == ("nodes[1].gpus", 4)
    assert error.hint == ("install a CUDA build of torch there, or set `device: cpu` for a CPU "
                          "rehearsal (each GPU index a CPU process) (the node's python: python3)")


def test_torch_seeing_enough_gpus_is_no_problem():
    assert torch_problem({**TORCH_OK, "count": 8}, {"chosen": [7, 0]}) is None


# notes ----------------------------------------------------------------------------------------

MIXED_LINE = "mixed GPU models: 3x H100, 1x A100: the slowest paces every step"


def test_mixed_models_are_said_once_for_the_gang_and_not_per_node():
    _, plan = gpu_spec_plan("auto")
    replies = {0: {"ok": True, "models": ["H100", "H100"],
                   "notes": ["GPU 1 is at 95% utilisation"]},
               1: {"ok": True, "models": ["H100", "A100"], "notes": []}}
    assert notes(plan, replies) == ["node 0 (a): GPU 1 is at 95% utilisation",
                                    f"warning: {MIXED_LINE}"]
    same = {0: {"ok": True, "models": ["H100"]}, 1: {"ok": True, "models": ["H100"]}}
    assert notes(plan, same) == []


def test_a_missing_nvidia_smi_is_a_note_on_gpus_and_nothing_on_a_cpu_rehearsal():
    no_smi = {"ok": True, "smi": "absent", "notes": ["no nvidia-smi: indices as listed"]}
    _, cpu = gpu_spec_plan("cpu")
    assert node_notes(cpu, no_smi) == [] and notes(cpu, {0: no_smi}) == []
    _, gpu = gpu_spec_plan("auto")
    assert node_notes(gpu, no_smi) == ["no nvidia-smi: indices as listed"]
    with_torch = {**no_smi, "notes": [], "torch": {**TORCH_OK, "count": 4}}
    assert notes(gpu, {1: with_torch}) == [
        "node 1 (b): no nvidia-smi; its torch sees 4 GPU(s), so the launch goes on from "
        "torch's count"]


_LISTING = [{"index": k, "name": "H100", "uuid": f"U{k}", "memory_used_mib": 0}
            for k in range(4)]


@pytest.mark.parametrize("request_, listing, apps, held", [
    ([3], _LISTING, [{"gpu_uuid": "U3", "pid": 5, "name": "python", "user": "al",
                      "used_mib": 9000}], {}),  # busy
    ([1], _LISTING, [], {"U1": {"run_id": "r", "user": "bob"}}),  # held
    ("free:4", _LISTING, [], {"U0": {"run_id": "r", "user": "bob"}}),  # short
    ([7], _LISTING, [], {}),  # missing
    ([0], [{**_LISTING[0], "mig": True}], [], {}),
], ids=["busy", "held", "short", "missing", "mig"])
def test_each_gpu_hint_adds_what_its_message_does_not_say(request_, listing, apps, held):
    """Issue #45, on the node's own words (``gpus.choose``): no hint shares a
    run of four words with its refusal."""
    from orchestrator.agent.node.gpus import choose

    reply = choose(request_, listing, apps, threshold_mib=1024, held=held)
    assert not reply["ok"]
    assert not shared_words(reply["error"], hint({0: reply})), (reply["error"], hint({0: reply}))


# what crosses the network ------------------------------------------------------


@pytest.mark.parametrize("reply", [
    None, {"ok": "yes"}, {"ok": True, "chosen": []}, {"ok": True, "chosen": [0, 0]},
    {"ok": True, "chosen": [True]}, {"ok": True, "chosen": [0], "uuids": ["a", "b"]},
    {"ok": False}, {"ok": True, "chosen": [0], "torch": {"count": "8"}},
])
def test_a_malformed_gpus_answer_names_the_node(reply):
    with pytest.raises(gpuplan.TransportError) as caught:
        gpuplan.checked(reply, "gpu-b")
    assert "gpu-b" in str(caught.value) and "malformed" in str(caught.value)


def test_an_answer_without_torch_is_malformed_where_the_node_was_asked_it():
    """A wait's last answer decides ``device: auto``: one that lacks the
    torch answer the node was asked for cannot be decided on."""
    ended = {"ok": True, "chosen": [0]}
    assert gpuplan.checked(ended, "a") is ended  # torch not asked: fine
    with pytest.raises(gpuplan.TransportError, match="malformed"):
        gpuplan.checked(ended, "a", torch=True)
    with_torch = {**ended, "torch": TORCH_OK}
    assert gpuplan.checked(with_torch, "a", torch=True) is with_torch
    refused = {"ok": False, "error": "busy", "free": [1], "waitable": True}
    with pytest.raises(gpuplan.TransportError):
        gpuplan.checked(refused, "a", torch=True)


# what the launch checks of the answers it has ------------------------------------------

@pytest.mark.parametrize("cap, arch, expected", [
    ("8.6", ["sm_75", "sm_80", "sm_86", "sm_90"], None),
    ("8.9", ["sm_80", "sm_86", "sm_90"], None),  # sm_86 cubins run on 8.9 (same major)
    ("9.0", ["sm_90a"], None), ("10.0", ["sm_90a", "sm_100"], None),
    ("12.0", ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"], True),
    ("9.0", ["sm_80", "sm_86", "compute_86"], False),  # PTX, compiled at first use
    ("6.1", ["sm_75", "sm_80"], True),  # too old for the build
    ("8.0", ["sm_86"], True),  # a newer minor's cubin does not run on an older GPU
    ("9.1", ["sm_90a"], True),  # an `a` cubin runs on exactly its GPU
    (None, ["sm_80"], None), ("8.0", None, None), ("8.0", [], None), ("x", ["sm_80"], None),
])
def test_a_gpus_compute_capability_against_its_torchs_arch_list(cap, arch, expected):
    from orchestrator.engine.gpuplan import kernel_problem

    found = kernel_problem(cap, arch)
    assert (found[0] if found else None) is expected
    if expected:
        assert "no kernel image is available" in found[1]


def limits_reply(chosen, shm=24105, memlock=None, rdma=(), **torch):
    return {"ok": True, "chosen": chosen, "limits": {"shm_mib": shm, "memlock_kib": memlock,
                                                     "rdma": list(rdma)},
            "torch": {**TORCH_OK, **torch}}


def test_the_launch_checks_what_check_does_from_the_answers_it_has():
    spec, plan = gpu_spec_plan()
    fine = {0: limits_reply([0, 1], caps=["9.0", "9.0"], arch=["sm_90"]),
            1: limits_reply([2, 3], caps=["9.0"] * 4, arch=["sm_90"])}
    assert gpuplan.gang_checks(plan, spec, fine) == []
    differ = {0: fine[0], 1: limits_reply([2, 3], torch="2.5.1")}
    with pytest.raises(ConfigError) as caught:
        gpuplan.gang_checks(plan, spec, differ)
    assert "torch differs between nodes (node 0 (a): 2.6.0, node 1 (b): 2.5.1)" in \
        str(caught.value)
    assert caught.value.path == "python" and "ddp-orch check" in caught.value.hint
    warned = gpuplan.gang_checks(plan, spec, {
        0: limits_reply([0, 1], shm=64, nccl="2.21.5", driver_cuda="12.2"),
        1: limits_reply([2, 3], memlock=8192, rdma=["mlx5_0"], nccl="2.20.5")})
    assert warned[0].startswith("warning: NCCL differs between nodes (node 0 (a): 2.21.5, "
                                "node 1 (b): 2.20.5)")
    assert warned[1].startswith("warning: node 0 (a): its driver supports CUDA 12.2, older than "
                                "the CUDA 12.4 its torch was built with: it runs")
    assert warned[2].startswith("warning: node 0 (a): /dev/shm is 64 MiB for 2 ranks")
    assert "--shm-size=1g" in warned[2]
    assert warned[3].startswith("warning: node 1 (b): its locked-memory limit is 8192 KiB with "
                                "InfiniBand (mlx5_0)")
    assert len(warned) == 4


def test_a_gpu_its_torch_has_no_kernel_for_is_refused_at_its_nodes_line():
    spec, plan = gpu_spec_plan()
    replies = {0: limits_reply([0, 1], caps=["9.0", "12.0"], arch=["sm_80", "sm_90"]),
               1: limits_reply([2, 3])}
    with pytest.raises(ConfigError) as caught:
        gpuplan.gang_checks(plan, spec, replies)
    assert "nodes[0].gpus: node 0 (a): GPU 1's compute capability 12.0 has no kernel in its " \
           "torch (built for sm_80 sm_90)" in str(caught.value)
    assert "install a torch built for sm_120 on a" in caught.value.hint


def test_shm_is_no_matter_for_one_rank_and_memlock_none_without_infiniband():
    from orchestrator.engine.gpuplan import limit_problems

    assert limit_problems({"shm_mib": 64, "memlock_kib": 64, "rdma": []}, 1) == []
    assert len(limit_problems({"shm_mib": 64, "memlock_kib": None, "rdma": ["mlx5_0"]}, 2)) == 1
    assert limit_problems({"shm_mib": 512, "memlock_kib": None, "rdma": ["mlx5_0"]}, 8) == []
    assert limit_problems(None, 8) == []
