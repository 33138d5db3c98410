"""The failure hints (orchestrator/records/hints.py) on real error lines.

The Gloo lines were produced here: two torchrun nodes in a network lab
(tests/labs/netlab.py), host names on 127.0.1.1 and no GLOO_SOCKET_IFNAME; a
GLOO_SOCKET_IFNAME the hosts lack; GLOO_SOCKET_IFNAME=docker0; node 1 with
no route to node 0. The NCCL lines are quoted from public reports
(pytorch/pytorch, NVIDIA/nccl, awslabs/awsome-distributed-ai issues): this
machine has no GPU. Each failure goes through the code that builds the
root cause (``nodestate._failure_reason``) before the hint reads it.
"""

from __future__ import annotations

import dataclasses

from orchestrator.engine.nodestate import _failure_reason
import pytest

from orchestrator.records.hints import (CUDA_DRIVER_ERRORS, PYTHON, cuda_error_words, failure_hint,
                                        gpu_hint, hint_for, transport_hint)
from orchestrator.records.outcome import EndReason, NodeOutcome, NodeState, WorkerFailure


GLOO_LOOPBACK = (
    "RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
    "remote=[127.0.1.1]:7569$0")


GLOO_DOCKER0 = (
    "RuntimeError: Gloo connectFullMesh failed with [/__w/pytorch/pytorch/third_party/gloo/"
    "gloo/transport/tcp/pair.cc:152] timed out connecting: SO_ERROR: Connection refused, "
    "remote=[172.17.0.1]:45483$1")


GLOO_NO_IFACE = (
    "RuntimeError: [enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/"
    "device.cc:84] ifa != nullptr. Unable to find address for: eth9")


GLOO_ELSEWHERE = GLOO_LOOPBACK.replace("127.0.1.1]:7569", "10.77.3.11]:44291")


GLOO_RECV_TIMEOUT = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 10000ms for recv operation to complete")


STORE_UNREACHABLE = (  # torchrun's store client on node 1, which had no route to node 0
    "torch.distributed.DistNetworkError: The client socket has failed to connect to any "
    "network address of (10.77.84.10, 29555). The client socket has failed to connect to "
    "145.85.0.0:10007 (errno: 113 - No route to host).")


NCCL_LOOPBACK = (  # awslabs/awsome-distributed-ai#192
    "DistBackendError: NCCL error in: /opt/conda/conda-bld/pytorch_1696588393313/work/torch/"
    "csrc/distributed/c10d/ProcessGroupNCCL.cpp:1331, unhandled system error (run with "
    "NCCL_DEBUG=INFO for details), NCCL version 2.18.5\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
    "device error. \nLast error:\n"
    "socketStartConnect: Connect to 127.0.0.1<45069> failed : Software caused connection abort")


NCCL_NO_ROUTE = (  # hkproj/pytorch-transformer-distributed#1
    "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1333, "
    "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.6\n"
    "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
    "device error. \nLast error:\n"
    "socketStartConnect: Connect to 192.168.19.14<52822> failed : No route to host")


NCCL_SYSTEM = (  # pytorch/pytorch#149984: no address in the error at all
    "DistBackendError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for "
    "details), NCCL version 2.25.1\nncclSystemError: System call (e.g. socket, malloc) or "
    "external library call failed or device error. \nLast error:\n")


NCCL_NO_IFACE = (  # NCCL_SOCKET_IFNAME naming nothing on the host
    "DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:317, "
    "internal error - please report this issue to the NCCL developers, NCCL version 2.19.3\n"
    "ncclInternalError: Internal check failed.\nLast error:\n"
    "Bootstrap : no socket interface found")


def failed(node_rank: int, host: str, message: str, code: int = 1) -> NodeOutcome:
    """A node whose rank 0 failed with ``message``, with the reason the
    controller builds for it (the shim's error file adds the user's frame)."""
    failure = {"local_rank": 0, "message": message + " (train.py:12)", "timestamp": 1.0,
               "error_file": "torchrun/x/attempt_0/0/error.json"}
    typed = WorkerFailure.from_dict(failure)
    reason = _failure_reason(code, (typed,), node_rank, [])
    return NodeOutcome(node_rank, host, NodeState.FAILED, code, reason, 2.0, (typed,),
                       why=EndReason.FAILED)


def stopped(node_rank: int, host: str) -> NodeOutcome:
    return NodeOutcome(node_rank, host, NodeState.STOPPED, -15, "stopped", 2.0, why=EndReason.STOPPED)


def test_the_root_cause_keeps_the_ranks_own_line():
    root = failed(0, "lab0", GLOO_LOOPBACK)
    assert "remote=[127.0.1.1]:7569" in root.reason and root.reason.startswith("torchrun exited 1")


def test_gloo_loopback_names_the_peer_that_advertised_it_and_the_setting():
    root = failed(0, "lab0", GLOO_LOOPBACK)
    hint = failure_hint(root, [root, stopped(1, "lab1")])
    assert hint.startswith("node 1 (lab1)'s ranks advertised a loopback address "
                           "(127.0.1.1:7569)")
    assert "network: {interface: auto}" in hint and "GLOO_SOCKET_IFNAME=<its NIC>" in hint
    assert "that node's `env:`" in hint and "`ddp-orch check`" in hint
    assert PYTHON not in hint


def test_gloo_loopback_with_several_peers_names_the_failing_node():
    root = failed(2, "lab2", GLOO_LOOPBACK)
    hint = failure_hint(root, [stopped(0, "lab0"), stopped(1, "lab1"), root])
    assert hint.startswith("a peer of node 2 (lab2) advertised a loopback address")


def test_gloo_on_docker0_says_so():
    root = failed(1, "lab1", GLOO_DOCKER0)
    hint = failure_hint(root, [stopped(0, "lab0"), root])
    assert "172.17.0.1:45483" in hint and "docker0" in hint and "GLOO_SOCKET_IFNAME" in hint


def test_gloo_missing_interface_names_the_node_and_the_interface():
    hint = failure_hint(failed(1, "lab1", GLOO_NO_IFACE))
    assert hint.startswith("node 1 (lab1) has no interface eth9")
    assert "network: {interface: auto}" in hint


def test_gloo_routable_peer_blames_the_path_not_loopback():
    hint = failure_hint(failed(0, "lab0", GLOO_ELSEWHERE))
    assert hint.startswith("node 0 (lab0)'s ranks could not connect to a peer at "
                           "10.77.3.11:44291")
    assert "firewall" in hint and "loopback" not in hint


def test_a_recv_timeout_gets_no_network_hint():
    # as likely a slow or hung rank as a network fault: no hint beats a wrong one
    assert failure_hint(failed(0, "lab0", GLOO_RECV_TIMEOUT)) is None


def test_ipv6_peer_is_shown_in_brackets():
    line = GLOO_ELSEWHERE.replace("10.77.3.11", "fd77:3::11")
    assert "[fd77:3::11]:44291" in failure_hint(failed(0, "lab0", line))


def test_nccl_loopback_names_the_nccl_variable():
    root = failed(1, "gpu-b", NCCL_LOOPBACK)
    assert root.reason.endswith("Connect to 127.0.0.1<45069> failed : Software caused "
                                "connection abort (train.py:12)")
    hint = failure_hint(root, [stopped(0, "gpu-a"), root])
    assert hint.startswith("node 0 (gpu-a)'s ranks advertised a loopback address "
                           "(127.0.0.1:45069)")
    assert "NCCL_SOCKET_IFNAME=<its NIC>" in hint and "GLOO" not in hint


def test_nccl_unreachable_peer():
    hint = failure_hint(failed(0, "gpu-a", NCCL_NO_ROUTE))
    assert "192.168.19.14:52822" in hint and "NCCL_SOCKET_IFNAME" in hint


def test_an_unhandled_system_error_without_more_names_the_usual_causes_not_only_the_nic():
    """torch's words on every ncclSystemError name a socket; a lab box's
    usual causes are the node's own: shm, memlock, P2P, exclusive mode."""
    hint = failure_hint(failed(0, "gpu-a", NCCL_SYSTEM))
    assert hint.startswith("NCCL failed on node 0 (gpu-a) without saying which call")
    assert "NCCL_DEBUG=WARN" in hint
    for cause in ("/dev/shm", "--shm-size=1g", "ulimit -l", "NCCL_P2P_DISABLE=1",
                  "exclusive compute mode", "NCCL_SOCKET_IFNAME="):
        assert cause in hint, cause
    assert hint.index("/dev/shm") < hint.index("NCCL_SOCKET_IFNAME")


def test_nccl_without_an_interface():
    hint = failure_hint(failed(1, "gpu-b", NCCL_NO_IFACE))
    assert hint.startswith("NCCL found no interface on node 1 (gpu-b)")


def test_store_out_of_reach_names_the_rendezvous():
    hint = failure_hint(failed(1, "lab1", STORE_UNREACHABLE))
    assert hint.startswith("node 1 (lab1) cannot reach the rendezvous at 10.77.84.10:29555")
    assert "master.addr" in hint


def test_a_node_that_never_joined():
    root = NodeOutcome(1, "lab1", NodeState.FAILED, None,
                       "did not join the rendezvous before the start timeout", 5.0,
                       why=EndReason.START_TIMEOUT)
    hint = failure_hint(root)
    assert hint.startswith("node 1 (lab1) never reached the rendezvous")
    assert "master.addr" in hint and "firewall" in hint
    silent = NodeOutcome(1, "lab1", NodeState.FAILED, None,
                         "did not join the rendezvous before the start timeout (no answer "
                         "from the node within 30s)", 5.0, why=EndReason.NO_ANSWER)
    assert "agent never answered" in failure_hint(silent)
    # the reason decides, not the words: the same words under another reason say nothing
    assert failure_hint(dataclasses.replace(root, why=EndReason.FAILED)) is None
    # what the node's ranks said is more precise than "never joined": it wins
    store = dataclasses.replace(root, failures=(WorkerFailure(0, STORE_UNREACHABLE, 4.0),))
    assert failure_hint(store).startswith("node 1 (lab1) cannot reach the rendezvous at "
                                          "10.77.84.10:29555")


def test_no_torch_gets_the_python_hint_and_nothing_else_does():
    root = NodeOutcome(0, "lab0", NodeState.FAILED, 1, "torchrun exited 1: "
                       "ModuleNotFoundError: No module named 'torch'", 1.0, why=EndReason.FAILED)
    assert PYTHON in failure_hint(root)
    assert failure_hint(failed(0, "lab0", "RuntimeError: planned crash")) is None
    assert PYTHON not in failure_hint(failed(0, "lab0", "ModuleNotFoundError: No module named "
                                                        "'torchvision'"))


def plan_running(workload: str, *program: str) -> dict:
    """A run's ``plan.json`` as far as the hints read it: node 0's argv."""
    return {"workload": workload, "nodes": [{"argv": [
        "python3", "-m", "torch.distributed.run", "--nnodes", "1", "-m", "ddp_orch_shim",
        *program]}]}


def test_a_missing_module_points_at_setup_and_python():
    """(issue 32) Another module than the run's own: install it on the nodes
    or use an interpreter that has it; nothing about `code:`."""
    root = failed(1, "gpu-b", "ModuleNotFoundError: No module named 'yaml'")
    hint = failure_hint(root, [root], plan_running("mypkg.train", "-m", "mypkg.train"))
    assert hint.startswith("node 1 (gpu-b) cannot import 'yaml': install it on the nodes with "
                           "`setup:`")
    assert "set `python:` to an interpreter that has it" in hint and "code:" not in hint


def test_the_runs_own_module_missing_points_at_code_relative_to_the_cluster_file():
    """The package of the run's ``module:`` not found (ModuleNotFoundError
    from the shim's lookup, or its ImportError for a module of a package):
    ``code:``, relative to the cluster file, is the first suspect."""
    own = plan_running("mypkg.train", "-m", "mypkg.train", "--lr", "0.1")
    for line, name in (("ModuleNotFoundError: No module named 'mypkg'", "mypkg"),
                       ("ImportError: No module named mypkg.train", "mypkg.train")):
        hint = failure_hint(failed(0, "gpu-a", line), (), own)
        assert hint.startswith(f"node 0 (gpu-a) cannot import {name!r}, "), hint
        assert "`code:` directory, which is relative to the cluster file; point `code:` at " \
            "the directory that holds mypkg/" in hint
        assert "`setup:`" in hint and "`python:`" in hint
    # a built-in's module (workloads.linear) or a script is not the user's module
    root = failed(0, "gpu-a", "ModuleNotFoundError: No module named 'workloads'")
    assert "code:" not in failure_hint(root, (), plan_running("linear", "-m", "workloads.linear"))
    root = failed(0, "gpu-a", "ModuleNotFoundError: No module named 'train'")
    assert "code:" not in failure_hint(root, (), plan_running("train.py", "train.py"))
    assert "code:" not in failure_hint(root, (), None)  # no plan.json


def test_hint_for_reads_plain_texts():
    assert hint_for([GLOO_NO_IFACE], 3, "h3").startswith("node 3 (h3) has no interface")
    assert hint_for(["ValueError: bad"], 0, "h0") is None


def test_transport_hints_fit_their_failure():
    unresolvable = "unreachable: cannot resolve host name 'nod1' (Name or service not known)"
    assert "host name" in transport_hint(unresolvable)
    assert PYTHON not in transport_hint(unresolvable)
    assert transport_hint("cannot start '/opt/py/bin/python': No such file or directory") == PYTHON
    assert "firewall" in transport_hint("unreachable: no answer from 10.0.0.9:22 within 10s")
    assert transport_hint("something else entirely") == ""


def test_the_summary_and_status_read_the_runs_own_module_from_its_plan(tmp_path):
    import json

    from orchestrator.records.outcome import RunOutcome, RunState
    from orchestrator.records.rundir import RunDir
    from orchestrator.records.store import NodeRecord, find_run, write_state
    from orchestrator.report.runs import render_status
    from orchestrator.report.runsjson import status_json
    from orchestrator.report.summary import render_summary
    from orchestrator.records.outcome import RunDescription

    root = failed(0, "gpu-a", "ModuleNotFoundError: No module named 'mypkg'")
    plan = plan_running("mypkg.train", "-m", "mypkg.train")
    summary = render_summary(RunOutcome("r", RunState.FAILED, 1.0, (root,), root, None),
                             "/runs/r", plan)
    assert "hint: node 0 (gpu-a) cannot import 'mypkg', the package of the run's own " \
        "module mypkg.train: " in summary
    run = RunDir.create(str(tmp_path), "r")
    run.write_plan(plan)
    write_state(run, run_id="r", backend="local", state=RunState.FAILED, started=1.0,
                nodes=[NodeRecord(0, "gpu-a", "/r/node-0", "python3")],
                outcome=RunOutcome("r", RunState.FAILED, 1.0, (root,), root, None))
    record = find_run(str(tmp_path), "r")
    described = RunDescription(record.state, record.outcomes, record.root_cause)
    assert "relative to the cluster file" in render_status(record, described)
    assert "relative to the cluster file" in status_json(record, described)["hint"]


# GPUs, drivers and a node's limits: NCCL's and CUDA's words as they print ----------

def nccl_last_error(last: str, kind: str = "unhandled system error",
                    code: str = "ncclSystemError: System call (e.g. socket, malloc) or external "
                                "library call failed or device error. ") -> str:
    """torch's DistBackendError around NCCL's last error, as it prints one."""
    return (f"torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
            f"ProcessGroupNCCL.cpp:1970, {kind} (run with NCCL_DEBUG=INFO for details), NCCL "
            f"version 2.21.5\n{code}\nLast error:\n{last}")


SHM_FULL = nccl_last_error(  # pytorch/ci-infra#490, a pod's 64 MiB /dev/shm
    "Error while creating shared memory segment /dev/shm/nccl-WU88OE (size 9637888), error: No "
    "space left on device (28)")
SHM_OLD = "include/shm.h:28 NCCL WARN Call to posix_fallocate failed : No space left on device"
DATALOADER_SHM = ("RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error. It "
                  "is possible that dataloader's workers are out of shared memory. Please try to "
                  "raise your shared memory limit.\nERROR: Unexpected bus error encountered in "
                  "worker. This might be caused by insufficient shared memory (shm).")
MEMLOCK = nccl_last_error(  # NVIDIA/nccl-tests#206: `ulimit -l` was 8192
    "misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot allocate "
    "memory")
DUPLICATE = nccl_last_error(  # NVIDIA/Megatron-LM#661
    "Duplicate GPU detected : rank 3 and rank 0 both on CUDA device f000",
    "invalid usage", "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.")
NO_KERNEL = ("RuntimeError: CUDA error: no kernel image is available for execution on the "
             "device\nCUDA kernel errors might be asynchronously reported at some other API "
             "call, so the stacktrace below might be incorrect.")
BUSY_DEVICE = "RuntimeError: CUDA error: all CUDA-capable devices are busy or unavailable"
CUDA_UNKNOWN = (  # pytorch/pytorch#49081, the driver's nvidia-uvm not loaded
    "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, "
    "e.g. changing env variable CUDA_VISIBLE_DEVICES after program start. Setting the available "
    "devices to be zero.")
CUINIT_UNKNOWN = ("failed call to cuInit: CUDA_ERROR_UNKNOWN: unknown error")  # gbionics/jaxsim#50
DRIVER_MISMATCH = ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some "
                   "cuda functions before calling NumCudaDevices() that might have already set "
                   "an error? Error 803: system has unsupported display driver / cuda driver "
                   "combination")
OLD_DRIVER = ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040). "
              "Please update your GPU driver by downloading and installing a new version from "
              "the URL: http://www.nvidia.com/Download/index.aspx")
P2P = nccl_last_error("Cuda failure 'peer access is not supported between these two devices'",
                      "unhandled cuda error", "ncclUnhandledCudaError: Call to CUDA function "
                      "failed.")
WATCHDOG = ("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, "
            "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600046 "
            "milliseconds before timing out.")


@pytest.mark.parametrize("text, starts, says", [
    (SHM_FULL, "node 0 (gpu-a) ran out of shared memory for NCCL", ["--shm-size=1g", "--ipc=host",
                                                                      "NCCL_SHM_DISABLE=1"]),
    (SHM_OLD, "node 0 (gpu-a) ran out of shared memory", ["--shm-size=1g"]),
    (DATALOADER_SHM, "node 0 (gpu-a) ran out of shared memory", ["--shm-size=1g"]),
    (DATALOADER_SHM.split("\n")[0], "node 0 (gpu-a) ran out of shared memory", ["--ipc=host"]),
    (MEMLOCK, "NCCL could not register its buffers with the InfiniBand NIC on node 0 (gpu-a)",
     ["ulimit -l", "memlock", "--ulimit memlock=-1", "NCCL_IB_DISABLE=1"]),
    (DUPLICATE, "ranks 3 and 0 on node 0 (gpu-a) both opened the GPU at bus f000",
     ["LOCAL_RANK", "torch.cuda.set_device", "cuda:0"]),
    (NO_KERNEL, "node 0 (gpu-a)'s torch has no kernel built for its GPU's compute capability",
     ["get_arch_list", "ddp-orch check"]),
    (BUSY_DEVICE, "a GPU on node 0 (gpu-a) takes one process at a time",
     ["nvidia-smi -q -d COMPUTE", "-c DEFAULT"]),
    (CUDA_UNKNOWN, "node 0 (gpu-a): its CUDA driver fails to start with 999 (CUDA_ERROR_UNKNOWN)",
     ["nvidia-uvm", "sudo modprobe nvidia-uvm", "modprobe -r nvidia_uvm"]),
    (CUINIT_UNKNOWN, "node 0 (gpu-a): its CUDA driver fails to start with 999", ["nvidia-uvm"]),
    (DRIVER_MISMATCH, "node 0 (gpu-a): its CUDA driver fails to start with 803 "
                      "(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)", ["reboot the node"]),
    (OLD_DRIVER, "node 0 (gpu-a)'s NVIDIA driver is older than the CUDA its torch was built with",
     ["upgrade the driver"]),
    (P2P, "GPU peer-to-peer failed on node 0 (gpu-a)", ["NCCL_P2P_DISABLE=1", "ACS"]),
    (WATCHDOG, "a collective never completed on node 0 (gpu-a)", ["nccl_trace/",
                                                                   "NCCL_P2P_DISABLE=1"]),
])
def test_each_gpu_cause_gets_its_own_fix_not_the_network_interface(text, starts, says):
    hint = failure_hint(failed(0, "gpu-a", text))
    assert hint.startswith(starts), hint
    for words in says:
        assert words in hint, (words, hint)
    assert "NCCL_SOCKET_IFNAME" not in hint and "install a CUDA build" not in hint


def test_a_network_error_is_still_the_networks_and_a_gpu_rule_fits_only_its_words():
    assert "NCCL_SOCKET_IFNAME" in failure_hint(failed(0, "gpu-a", NCCL_NO_ROUTE))
    assert gpu_hint(NCCL_NO_ROUTE, "node 0 (gpu-a)") is None
    assert gpu_hint(GLOO_RECV_TIMEOUT, "node 0 (lab0)") is None


def test_every_driver_error_a_node_starts_with_has_its_own_words_and_fix():
    fixes = {code: cuda_error_words("cuInit", code) for code in CUDA_DRIVER_ERRORS}
    assert len({fix for _said, fix in fixes.values()}) == len(fixes)
    said, fix = fixes[999]
    assert said.startswith("its CUDA driver fails cuInit with 999 (CUDA_ERROR_UNKNOWN): the "
                           "driver does not start")
    assert "nvidia-uvm" in fix and "install a CUDA build" not in fix
    assert cuda_error_words("cuDeviceGetCount", 2)[0] == \
        "its CUDA driver fails cuDeviceGetCount with 2 (error 2)"
