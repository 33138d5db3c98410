"""The stand-in nvidia-smi: real nvidia-smi's CSV for any fields asked, a
state a test changes between calls, one answer per host, and on the SSH lab
the stand-in found first by every session (the lab test is ``live``)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys

import pytest

from fakesmi import fake_nvidia_smi, fake_smi, set_state, ssh_lab_path_line, state
from orchestrator.agent.node import gpus

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSV = "--format=csv,noheader,nounits"


def smi(directory, *args, env=None):
    """Run the stand-in as a program on PATH would be run."""
    clean = {k: v for k, v in os.environ.items() if k not in ("SSH_CONNECTION", "FAKE_SMI_HOST")}
    return subprocess.run([os.path.join(directory, "nvidia-smi"), *args], capture_output=True,
                          text=True, timeout=30, env={**clean, **(env or {})})


def test_any_fields_in_any_order_as_real_csv(tmp_path):
    directory = fake_nvidia_smi(tmp_path, [
        {"name": "NVIDIA A100-SXM4-80GB", "memory_used": 1234, "utilization": 56, "mig": True},
        {"index": 5, "memory_total": None, "utilization": "[Not Supported]", "mig": None}])
    uuids = [g["uuid"] for g in state(directory)["hosts"]["local"]["gpus"]]
    ran = smi(directory, "--query-gpu=mig.mode.current,index,memory.used,utilization.gpu,"
                         "memory.total,uuid,pci.bus_id,driver_version", CSV)
    assert (ran.returncode, ran.stdout) == (0, (
        f"Enabled, 0, 1234, [N/A], 81559, {uuids[0]}, 00000000:18:00.0, 550.54.15\n"
        f"[N/A], 5, 0, [Not Supported], [N/A], {uuids[1]}, 00000000:1D:00.0, 550.54.15\n"))
    assert smi(directory, "--query-gpu=name", CSV).stdout.splitlines() == \
        ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]


def test_compute_apps_list_each_process_on_its_gpu(tmp_path):
    directory = fake_nvidia_smi(tmp_path, [{}, {"processes": [
        {"pid": 4242, "used_mib": 20480}, {"pid": 77, "name": "/usr/bin/python3"}]}])
    uuid = state(directory)["hosts"]["local"]["gpus"][1]["uuid"]
    ran = smi(directory, "--query-compute-apps=used_memory,pid,gpu_uuid,process_name", CSV)
    assert ran.stdout == f"20480, 4242, {uuid}, python\n[N/A], 77, {uuid}, /usr/bin/python3\n"
    set_state(directory, [{}, {}])
    assert smi(directory, "--query-compute-apps=pid", CSV).stdout == ""


def test_list_like_real_and_as_facts_reads_it(tmp_path, monkeypatch):
    directory = fake_nvidia_smi(tmp_path, [{}, {"index": 3, "name": "Tesla T4"}])
    uuids = [g["uuid"] for g in state(directory)["hosts"]["local"]["gpus"]]
    assert smi(directory, "-L").stdout == (f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuids[0]})\n"
                                           f"GPU 3: Tesla T4 (UUID: {uuids[1]})\n")
    monkeypatch.setenv("PATH", directory + os.pathsep + os.environ["PATH"])
    assert [g["index"] for g in gpus.facts(30)["gpus"]] == [0, 3]


def test_no_gpu_unknown_field_failure_and_hang(tmp_path):
    directory = fake_nvidia_smi(tmp_path, [])
    ran = smi(directory, "--query-gpu=index", CSV)
    assert (ran.returncode, ran.stdout) == (6, "No devices were found\n")
    set_state(directory, [{}])
    ran = smi(directory, "--query-gpu=index,colour", CSV)
    assert (ran.returncode, ran.stdout) == (2, 'Field "colour" is not a valid field to query.\n')
    set_state(directory, [{}], fail={"code": 9, "message": "NVIDIA-SMI has failed"})
    ran = smi(directory, "-L")
    assert (ran.returncode, ran.stdout) == (9, "NVIDIA-SMI has failed\n")
    set_state(directory, [{}], hang=True)
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run([os.path.join(directory, "nvidia-smi"), "-L"], timeout=1)


def test_uuids_are_unique_to_each_fake_and_kept_across_state_changes(tmp_path):
    one = fake_nvidia_smi(tmp_path / "one", [{}])
    two = fake_nvidia_smi(tmp_path / "two", [{}])
    first = state(one)["hosts"]["local"]["gpus"][0]["uuid"]
    assert first != state(two)["hosts"]["local"]["gpus"][0]["uuid"]
    assert set_state(one, [{"memory_used": 9}])["hosts"]["local"]["gpus"][0]["uuid"] == first


def test_each_host_has_its_own_gpus_chosen_by_the_ssh_server_address(tmp_path):
    directory = fake_nvidia_smi(tmp_path, {
        "local": [{"name": "Local GPU"}],
        "127.0.55.10": [{"name": "Node0 GPU"}, {"name": "Node0 GPU"}],
        "127.0.55.11": {"gpus": [{}], "fail": {"code": 15, "message": "GPU is lost"}}})
    names = "--query-gpu=name"
    assert smi(directory, names, CSV).stdout == "Local GPU\n"
    via = {"SSH_CONNECTION": "127.0.0.1 50000 127.0.55.10 22"}
    assert smi(directory, names, CSV, env=via).stdout == "Node0 GPU\nNode0 GPU\n"
    assert smi(directory, names, CSV, env={"FAKE_SMI_HOST": "local", **via}).stdout == \
        "Local GPU\n"
    lost = smi(directory, names, CSV, env={"SSH_CONNECTION": "127.0.0.1 5 127.0.55.11 22"})
    assert (lost.returncode, lost.stdout) == (15, "GPU is lost\n")
    # a test run from an SSH login: its address has no state, so it is local
    elsewhere = {"SSH_CONNECTION": "10.1.2.3 50000 10.1.2.4 22"}
    assert smi(directory, names, CSV, env=elsewhere).stdout == "Local GPU\n"


def test_the_short_form_lists_idle_gpus_at_its_indices(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi", 0, 2))
    found = gpus.facts(30)
    assert [g["index"] for g in found["gpus"]] == [0, 2] and found["apps"] == []


@pytest.mark.live
def test_ssh_sessions_on_the_lab_find_the_stand_in_and_get_their_hosts_gpus(make_ssh_lab,
                                                                            tmp_path):
    directory = str(tmp_path / "smi")
    lab = make_ssh_lab(2, extra_sshd=[ssh_lab_path_line(directory)])
    fake_nvidia_smi(directory, {lab.hosts[0].addr: [{"name": "Node0 GPU"}],
                                lab.hosts[1].addr: [{"name": "Node1 GPU"}] * 3})
    facts = (f"import json, sys; sys.path.insert(0, {ROOT!r}); "
             "from orchestrator.agent.node import gpus; print(json.dumps(gpus.facts()))")
    for host, names in ((lab.hosts[0], ["Node0 GPU"]), (lab.hosts[1], ["Node1 GPU"] * 3)):
        ran = subprocess.run(lab.ssh_argv(host, "command -v nvidia-smi"), capture_output=True,
                             text=True, timeout=30)
        assert ran.stdout.strip() == os.path.join(directory, "nvidia-smi"), ran.stderr
        with lab.client(host) as client:  # as the SSH transport runs the agent
            _, out, err = client.exec_command(f"{sys.executable} -I -c {shlex.quote(facts)}")
            got = json.loads(out.read() or err.read())
        assert [g["name"] for g in got["gpus"]] == names
