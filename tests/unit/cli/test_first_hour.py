"""What a newcomer meets in the first hour (issue 22, first items): errors a
person can act on and listings in the order they promise."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest

from conftest import run_cli
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError
from orchestrator.records.rundir import RunDir

OWNER = {"holder": "controller", "detached": False}
from orchestrator.records.store import RECORD_VERSION, list_runs


def test_a_run_id_already_taken_is_a_clear_error_not_a_traceback(tmp_path):
    RunDir.create(str(tmp_path), "mine")
    with pytest.raises(ConfigError) as caught:
        RunDir.create(str(tmp_path), "mine")
    assert "run id 'mine' is already taken" in str(caught.value)
    result = run_cli("up", "--local", "--workload", "noop", "--procs", "1",
                     "--runs-dir", str(tmp_path), "--run-id", "mine")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "FileExistsError" not in result.stderr
    assert "--run-id: run id 'mine' is already taken" in result.stderr
    assert "hint: choose another --run-id" in result.stderr
    # The dry-run refuses what `up` refuses, in the same words (issue 32 item 7).
    dry = run_cli("up", "--local", "--workload", "noop", "--procs", "1", "--dry-run",
                  "--runs-dir", str(tmp_path), "--run-id", "mine")
    assert (dry.returncode, dry.stdout, dry.stderr) == (2, "", result.stderr)
    fresh = run_cli("up", "--local", "--workload", "noop", "--procs", "1", "--dry-run",
                    "--runs-dir", str(tmp_path), "--run-id", "other")
    assert fresh.returncode == 0, fresh.stderr
    assert not (tmp_path / "other").exists()  # a dry-run creates nothing


@pytest.mark.parametrize("word", ["gpu", "GPU", "gpus"])
def test_device_gpu_suggests_cuda_not_cpu(word):
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(f"device: {word}\nnodes: [{{host: a, gpus: 0}}]\n"
                          "workload: {name: noop}\n")
    assert "did you mean 'cuda'?" in str(caught.value) and "device" in str(caught.value)


def test_ps_lists_the_newest_run_first_by_start_time_not_by_name(tmp_path):
    """``sleepy-...120647`` started before ``short-...120735``: ids that sort
    the other way must not reorder the listing."""
    now = time.time()
    for run_id, started in (("short-20261124-120735", now), ("sleepy-20261124-120647", now - 48),
                            ("aaa-20261124-120700", now - 20)):
        run = RunDir.create(str(tmp_path), run_id)
        with open(run.file("state.json"), "w", encoding="utf-8") as fh:
            json.dump({"version": RECORD_VERSION, "run_id": run_id, "backend": "local",
                       "state": "succeeded", "owner": OWNER,
                       "started": started, "nodes": []}, fh)
    assert [r.run_id for r in list_runs(str(tmp_path))] == [
        "short-20261124-120735", "aaa-20261124-120700", "sleepy-20261124-120647"]
    shown = run_cli("ps", "--runs-dir", str(tmp_path)).stdout.splitlines()
    listed = shown[1:-1]  # between the header and the line naming the runs directory
    assert [line.split()[0] for line in listed] == [
        "short-20261124-120735", "aaa-20261124-120700", "sleepy-20261124-120647"]
    assert os.path.isdir(tmp_path / "short-20261124-120735")


def test_what_the_ssh_config_says_but_ddp_orch_does_not_use_is_shown_by_dry_run_check_and_up(
        tmp_path):
    """Issue #32: a keyword of ~/.ssh/config that applies to a node but is
    not used, and a `Match` block ddp-orch cannot evaluate, were dropped in
    silence (paramiko even took `Match exec` as a match where `invoke` is
    installed, and made its HostName the master address). Now the dry-run
    notes them where node 0's HostName is the master address, `check` shows
    a warning row per line, and `up` says them before it connects."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    with socket.socket() as sock:  # a port nothing listens on: refused at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (home / ".ssh" / "config").write_text(
        f"Host node0\n    HostName 127.0.0.1\n    Port {port}\n"
        "    CertificateFile ~/.ssh/node0-cert.pub\n"
        "Match originalhost node0 exec true\n    HostName 10.0.0.99\n")
    cluster = tmp_path / "cfg.yaml"
    cluster.write_text("name: cfg\npython: python3\nnodes: [{host: node0, procs: 1}]\n"
                       "workload: {name: noop}\n")
    env = {"HOME": str(home)}
    cert = ("~/.ssh/config line 4: `CertificateFile ~/.ssh/node0-cert.pub` applies to host "
            "node0, but ddp-orch does not support CertificateFile; it connects without it")
    match = ("~/.ssh/config line 5: `Match originalhost node0 exec true` may apply to host "
             "node0, but ddp-orch cannot evaluate exec; the block's settings are not applied "
             "(`ssh -G node0` shows what ssh applies)")
    dry = run_cli("up", str(cluster), "--dry-run", "--run-id", "cfg", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "master     127.0.0.1:auto" in dry.stdout
    assert f"\nwarning: {cert}\nwarning: {match}\n" in dry.stdout
    checked = run_cli("check", str(cluster), "--timeout", "5", env=env)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert [line for line in checked.stdout.splitlines() if " ssh config " in line] == [
        f"0     node0  ssh config  warn    {cert}", f"0     node0  ssh config  warn    {match}"]
    up = run_cli("up", str(cluster), "--runs-dir", str(tmp_path / "runs"), "--start-timeout", "5",
                 env=env)
    assert up.returncode != 0
    assert f"ddp-orch: warning: {cert}\nddp-orch: warning: {match}\n" in up.stdout, up.stdout


# A `module:` that is not in `code:` (issue 32): warned at plan time -------------------


def module_file(project, module: str, code: str | None = None) -> str:
    """A cluster file in ``project`` running ``module`` (from ``code``)."""
    code_line = f"  code: {code}\n" if code is not None else ""
    (project / "cluster.yaml").write_text(
        f"nodes: [{{host: gpu-a, procs: 1}}]\nworkload:\n  module: {module}\n{code_line}")
    return str(project / "cluster.yaml")


def test_a_module_not_in_the_code_directory_is_a_warning_naming_where_it_looked(project):
    (project / "src" / "mypkg").mkdir(parents=True)
    (project / "src" / "mypkg" / "train.py").write_text("")
    path = module_file(project, "mypkg.train")
    result = run_cli("up", path, "--dry-run", "--run-id", "w")
    assert result.returncode == 0, result.stderr  # a warning, not a refusal
    warning, = [line for line in result.stdout.splitlines() if line.startswith("warning:")]
    assert warning.startswith(f"warning: {path}:3: workload.module: module 'mypkg.train' is "
                              f"not in the code directory {project} (no mypkg/train.py, ")
    assert "without `code:` it is the cluster file's directory" in warning
    assert "`setup:`" in warning and "`python:`" in warning
    assert "set `code:` (relative to the cluster file) to the directory that holds mypkg/" \
        in warning
    assert not [w for w in load_cluster_text(
        (project / "cluster.yaml").read_text().replace("train\n", "train\n  code: src\n"),
        source=path, base_dir=str(project)).all_warnings]
    # `up` says the same before it starts anything: the spec carries it
    from orchestrator.config.loader import load_cluster_file

    assert load_cluster_file(path).all_warnings == (warning,)


@pytest.mark.parametrize("layout", ["proj/train.py", "proj/train/__init__.py",
                                    "proj/train/__main__.py", "proj/"])
def test_a_module_found_in_any_form_python_m_takes_is_no_warning(tmp_path, layout):
    if layout.endswith("/"):  # a namespace package: a directory without __init__.py
        (tmp_path / layout).mkdir()
    else:
        (tmp_path / layout).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / layout).write_text("")
    spec = load_cluster_text("nodes: [{host: a, procs: 1}]\nworkload: {module: proj.train}\n",
                             source="c.yaml", base_dir=str(tmp_path))
    assert spec.all_warnings == ()


def test_the_program_after_dashes_is_the_one_checked(project):
    """``up FILE -- -m other``: the file's module is no longer what runs, so
    its warning goes; the new one is checked in the same code directory."""
    from orchestrator.config.localmode import local_spec, with_program

    module_file(project, "nope.train")
    spec = load_cluster_text((project / "cluster.yaml").read_text(), source="c.yaml",
                             base_dir=str(project))
    assert len(spec.all_warnings) == 1
    assert with_program(spec, ("-m", "proj.train")).all_warnings == ()
    other, = with_program(spec, ("-m", "other.mod")).all_warnings
    assert other.startswith("warning: -- PROGRAM: module 'other.mod' is not in the code "
                            f"directory {project} ")
    # --local keeps the file's program, and so its warning
    local = local_spec(spec, workload=None, gpus=None, procs=1, device=None, args={})
    assert local.all_warnings == spec.all_warnings
