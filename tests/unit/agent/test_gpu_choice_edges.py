"""The edges of a node's GPU choice (``agent/node/gpus.choose`` and its
words) that ``test_gpu_facts.py`` leaves open: the order free GPUs are taken
in when a value is unknown or ties, GPUs with no model name, a refusal's
words in the singular and the plural, a holder's record however little of
it there is, and what a chosen GPU without a UUID answers. Pure: every GPU
is a hand-made dict (nvidia-smi's parsing is ``test_gpu_facts.py``'s)."""

from __future__ import annotations

import time

import pytest

from orchestrator.agent.node.gpus import choose, describe_holder, mixed_models


def gpu(index, name="H100", used=0, util=0, **more):
    return {"index": index, "uuid": f"GPU-{index}", "bus_id": f"b{index}", "name": name,
            "memory_total_mib": 81559, "memory_used_mib": used, "utilization": util, **more}


# -- which free GPUs are taken ---------------------------------------------------------------------

def test_free_gpus_are_taken_known_memory_first_then_least_used_then_known_utilisation():
    assert choose("free:1", [gpu(0, used=None), gpu(1, used=100)], [])["chosen"] == [1]
    assert choose("free:1", [gpu(0, used=1), gpu(1, used=0)], [])["chosen"] == [1]
    assert choose("free:1", [gpu(0, util=None), gpu(1, util=50)], [])["chosen"] == [1]
    assert choose("free:1", [gpu(0, util=1), gpu(1, util=0)], [])["chosen"] == [1]


def test_gpus_with_no_model_name_are_one_model_taken_together():
    """Two GPUs nvidia-smi names nothing and one H100 better placed: free:2
    takes the two of one (unknown) model, not a mixed pair."""
    node = [gpu(0, used=0), {**gpu(1, used=100), "name": ""},
            {k: v for k, v in gpu(2, used=100).items() if k != "name"}]
    assert choose("free:2", node, [])["chosen"] == [1, 2]


def test_a_chosen_gpu_with_no_uuid_model_or_bus_id_answers_empty_strings():
    bare = {"index": 0, "memory_used_mib": 0}
    answer = choose([0], [bare], [])
    assert (answer["uuids"], answer["models"], answer["bus_ids"]) == ([""], [""], [""])


# -- a refusal's words -------------------------------------------------------------------------------

def test_too_few_free_gpus_are_said_in_the_singular_and_the_plural():
    busy = [{"gpu_uuid": f"GPU-{i}", "pid": 9, "name": "python", "used_mib": 1, "user": "u"}
            for i in (1, 2)]
    two = choose("free:2", [gpu(0), gpu(1), gpu(2)], busy)["error"]
    assert two.startswith("free:2 asks for 2 free GPUs; 1 is free on this node; GPU 1 (H100)")
    one = choose("free:1", [gpu(0)], [{**busy[0], "gpu_uuid": "GPU-0"}])["error"]
    assert one.startswith("free:1 asks for 1 free GPU; 0 are free on this node; GPU 0 (H100)")
    lone = choose("free:2", [gpu(0)], [])["error"]
    assert lone.startswith("free:2 asks for 2 free GPUs; 1 is free on this node, which has 1 "
                           "GPU outside MIG mode")


def test_a_node_with_exactly_the_gpus_asked_does_not_say_it_has_too_few():
    answer = choose("free:2", [gpu(0), gpu(1, used=5000)], [])
    assert "outside MIG mode" not in answer["error"]


def test_missing_gpus_are_listed_and_a_node_without_any_says_none():
    assert choose([5, 6], [], [])["error"] == ("no GPU 5,6 on this node (nvidia-smi lists GPUs: "
                                               "none); none free now")


def test_a_gpu_with_no_model_name_and_a_process_with_no_name():
    app = {"gpu_uuid": "GPU-0", "pid": 9, "used_mib": 100, "user": "bob"}
    error = choose([0], [{**gpu(0), "name": None}], [app])["error"]
    assert error == "GPU 0 (unknown model) is busy: pid 9 ? (bob, 100 MiB); none free now"


def test_memory_used_by_no_process_on_a_gpu_of_unknown_size():
    error = choose([0], [{**gpu(0, used=7000), "memory_total_mib": None}], [])["error"]
    assert error == ("GPU 0 (H100) is busy: 7000 MiB used, by no process visible here "
                     "(another container's?); none free now")


def test_a_mig_gpu_is_refused_with_the_way_to_use_it():
    error = choose([0], [gpu(0, mig=True)], [])["error"]
    assert error == ("GPU 0 (H100) is in MIG mode: ddp-orch runs one rank per whole GPU, and "
                     "a MIG GPU is split into instances; none free now")


def test_gpus_of_no_model_name_are_counted_as_unknown_models():
    assert mixed_models(["H100", "", ""]) == ("mixed GPU models: 2x unknown model, 1x H100: "
                                              "the slowest paces every step")


# -- a holder -------------------------------------------------------------------------------------

@pytest.mark.parametrize("holder, words", [
    ({}, "another run (its lock record is unreadable)"),
    ({"pid": 0}, "run ? of ?"),
    ({"run_id": "r", "user": "u", "started": "yesterday"}, "run r of u since yesterday"),
    ({"run_id": "r", "user": "u", "started": True}, "run r of u since True"),
    ({"run_id": "r", "user": "u", "host": "gpu01"}, "run r of u (gpu01)"),
    ({"run_id": "r", "user": "u", "pid": 31}, "run r of u (pid 31)"),
])
def test_a_holder_is_said_with_what_its_record_has(holder, words):
    assert describe_holder(holder) == words


def test_a_holders_start_time_is_local_to_the_second():
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(1_750_000_000))
    assert describe_holder({"run_id": "r", "user": "u", "started": 1_750_000_000.7}) == \
        f"run r of u since {when}"
