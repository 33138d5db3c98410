"""A node's part in a launch's GPUs (``agent/node/gpuclaim.py``), against the
stand-in nvidia-smi (``tests/labs/fakesmi.py``) and real locks in a
temporary directory: what a request gets, what is held, what is refused."""

from __future__ import annotations

import os

import pytest

from fakecuda import libcuda  # noqa: F401 (a fixture)
from fakesmi import fake_nvidia_smi
from orchestrator.agent.node import gpuclaim, gpulocks
from orchestrator.agent.node.holdings import Holdings


@pytest.fixture
def node(tmp_path, monkeypatch):
    """Four idle GPUs on PATH, locks in ``tmp_path/locks``; every hold let go after."""
    directory = fake_nvidia_smi(tmp_path / "smi", [{}, {}, {"memory_used": 9000}, {}])
    monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
    locks = str(tmp_path / "locks")
    holdings = Holdings()

    def claim(want, hold=True, **kw):
        return gpuclaim.claim(want, run_id=kw.pop("run_id", "r1"), node_rank=0, busy_mib=1024,
                              lock_dir=locks, holdings=holdings if hold else None, **kw)

    claim.holdings = holdings
    yield claim, locks
    holdings.release_gpus()


def held(locks: str, answer: dict) -> dict:
    return {uuid: (who or {}).get("run_id") for uuid, who in
            gpulocks.holders([g["uuid"] for g in answer["gpus"]], locks).items()}


def test_a_claim_holds_what_it_chose_and_another_run_gets_the_rest(node):
    claim, locks = node
    first = claim("free:2")
    assert first["ok"] and first["chosen"] == [0, 1]
    assert list(held(locks, first).values()) == ["r1", "r1", None, None]
    second = claim("free", run_id="r2")
    assert second["chosen"] == [3]  # GPU 2 is busy (9000 MiB)
    refused = claim([1], run_id="r3")
    assert not refused["ok"] and refused["reason"] == "held" and refused["waitable"]
    assert "run r1 of" in refused["error"]
    claim.holdings.release_gpus()
    assert set(held(locks, first).values()) == {None}


def test_a_look_without_a_hold_locks_nothing(node):
    claim, locks = node
    answer = claim("all", hold=False, allow_busy=True)
    assert answer["chosen"] == [0, 1, 2, 3] and set(held(locks, answer).values()) == {None}


def test_a_rehearsal_may_list_indices_the_node_lacks_and_holds_the_real_ones(node):
    claim, locks = node
    assert claim([0, 7])["reason"] == "missing"
    answer = claim([7, 0], rehearsal=True)
    assert answer["ok"] and answer["chosen"] == [7, 0] and answer["uuids"] == []
    assert "GPU 7 is not on this node" in answer["notes"][-1]
    assert list(held(locks, answer).values()) == ["r1", None, None, None]


def test_without_nvidia_smi_a_list_goes_unheld_and_a_request_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    listed = gpuclaim.claim([1, 0], run_id="r", node_rank=0, busy_mib=1024,
                            lock_dir=str(tmp_path / "locks"))
    assert listed["ok"] and listed["chosen"] == [1, 0] and listed["smi"] == "absent"
    assert "no busy check and no hold" in listed["notes"][0]
    asked = gpuclaim.claim("free:1", run_id="r", node_rank=0, busy_mib=1024)
    assert (asked["ok"], asked["reason"], asked["waitable"]) == (False, "no-smi", False)


def test_a_failing_nvidia_smi_is_a_refusal_with_what_it_said(tmp_path, monkeypatch):
    directory = fake_nvidia_smi(tmp_path, [{}], fail={"code": 9, "message": "driver gone"})
    monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
    answer = gpuclaim.claim([0], run_id="r", node_rank=0, busy_mib=1024)
    assert (answer["ok"], answer["reason"]) == (False, "smi-failed")
    assert answer["error"].startswith("nvidia-smi failed: ") and "driver gone" in answer["error"]
    assert "(exit 9)" in answer["error"]


def stub_torch(tmp_path, version_py: str, init: str = "raise ImportError('imported')\n"):
    """A ``torch`` package with this ``version.py`` and ``__init__``, first on the path."""
    package = tmp_path / "stub" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    (package / "version.py").write_text(version_py)
    return {"PYTHONPATH": str(tmp_path / "stub")}


def test_torchs_build_is_read_without_importing_it_and_the_driver_asked(tmp_path, monkeypatch):
    for key, value in stub_torch(tmp_path, "__version__ = '2.14.1+cpu'\n"
                                           "cuda: Optional[str] = None\nhip = None\n").items():
        monkeypatch.setenv(key, value)
    seen = gpuclaim.TorchProbe().result()
    assert seen.pop("nccl", None) in (None, *installed_nccl())
    assert seen == {"ok": True, "torch": "2.14.1+cpu", "cuda": None, "available": False}


def test_a_cuda_build_without_a_driver_sees_no_gpu_and_says_why(tmp_path, monkeypatch):
    for key, value in stub_torch(tmp_path, "__version__ = '2.14.1+cu130'\n"
                                           "cuda: Optional[str] = '13.0'\n").items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))  # this machine has no libcuda
    seen = gpuclaim.TorchProbe().result()
    assert (seen["ok"], seen["cuda"], seen["available"]) == (True, "13.0", False)
    assert seen["why"].startswith("no CUDA driver here (libcuda.so.1")


def test_a_build_it_cannot_read_is_imported(tmp_path, monkeypatch):
    init = ("__version__ = '6.0+rocm'\nclass version:\n    cuda = None\n"
            "class cuda:\n    is_available = staticmethod(lambda: True)\n"
            "    device_count = staticmethod(lambda: 8)\n")
    for key, value in stub_torch(tmp_path, "__version__ = '6.0+rocm'\ncuda = None\n"
                                           "hip: Optional[str] = '6.0'\n", init).items():
        monkeypatch.setenv(key, value)
    assert gpuclaim.TorchProbe().result() == {"ok": True, "torch": "6.0+rocm", "cuda": None,
                                              "available": True, "count": 8}


def installed_nccl() -> list[str]:
    from importlib import metadata

    return [d.version for d in metadata.distributions()
            if (d.metadata["Name"] or "").lower().startswith("nvidia-nccl")]


CUDA_BUILD = "__version__ = '2.14.1+cu124'\ncuda: Optional[str] = '12.4'\n"


def test_the_driver_says_each_gpus_compute_capability_in_pci_order(tmp_path, monkeypatch,
                                                                   libcuda):
    for key, value in stub_torch(tmp_path, CUDA_BUILD).items():
        monkeypatch.setenv(key, value)
    libcuda(caps=("8.0", "9.0", "12.0"), driver=12080)
    seen = gpuclaim.TorchProbe().result()
    assert (seen["available"], seen["count"], seen["caps"], seen["driver_cuda"]) == \
        (True, 3, ["8.0", "9.0", "12.0"], "12.8")
    assert "cuda_error" not in seen and "why" not in seen


@pytest.mark.parametrize("answers, error", [
    ({"init": 999}, {"call": "cuInit", "code": 999}),
    ({"init": 100}, {"call": "cuInit", "code": 100}),
    ({"count_rc": 3}, {"call": "cuDeviceGetCount", "code": 3}),
])
def test_a_driver_that_fails_its_first_calls_says_which_and_with_what(tmp_path, monkeypatch,
                                                                     libcuda, answers, error):
    """cuInit's 999 is nvidia-uvm not loaded (its own fix), not a torch
    without CUDA; cuDeviceGetCount's code is read too, not a count of 0."""
    from orchestrator.engine.gpuplan import torch_fix, torch_problem

    for key, value in stub_torch(tmp_path, CUDA_BUILD).items():
        monkeypatch.setenv(key, value)
    libcuda(**answers)
    seen = gpuclaim.TorchProbe().result()
    assert (seen["available"], seen["cuda_error"]) == (False, error)
    problem = torch_problem(seen, {"chosen": [0]})
    assert f"its CUDA driver fails {error['call']} with {error['code']}" in problem
    if error["code"] == 999:
        assert "nvidia-uvm" in torch_fix(seen) and "CUDA build of torch" not in torch_fix(seen)


def test_a_driver_older_than_torchs_cuda_major_is_no_gpu_with_its_fix(tmp_path, monkeypatch,
                                                                     libcuda):
    from orchestrator.engine.gpuplan import torch_fix

    for key, value in stub_torch(tmp_path, CUDA_BUILD).items():
        monkeypatch.setenv(key, value)
    libcuda(driver=11080)
    seen = gpuclaim.TorchProbe().result()
    assert seen["available"] is False and "driver supports CUDA 11.8" in seen["why"]
    assert torch_fix(seen).startswith("upgrade the node's NVIDIA driver to one for CUDA 12.4")
