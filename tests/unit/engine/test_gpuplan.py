"""Unit tests of engine/gpuplan.py: what each node is asked for its GPUs,
the wait for free ones (on a fake clock), the gang's decision from the
nodes' answers, and the words of every refusal and note."""

from __future__ import annotations

import textwrap

import pytest

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
    got = wait_for_gpus(HELD, lambda: next(replies), 60, said.append, "node 1 (b)")
    assert got is OK
    assert clock.slept == [2.0] * 6  # asked six times, two seconds apart
    assert said == ["node 1 (b): waiting up to 60s more for GPUs: GPU 3 is held by run x",
                    "node 1 (b): waiting up to 54s more for GPUs: GPU 3 is held by run x"]


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
                   "error": "GPU 2 is busy (pid 9 python (bob, 30000 MiB))"}}
    with pytest.raises(ConfigError) as caught:
        refuse(plan, spec, replies, 30)
    error = caught.value
    assert str(error).startswith("c.yaml:5: nodes[1].gpus: node 1 (b): GPU 2 is busy "
                                 "(pid 9 python (bob, 30000 MiB)) (waited 30s)")
    assert (error.path, error.line, error.source) == ("nodes[1].gpus", 5, "c.yaml")
    assert error.hint == ("gpus: 6,7 are free there now; --wait-gpus SECONDS waits for them; "
                          "--allow-busy-gpus goes anyway")
    with pytest.raises(ConfigError) as unwaited:
        refuse(plan, spec, replies, 0)
    assert "(waited" not in str(unwaited.value)


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
    ({"reason": "held", "free": [0]}, "gpus: 0 are free there now; --wait-gpus SECONDS waits "
                                      "for them"),
    ({"reason": "short", "free": []}, "--wait-gpus SECONDS waits for them"),
    ({"reason": "busy"}, "--wait-gpus SECONDS waits for them; --allow-busy-gpus goes anyway"),
    ({"reason": "missing", "free": [1, 2]}, "gpus: 1,2 are free there now; or set `device: "
                                            "cpu` for a CPU rehearsal (the listed GPUs become "
                                            "CPU processes)"),
    ({"reason": "missing"}, "or set `device: cpu` for a CPU rehearsal (the listed GPUs become "
                            "CPU processes)"),
    ({"reason": "other"}, "see `ddp-orch check` for the node's GPUs"),
    ({"reason": "no-smi"}, "list the GPUs by index (gpus: 0,1), or install the NVIDIA "
                           "utilities there"),
    ({"reason": "smi-failed"}, "run nvidia-smi on that node: the driver must answer before a "
                               "GPU run can start"),
    ({"reason": "mig", "free": [0], "faults": [{"index": 1, "reason": "mig"}]},
     "gpus: 0 are free there now; GPU 1 is in MIG mode: turn it off once nothing runs on it "
     "(`sudo nvidia-smi -i 1 -mig 0`, then reset it), or leave its MIG instances to a launcher "
     "that takes MIG UUIDs (Slurm's gres)"),
    ({"reason": "excluded", "free": [], "faults": [{"index": 3, "reason": "excluded"}]},
     "GPU 3 is taken out by gpu_policy.exclude: remove it there to use it"),
    ({"reason": "unhealthy", "free": [2], "faults": [
        {"index": 0, "reason": "unhealthy", "rules": ["ecc"]},
        {"index": 1, "reason": "unhealthy", "rules": ["compute_mode", "unreadable"]}]},
     "gpus: 2 are free there now; GPU 0: reset it once nothing runs on it (`sudo nvidia-smi -r "
     "-i 0`) or reboot the node (uncorrected errors count since the driver loaded); GPU 1: "
     "`sudo nvidia-smi -i 1 -c DEFAULT` lets processes use it; GPU 1: run `nvidia-smi -q -i 1` "
     "there: if the driver cannot read it, drain the node; gpu_policy: {ignore: [ecc, "
     "compute_mode]} takes such GPUs anyway, at your risk"),
])
def test_each_refusal_has_its_hint(reply, words):
    assert hint(reply) == words


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
    advice = hint(refused)
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
