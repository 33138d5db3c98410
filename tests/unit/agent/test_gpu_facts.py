"""A node's GPUs from nvidia-smi (``facts``, against the stand-in on PATH),
and which of them a request gets (``choose``, pure)."""

from __future__ import annotations

import getpass
import os
import random
import time

import pytest

from fakesmi import fake_nvidia_smi, set_state, smi_on_path, state  # noqa: F401 (a fixture)
from orchestrator.agent.node import gpus
from orchestrator.agent.node.gpus import Unreadable, choose, mixed_models, parse_app, parse_gpu

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
V100 = "Tesla V100-SXM2-32GB"
NO_PID = 2 ** 30  # above any pid_max: never a process here
HEALTHY = "0, No, No, Default, 0x0000000000000001"  # idle: clocks down for no work only


# -- parsing the real CSV ---------------------------------------------------

def test_a_gpu_line_as_nvidia_smi_prints_it():
    line = ("0, GPU-5f1e4c1a-9a8b-4b52-8d3e-2f4a6b7c8d9e, 00000000:18:00.0, "
            f"NVIDIA H100 80GB HBM3, 81559, 1, 3, Disabled, 550.54.15, {HEALTHY}")
    assert parse_gpu(line) == {
        "index": 0, "uuid": "GPU-5f1e4c1a-9a8b-4b52-8d3e-2f4a6b7c8d9e",
        "bus_id": "00000000:18:00.0", "name": H100, "memory_total_mib": 81559,
        "memory_used_mib": 1, "utilization": 3, "mig": False, "driver": "550.54.15",
        "ecc_errors": 0, "retired_pending": False, "reset_required": False,
        "compute_mode": "Default", "throttle": 1, "fault": None}
    assert gpus.health(parse_gpu(line)) == [] and gpus.cautions(parse_gpu(line)) == []


def test_unknown_values_become_none_and_mig_is_only_enabled():
    mig = parse_gpu("3, GPU-a, 00000000:3B:00.0, NVIDIA A100-SXM4-40GB, 40960, 0, [N/A], "
                    f"Enabled, 535.104.05, {HEALTHY}")
    assert (mig["utilization"], mig["mig"]) == (None, True)
    odd = parse_gpu("1, [N/A], 00000000:01:00.0, NVIDIA GH200 480GB, [Not Supported], "
                    "[Not Supported], [N/A], [N/A], 560.35.03, [N/A], [N/A], [Not Supported], "
                    "[Unknown Error], [N/A]")
    assert (odd["uuid"], odd["memory_total_mib"], odd["memory_used_mib"], odd["mig"]) == \
        ("", None, None, False)
    assert (odd["ecc_errors"], odd["retired_pending"], odd["reset_required"],
            odd["compute_mode"], odd["throttle"]) == (None, None, None, None, None)
    assert gpus.lock_key(odd) == "index-1"
    assert gpus.health(odd) == []  # nothing known against it


def test_a_process_line_and_a_name_with_a_comma_in_it():
    app = parse_app(f"GPU-a, {os.getpid()}, /opt/tools, v2/python3, 20480")
    assert app == {"gpu_uuid": "GPU-a", "pid": os.getpid(), "name": "/opt/tools, v2/python3",
                   "used_mib": 20480, "user": getpass.getuser()}
    assert parse_app(f"GPU-a, {NO_PID}, python, [N/A]") == \
        {"gpu_uuid": "GPU-a", "pid": NO_PID, "name": "python", "used_mib": None, "user": None}


@pytest.mark.parametrize("line, words", [
    ("GPU 0: NVIDIA H100 (UUID: GPU-a)", "1 values for 14 fields"),
    (f"zero, GPU-a, 0:18:00.0, H100, 81559, 1, 3, Disabled, 550, {HEALTHY}",
     "index 'zero', not a number"),
    (f"0, GPU-a, 0:18:00.0, H100, 81559 MiB, 1, 3, Disabled, 550, {HEALTHY}",
     "memory.total '81559 MiB'"),
    ("0, GPU-a, 0:18:00.0, H100, 81559, 1, 3, Disabled, 550, 0, No, No, Default, hot",
     "clocks_throttle_reasons.active 'hot', not a bitmask"),
])
def test_a_line_not_in_the_asked_shape_is_unreadable(line, words):
    with pytest.raises(Unreadable, match=words):
        parse_gpu(line)


# -- facts against the stand-in ----------------------------------------------



def test_facts_reads_gpus_and_processes_with_their_users(smi_on_path):
    directory = smi_on_path([{"memory_used": 20480, "utilization": 97,
                          "processes": [{"pid": os.getpid(), "used_mib": 20000},
                                        {"pid": NO_PID, "used_mib": None, "name": "ghost"}]},
                         {"name": A100, "mig": True}])
    uuids = [g["uuid"] for g in state(directory)["hosts"]["local"]["gpus"]]
    got = gpus.facts()
    assert got["ok"] and got["driver"] == "550.54.15"
    assert [(g["index"], g["uuid"], g["name"], g["memory_used_mib"], g["utilization"], g["mig"])
            for g in got["gpus"]] == [(0, uuids[0], H100, 20480, 97, False),
                                      (1, uuids[1], A100, 0, None, True)]
    assert got["apps"] == [
        {"gpu_uuid": uuids[0], "pid": os.getpid(), "name": "python", "used_mib": 20000,
         "user": getpass.getuser()},
        {"gpu_uuid": uuids[0], "pid": NO_PID, "name": "ghost", "used_mib": None, "user": None}]


def test_facts_sees_the_gpus_change_between_calls(smi_on_path):
    directory = smi_on_path([{}])
    assert len(gpus.facts()["gpus"]) == 1
    set_state(directory, [{}, {}, {}])
    assert [g["index"] for g in gpus.facts()["gpus"]] == [0, 1, 2]


def test_no_gpu_is_an_answer_not_an_error(smi_on_path):
    smi_on_path([])
    assert gpus.facts() == {"ok": True, "driver": None, "gpus": [], "apps": []}


def test_a_failing_nvidia_smi_is_said_with_its_words_and_exit_status(smi_on_path):
    message = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    smi_on_path([{}], fail={"code": 9, "message": message})
    assert gpus.facts() == {"ok": False, "error": f"nvidia-smi --query-gpu: {message} (exit 9)"}


def test_a_long_failure_is_cut_to_300_characters(smi_on_path):
    smi_on_path([{}], fail={"code": 255, "message": "x" * 1000})
    error = gpus.facts()["error"]
    assert error == f"nvidia-smi --query-gpu: {'x' * 300} (exit 255)"


def test_a_hung_nvidia_smi_is_given_up_within_the_bound(smi_on_path):
    smi_on_path([{}], hang=True)
    start = time.monotonic()
    got = gpus.facts(timeout_s=0.5)
    assert got == {"ok": False, "error": "nvidia-smi --query-gpu: no answer within 0.5s"}
    assert time.monotonic() - start < 5


def test_a_gpu_whose_line_cannot_be_read_is_unusable_and_the_others_stay(smi_on_path):
    smi_on_path([{}, {"memory_used": "lots"}, {"garbled": "ERR! ERR! ERR!"}, {}])
    got = gpus.facts()
    assert got["ok"] and [g["index"] for g in got["gpus"]] == [0, 1, 3]
    assert got["gpus"][1]["unreadable"].startswith("nvidia-smi gave memory.used 'lots', not a "
                                                   "number")
    assert got["notes"] == ["a line nvidia-smi printed cannot be read: 'ERR! ERR! ERR!'"]
    assert gpus.health(got["gpus"][1])[0][0] == "unreadable"
    assert choose("free", got["gpus"], got["apps"])["chosen"] == [0, 3]
    refused = choose([1], got["gpus"], got["apps"])
    assert (refused["reason"], refused["waitable"]) == ("unhealthy", False)
    assert "GPU 1 (unknown model) is unfit: its line of nvidia-smi cannot be read" \
        in refused["error"]


def test_a_node_with_no_readable_gpu_is_refused_with_what_nvidia_smi_printed(smi_on_path):
    smi_on_path([{"garbled": "ERR!"}, {"garbled": "?"}])
    got = gpus.facts()
    assert got == {"ok": False, "error": "a line nvidia-smi printed cannot be read: 'ERR!'; "
                                         "a line nvidia-smi printed cannot be read: '?'"}


def test_no_nvidia_smi_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpus.facts() == {"ok": False, "absent": True, "error": "nvidia-smi not found on PATH"}


# -- choose -----------------------------------------------------------------

def gpu(index, name=H100, used=0, util=0, mig=False, uuid=None):
    return {"index": index, "uuid": f"GPU-{index}" if uuid is None else uuid,
            "bus_id": f"00000000:{0x18 + index:02X}:00.0", "name": name,
            "memory_total_mib": 81559, "memory_used_mib": used, "utilization": util, "mig": mig}


def app(index, pid, used=20480, name="python", user="alice"):
    return {"gpu_uuid": f"GPU-{index}", "pid": pid, "name": name, "used_mib": used, "user": user}


FOUR = [gpu(i) for i in range(4)]
BOB = {"run_id": "r-7", "user": "bob", "started": 1_750_000_000, "pid": 31, "host": "gpu01"}


def test_an_explicit_list_keeps_the_users_order():
    got = choose([3, 1], FOUR, [])
    assert got == {"ok": True, "chosen": [3, 1], "uuids": ["GPU-3", "GPU-1"],
                   "models": [H100, H100], "bus_ids": ["00000000:1B:00.0", "00000000:19:00.0"],
                   "notes": [], "free": [0, 1, 2, 3]}


def test_a_missing_gpu_is_named_with_what_there_is():
    got = choose([0, 9], FOUR, [])
    assert got == {"ok": False, "reason": "missing", "free": [0, 1, 2, 3], "waitable": False,
                   "error": "no GPU 9 on this node (nvidia-smi lists GPUs: 0,1,2,3); "
                            "free now: 0,1,2,3", "faults": []}


def test_a_mig_gpu_is_refused_naming_it_for_the_advice():
    got = choose([1], [gpu(0), gpu(1, A100, mig=True)], [])
    assert (got["reason"], got["waitable"], got["free"]) == ("mig", False, [0])
    assert got["error"] == (f"GPU 1 ({A100}) is in MIG mode: ddp-orch runs one rank per whole "
                            "GPU, and a MIG GPU is split into instances; free now: 0")
    assert got["faults"] == [{"index": 1, "reason": "mig"}]
    assert "CUDA_VISIBLE_DEVICES" not in got["error"]  # a reserved name: not advice to follow


def test_a_held_gpu_names_its_run_user_and_start():
    got = choose([2], FOUR, [], held={"GPU-2": BOB})
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(BOB["started"]))
    assert got == {"ok": False, "reason": "held", "free": [0, 1, 3], "waitable": True,
                   "error": f"GPU 2 ({H100}) is held by run r-7 of bob since {since} "
                            "(pid 31 on gpu01); free now: 0,1,3", "faults": []}
    assert choose([2], FOUR, [], held={"GPU-2": BOB}, allow_busy=True)["reason"] == "held"


def test_a_busy_gpu_names_each_process():
    apps = [app(2, 4242, 20480), app(2, 77, None, "ghost", None)]
    got = choose([2], FOUR, apps)
    assert got == {"ok": False, "reason": "busy", "free": [0, 1, 3], "waitable": True,
                   "error": f"GPU 2 ({H100}) is busy: pid 77 ghost (user unknown, memory "
                            "unknown), pid 4242 python (alice, 20480 MiB); free now: 0,1,3",
                   "faults": []}


def test_memory_used_by_no_visible_process_is_busy():
    got = choose([1], [gpu(0, used=30000), gpu(1, used=30000)], [])
    assert got["error"] == (f"GPU 1 ({H100}) is busy: 30000 MiB of 81559 MiB used, by no "
                            "process visible here (another container's?); none free now")


def test_the_memory_threshold_is_a_strict_bound():
    assert choose([0], [gpu(0, used=1024)], [])["ok"]
    assert choose([0], [gpu(0, used=1025)], [])["reason"] == "busy"
    assert choose([0], [gpu(0, used=5000)], [], threshold_mib=8000)["ok"]


def test_allow_busy_takes_it_and_says_so():
    got = choose([0, 2], FOUR, [app(2, 4242)], allow_busy=True)
    assert got["chosen"] == [0, 2]
    assert got["notes"] == [f"GPU 2 ({H100}) is busy, taken anyway: "
                            "pid 4242 python (alice, 20480 MiB)"]


def test_every_problem_is_said_and_the_gravest_is_the_reason():
    node = [gpu(0), gpu(1, mig=True), gpu(2), gpu(3)]
    got = choose([3, 2, 1, 7], node, [app(3, 10)], held={"GPU-2": BOB})
    assert (got["reason"], got["waitable"]) == ("missing", False)
    assert got["error"].startswith("no GPU 7 on this node (nvidia-smi lists GPUs: 0,1,2,3); "
                                   f"GPU 3 ({H100}) is busy: pid 10 ")
    got = choose([3, 2, 1], node, [app(3, 10)], held={"GPU-2": BOB})
    assert (got["reason"], got["waitable"]) == ("mig", False)
    assert ["GPU 3" in got["error"], "GPU 2" in got["error"], "GPU 1" in got["error"]] == \
        [True, True, True]
    got = choose([3, 2], node, [app(3, 10)], held={"GPU-2": BOB})
    assert (got["reason"], got["waitable"], got["free"]) == ("held", True, [0])


def test_all_takes_every_gpu_ascending_or_says_why_not():
    assert choose("all", list(reversed(FOUR)), [])["chosen"] == [0, 1, 2, 3]
    assert choose("all", FOUR, [], held={"GPU-1": BOB})["reason"] == "held"
    assert choose("all", FOUR, [app(1, 5)])["reason"] == "busy"
    assert choose("all", FOUR, [app(1, 5)], allow_busy=True)["chosen"] == [0, 1, 2, 3]
    assert choose("all", FOUR + [gpu(4, mig=True)], [])["reason"] == "mig"
    assert choose("all", [], []) == {"ok": False, "reason": "missing", "free": [],
                                     "waitable": False, "faults": [],
                                     "error": "nvidia-smi lists no GPU on this node; "
                                              "none free now"}


def test_free_takes_every_free_gpu():
    node = FOUR + [gpu(4, mig=True)]
    got = choose("free", node, [app(1, 5)], held={"GPU-3": BOB})
    assert got["chosen"] == [0, 2]


def test_free_with_none_free_can_wait_unless_there_is_no_gpu_at_all():
    got = choose("free", FOUR, [app(i, 5) for i in range(4)])
    assert (got["ok"], got["reason"], got["waitable"]) == (False, "short", True)
    assert got["error"].startswith("free asks for 1 free GPU; 0 are free on this node; GPU 0")
    got = choose("free", [], [])
    assert (got["reason"], got["waitable"]) == ("short", False)


def test_free_n_takes_least_memory_then_least_utilisation_then_lowest_index():
    node = [gpu(0, used=500), gpu(1, util=50), gpu(2, util=10), gpu(3, used=100), gpu(4, util=10)]
    assert choose("free:1", node, [])["chosen"] == [2]
    assert choose("free:2", node, [])["chosen"] == [2, 4]
    assert choose("free:3", node, [])["chosen"] == [1, 2, 4]
    assert choose("free:4", node, [])["chosen"] == [1, 2, 3, 4]


def test_free_n_prefers_one_model_to_a_better_mixed_set():
    node = [gpu(0), gpu(1, A100), gpu(2, A100), gpu(3, used=300), gpu(4, used=400)]
    got = choose("free:3", node, [])
    assert (got["chosen"], got["models"], got["notes"]) == ([0, 3, 4], [H100] * 3, [])


def test_free_n_between_models_that_can_each_supply_n_takes_the_one_whose_best_is_first():
    node = [gpu(0, A100, used=100), gpu(1, A100, used=100), gpu(2), gpu(3)]
    assert choose("free:2", node, [])["chosen"] == [2, 3]
    # H100 has three but only two are asked for: it supplies no more than A100
    node = [gpu(0, used=500), gpu(1, used=500), gpu(2, used=500), gpu(3, A100), gpu(4, A100)]
    assert choose("free:2", node, [])["chosen"] == [3, 4]


def test_free_n_with_no_model_enough_takes_the_biggest_then_the_best_others():
    node = [gpu(0, used=500), gpu(1, used=500), gpu(2, used=500),
            gpu(3, A100, util=5), gpu(4, A100), gpu(5, V100, util=1)]
    got = choose("free:4", node, [])
    assert got["chosen"] == [0, 1, 2, 4] and got["notes"] == []  # mixed: the gang says it
    assert mixed_models(got["models"]) == (f"mixed GPU models: 3x {H100}, 1x {A100}: "
                                           "the slowest paces every step")


def test_free_n_short_says_how_many_are_free_and_what_keeps_the_others():
    node = FOUR + [gpu(4, mig=True)]
    got = choose("free:3", node, [app(3, 4242)], held={"GPU-2": BOB})
    assert (got["reason"], got["waitable"], got["free"]) == ("short", True, [0, 1])
    assert got["error"].startswith("free:3 asks for 3 free GPUs; 2 are free on this node; "
                                   f"GPU 2 ({H100}) is held by run r-7 of bob since ")
    assert f"; GPU 3 ({H100}) is busy: pid 4242 python (alice, 20480 MiB); GPU 4 " \
        in got["error"]
    assert got["error"].endswith("; free now: 0,1")
    got = choose("free:5", node, [])
    assert (got["reason"], got["waitable"]) == ("short", False)
    assert "4 are free on this node, which has 4 GPUs outside MIG mode" in got["error"]


def test_free_n_on_a_node_with_exactly_n_gpus_can_wait_for_them():
    """N GPUs asked of a node that has exactly N: busy now, they can free
    up, so ``--wait-gpus`` waits; one more than the node has never can."""
    pair = [gpu(0), gpu(1)]
    got = choose("free:2", pair, [app(1, 4242)])
    assert (got["ok"], got["reason"], got["waitable"], got["free"]) == (False, "short", True, [0])
    got = choose("free", [gpu(0)], [app(0, 4242)])  # a one-GPU node, its GPU busy
    assert (got["reason"], got["waitable"]) == ("short", True)
    got = choose("free:3", pair, [])
    assert (got["reason"], got["waitable"]) == ("short", False)
    assert "2 are free on this node, which has 2 GPUs outside MIG mode" in got["error"]


def test_the_choice_does_not_depend_on_the_order_facts_come_in():
    node = [gpu(i, [H100, A100][i % 2], used=(i * 37) % 200, util=(i * 13) % 7)
            for i in range(8)]
    apps = [app(1, 11), app(6, 12), app(6, 3, name="other")]
    want = {request: choose(request, node, apps, held={"GPU-4": BOB})
            for request in ("free", "free:1", "free:2", "free:3", "free:4", "free:7", "all",
                            (6, 0))}
    shuffle = random.Random(29)
    for _ in range(20):
        node, apps = shuffle.sample(node, len(node)), shuffle.sample(apps, len(apps))
        for request, expected in want.items():
            assert choose(request, node, apps, held={"GPU-4": BOB}) == expected


def test_a_gpu_without_a_uuid_is_held_under_its_index():
    node = [gpu(0, uuid=""), gpu(1, uuid="")]
    assert choose("free", node, [], held={"index-1": BOB})["chosen"] == [0]


@pytest.mark.parametrize("request_", ["free:0", "free:x", "free:", "some", "ALL"])
def test_a_request_that_is_not_one_is_a_value_error(request_):
    with pytest.raises(ValueError, match="GPU request"):
        choose(request_, FOUR, [])


def test_mixed_models_counts_most_first():
    assert mixed_models(["H100", "A100", "H100"]) == \
        "mixed GPU models: 2x H100, 1x A100: the slowest paces every step"
    assert mixed_models(["H100", "H100"]) is None
    assert mixed_models([]) is None


def test_an_unreadable_holder_is_said_as_such():
    got = choose([1], FOUR, [], held={"GPU-1": {}})
    assert f"GPU 1 ({H100}) is held by another run (its lock record is unreadable)" \
        in got["error"]


def test_a_survivor_holding_gpu_memory_is_named_with_it(tmp_path, monkeypatch):
    from fakesmi import smi_on_path  # noqa: F401 (a fixture)

    from orchestrator.agent.node.supervisor import on_gpus, visible_gpus

    mine = os.getpid()
    directory = fake_nvidia_smi(tmp_path, [{}, {"processes": [{"pid": mine, "used_mib": 5120}]}])
    monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
    uuid = gpus.facts(5)["gpus"][1]["uuid"]
    assert on_gpus({mine: "python train.py", 1: "sleep 9"}) == {
        mine: f"python train.py (still holds 5120 MiB on GPU {uuid})", 1: "sleep 9"}
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}) == [3, 1]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == visible_gpus({}) == []
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-ab12"}) == []


def test_a_sample_is_each_asked_gpus_use_now_and_none_without_nvidia_smi(tmp_path, monkeypatch):
    from fakesmi import fake_nvidia_smi

    directory = fake_nvidia_smi(tmp_path, [{"utilization": 97, "memory_used": 40000}, {},
                                           {"utilization": 3, "memory_used": 10}])
    monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
    assert gpus.sample([2, 0], 5) == {"0": [97, 40000], "2": [3, 10]}
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert gpus.sample([0], 5) is None
