"""A GPU's health as the driver reports it, and a node whose nvidia-smi
answers in part (``agent/node/gpus.py``): against the stand-in nvidia-smi
(``tests/labs/fakesmi.py``), which prints each value as the real one does,
and the pure choice with each rule, ``gpu_policy.ignore``, ``exclude`` and
the utilisation rule."""

from __future__ import annotations

import os

import pytest

from fakesmi import smi_on_path  # noqa: F401 (a fixture)
from orchestrator.agent.node import gpus
from orchestrator.agent.node.gpus import cautions, choose, health, health_cell

H100 = "NVIDIA H100 80GB HBM3"




# -- what the driver reports, read per GPU ---------------------------------------

def test_each_health_value_is_read_per_gpu(smi_on_path):
    smi_on_path([{}, {"ecc_errors": 2}, {"retired_pending": True}, {"remapped_pending": True},
             {"remapped_failed": True}, {"reset_required": True},
             {"compute_mode": "Prohibited"}, {"compute_mode": "Exclusive_Process"},
             {"throttle": 0x40 | 0x1}, {"ecc_errors": None, "remapped_pending": None,
                                        "remapped_failed": None}])
    got = gpus.facts()
    assert got["ok"] and "notes" not in got and "unreported" not in got
    rules = [[rule for rule, _ in health(g)] for g in got["gpus"]]
    assert rules == [[], ["ecc"], ["retired_pages"], ["remapped_rows"], ["remapped_rows"],
                     ["reset"], ["compute_mode"], [], [], []]
    assert [health(g)[0][1] for g in got["gpus"][1:7]] == [
        "2 uncorrected ECC errors since the driver loaded", "memory pages pending retirement",
        "a row remapping pending", "a failed row remapping", "nvidia-smi says it needs a reset",
        "compute mode Prohibited: no process may use it"]
    assert [health_cell(g) for g in got["gpus"]] == [
        "ok", "2 ECC errors", "pages to retire", "row remap pending", "row remap failed",
        "needs reset", "compute prohibited", "exclusive mode",
        "throttled (HW thermal slowdown)", "ok"]
    assert cautions(got["gpus"][7]) == ["compute mode Exclusive_Process: one process at a time; "
                                        "a second CUDA context on it fails"]
    assert cautions(got["gpus"][8]) == ["clocks held down (HW thermal slowdown): it may pace "
                                        "every step"]
    assert (got["gpus"][9]["ecc_errors"], got["gpus"][9]["remapped_pending"]) == (None, None)


def test_a_gpu_that_needs_a_reset_is_unfit_though_it_uses_no_memory(smi_on_path):
    """nvidia-smi prints ``[GPU requires reset]`` in place of its values: 0
    MiB used would have made it the first GPU ``free:1`` picks."""
    smi_on_path([{"memory_used": 300}, {"fault": "reset", "memory_used": 0}, {"fault": "lost"}])
    got = gpus.facts()
    faulty = got["gpus"][1]
    assert (faulty["fault"], faulty["memory_used_mib"], faulty["utilization"]) == \
        ("needs a reset", None, None)
    assert health(faulty) == [("reset", "nvidia-smi says it needs a reset")]
    assert health(got["gpus"][2]) == [("reset", "nvidia-smi says it is lost to the driver")]
    assert choose("free:1", got["gpus"], got["apps"])["chosen"] == [0]
    assert choose("all", got["gpus"], got["apps"])["chosen"] == [0]


def test_an_infoROM_warning_keeps_every_gpu_with_its_words(smi_on_path):
    """Exit 14 with the table printed: a warning, not a failure."""
    smi_on_path([{}, {"inforom": True}])
    got = gpus.facts()
    assert got["ok"] and [g["index"] for g in got["gpus"]] == [0, 1]
    assert got["notes"] == ["WARNING: infoROM is corrupted at gpu 00000000:19:00.0",
                            "nvidia-smi --query-gpu exited 14",
                            "nvidia-smi --query-compute-apps exited 14"]


def test_a_gpu_off_the_bus_is_left_out_and_the_others_stay_usable(smi_on_path):
    """Exit 15 and a line for the GPU it cannot reach: the rest is read."""
    smi_on_path([{}, {"off_bus": True}, {"processes": [{"pid": 4242, "used_mib": 900}]}])
    got = gpus.facts()
    assert got["ok"] and [g["index"] for g in got["gpus"]] == [0, 2]
    assert got["notes"][0] == ("Unable to determine the device handle for GPU00000000:19:00.0: "
                               "Unknown Error")
    assert [a["pid"] for a in got["apps"]] == [4242]
    refused = choose([1], got["gpus"], got["apps"])
    assert refused["reason"] == "missing" and "nvidia-smi lists GPUs: 0,2" in refused["error"]


def test_only_a_node_with_no_readable_gpu_is_refused(smi_on_path):
    smi_on_path([{"off_bus": True}, {"off_bus": True}])
    got = gpus.facts()
    assert got == {"ok": False, "error": "nvidia-smi --query-gpu: Unable to determine the device "
                                         "handle for GPU00000000:19:00.0: Unknown Error "
                                         "(exit 15)"}


def test_an_older_nvidia_smi_is_asked_what_it_knows_and_the_rest_is_said(smi_on_path):
    """A driver without reset_status (before R530) or the newer clock name:
    the query is asked again without it, each value unknown."""
    smi_on_path({"local": {"gpus": [{"reset_required": True, "throttle": 0x8}],
                       "unknown_fields": ["reset_status.reset_required",
                                          "clocks_throttle_reasons.active"]}})
    got = gpus.facts()
    assert got["ok"] and got["unreported"] == ["reset_status.reset_required"]
    gpu = got["gpus"][0]
    assert (gpu["reset_required"], gpu["throttle"]) == (None, 0x8)  # read as the newer name
    smi_on_path({"local": {"gpus": [{}], "unknown_fields": [
        "clocks_throttle_reasons.active", "clocks_event_reasons.active", "compute_mode"]}})
    got = gpus.facts()
    assert got["unreported"] == ["compute_mode", "clocks_throttle_reasons.active"]
    assert (got["gpus"][0]["throttle"], got["gpus"][0]["compute_mode"]) == (None, None)


def test_a_core_field_refused_is_a_failure_not_a_guess(smi_on_path):
    smi_on_path({"local": {"gpus": [{}], "unknown_fields": ["memory.used"]}})
    assert gpus.facts() == {"ok": False, "error": 'nvidia-smi --query-gpu: Field "memory.used" '
                                                  'is not a valid field to query. (exit 2)'}


def test_a_sample_skips_a_line_it_cannot_read(smi_on_path):
    smi_on_path([{"utilization": 7}, {"off_bus": True}, {"fault": "reset"}])
    assert gpus.sample([0, 1, 2], 5) == {"0": [7, 0], "2": [None, None]}


# -- the choice with health, exclusions and utilisation ------------------------------

def gpu(index, **values):
    return {"index": index, "uuid": f"GPU-{index}", "bus_id": "", "name": H100,
            "memory_total_mib": 81559, "memory_used_mib": 0, "utilization": 0, "mig": False,
            **values}


NODE = [gpu(0, ecc_errors=1, memory_used_mib=0), gpu(1, memory_used_mib=10), gpu(2),
        gpu(3, reset_required=True)]


def test_an_unhealthy_gpu_is_never_taken_by_free_or_all():
    assert choose("free:2", NODE, [])["chosen"] == [1, 2]
    assert choose("free", NODE, [])["chosen"] == [1, 2]
    got = choose("all", NODE, [])
    assert got["chosen"] == [1, 2]
    assert got["notes"] == [
        f"all: GPU 0 ({H100}) is unfit: 1 uncorrected ECC error since the driver loaded, "
        "left out",
        f"all: GPU 3 ({H100}) is unfit: nvidia-smi says it needs a reset, left out"]
    short = choose("free:3", NODE, [])
    assert (short["reason"], short["waitable"]) == ("short", False)
    assert "which has 2 GPUs that may be taken at all (outside MIG mode, fit and not " \
           "excluded)" in short["error"]


def test_a_listed_unhealthy_gpu_is_refused_naming_what_is_wrong_and_its_rules():
    got = choose([3, 0, 1], NODE, [])
    assert (got["reason"], got["waitable"]) == ("unhealthy", False)
    assert got["error"] == (f"GPU 3 ({H100}) is unfit: nvidia-smi says it needs a reset; "
                            f"GPU 0 ({H100}) is unfit: 1 uncorrected ECC error since the driver "
                            "loaded; free now: 1,2")
    assert got["faults"] == [{"index": 3, "reason": "unhealthy", "rules": ["reset"]},
                             {"index": 0, "reason": "unhealthy", "rules": ["ecc"]}]
    # --allow-busy-gpus is about someone's process, never about a broken GPU
    assert choose([3], NODE, [], allow_busy=True)["reason"] == "unhealthy"


def test_a_site_may_relax_a_rule():
    assert choose([0], NODE, [], ignore=["ecc"])["ok"]
    assert choose("free:3", NODE, [], ignore=("ecc",))["chosen"] == [0, 1, 2]
    assert choose([3], NODE, [], ignore=["ecc"])["reason"] == "unhealthy"
    assert health(gpu(0, unreadable="x"), ignore=gpus.HEALTH_RULES)[0][0] == "unreadable"


def test_an_excluded_gpu_is_taken_out_by_hand():
    node = [gpu(0), gpu(1), gpu(2)]
    assert choose("free", node, [], exclude=[1])["chosen"] == [0, 2]
    assert choose("all", node, [], exclude=[1])["chosen"] == [0, 2]
    got = choose([1, 2], node, [], exclude=[1])
    assert (got["reason"], got["waitable"]) == ("excluded", False)
    assert got["error"] == f"GPU 1 ({H100}) is taken out by gpu_policy.exclude; free now: 0,2"
    assert choose("all", node, [], exclude=[0, 1, 2])["reason"] == "excluded"


def test_a_gpu_at_work_with_little_memory_is_busy():
    """Another container's job at 100% with under 1 GiB: not free."""
    node = [gpu(0, utilization=100, memory_used_mib=700), gpu(1, utilization=50), gpu(2)]
    assert choose("free", node, [])["chosen"] == [1, 2]  # 50% is not more than 50%
    got = choose([0], node, [])
    assert got["reason"] == "busy" and got["waitable"]
    assert got["error"].startswith(f"GPU 0 ({H100}) is busy: 100% utilised (more than "
                                   "gpu_policy.busy_utilization, 50%), by no process visible "
                                   "here (another container's?)")
    assert choose("free", node, [], busy_util=100)["chosen"] == [0, 1, 2]
    assert choose("free", node, [], busy_util=10)["chosen"] == [2]


def test_a_gpu_whose_clocks_are_held_down_is_taken_last_and_said():
    node = [gpu(0, throttle=0x80), gpu(1, memory_used_mib=500), gpu(2, memory_used_mib=900)]
    assert choose("free:2", node, [])["chosen"] == [1, 2]
    got = choose("free:3", node, [])
    assert got["notes"] == [f"GPU 0 ({H100}): clocks held down (HW power brake slowdown): it "
                            "may pace every step"]
    exclusive = choose([1], [gpu(0), gpu(1, compute_mode="Exclusive_Process")], [])
    assert exclusive["ok"] and "compute mode Exclusive_Process" in exclusive["notes"][0]


def test_idle_clocks_and_power_cap_are_no_caution():
    assert cautions(gpu(0, throttle=0x1 | 0x4)) == []
