"""`--dry-run --format shell|slurm|bundle`: the golden, the same master port in
every format, the printed bundle command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile

from conftest import TESTS, run_cli
from orchestrator.engine.bundle import build_bundle
from dryrun import SELF, golden_shell, sections, user_path, run_here


GOLDEN = os.path.join(TESTS, "golden")


def test_the_slurm_shell_dry_run_matches_golden_word_for_word():
    result = run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--format", "shell",
                     "--run-id", "slurm-golden", "--runs-dir", "/shared/runs")
    assert result.returncode == 0, result.stderr
    with open(os.path.join(GOLDEN, "slurm.shell.txt"), encoding="utf-8") as fh:
        assert result.stdout == golden_shell(fh.read())


def test_every_format_shows_the_same_master_port(tmp_path):
    """auto in text and json; in the shell lines the one $MASTER_PORT, with
    its default stated, on every node's torchrun (never a made-up number)."""
    args = ("up", "--local", "--workload", "noop", "--procs", "2", "--dry-run", "--run-id", "p")
    text = run_cli(*args).stdout
    plan = json.loads(run_cli(*args, "--format", "json").stdout)
    shell = run_cli(*args, "--format", "shell", cwd=str(tmp_path)).stdout
    assert "master     127.0.0.1:auto (a free port on node 0, chosen at launch)" in text
    assert plan["master_port"] == "auto"
    assert shell.startswith("# p: world size 2, master 127.0.0.1:auto, backend local\n")
    assert "these\n# lines use $MASTER_PORT, 29500 unless you set it" in shell
    _here, nodes, _after = sections(shell)
    assert [line.count('--master-port "${MASTER_PORT:-29500}" ') for line in nodes[0]] == [1]
    assert list(tmp_path.iterdir()) == []  # the dry-run wrote nothing: the lines do, when run


def test_slurm_lines_agree_with_themselves():
    """The lines of a Slurm form, checked against each other: the bundle is
    written where each node's unpack reads it, every step runs inside the
    allocation, on the node its header names, and reaches the master
    address the allocation's shell exported, in its own code root."""
    result = run_cli("up", "tests/golden/slurm.yaml", "--dry-run", "--format", "shell",
                     "--run-id", "s", "--runs-dir", "/shared/runs")
    here, nodes, after = sections(result.stdout)
    bundle = "/shared/runs/s/bundle.tar.gz"
    assert here[0] == f"{SELF} bundle --output {bundle} tests/golden/slurm.yaml"
    assert here[1:3] == [f"mkdir -p /shared/runs/s/node-{k} && tar -xzf {bundle} "
                         f"-C /shared/runs/s/node-{k}" for k in (0, 1)]
    assert here[3].startswith("salloc ") and "--nodelist=node1,node2" in here[3]
    assert here[4] == ('export MASTER_ADDR="$(srun --nodes=1 --ntasks=1 --nodelist=node1 '
                       'hostname < /dev/null)"')
    for k, host in ((0, "node1"), (1, "node2")):
        [line] = nodes[k]
        assert line.startswith(f"srun --nodes=1 --ntasks=1 --nodelist={host} sh -c 'cd "
                               f"/shared/runs/s/node-{k}/code && ")
        assert line.endswith("' < /dev/null &")
        assert '--master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}" ' in line
        assert f"--node-rank {k} " in line
    assert after == ["wait"]


def test_the_printed_bundle_command_writes_the_bundle_up_uploads(project, tmp_path_factory):
    """Your own program after --: the dry-run's `ddp-orch bundle` line, run
    as printed from the project, writes what `up` would upload (the
    built-ins, the shim, the project), the program's words kept after --."""
    dry = run_cli("up", "--local", "--procs", "2", "--dry-run", "--format", "shell",
                  "--run-id", "b", "--runs-dir", "runs", "--", "-m", "proj.train", "--out", "a b", cwd=str(project))
    here, _nodes, _after = sections(dry.stdout)
    assert here[0] == (f"{SELF} bundle --output runs/b/bundle.tar.gz --local --procs 2 -- "
                       "-m proj.train --out 'a b'")
    elsewhere = tmp_path_factory.mktemp("user")  # not in the project, which is uploaded
    run_here(here[:1], project, user_path(elsewhere))
    expected = elsewhere / "expected.tar.gz"
    build_bundle(str(expected), str(project))
    with tarfile.open(project / "runs" / "b" / "bundle.tar.gz") as got, \
            tarfile.open(expected) as want:
        names = got.getnames()
        assert names == want.getnames()
    assert {"code/ddp_orch_shim.py", "project/proj/train.py"} <= set(names)


def test_the_lines_call_the_ddp_orch_that_printed_them_by_its_path(tmp_path):
    """Issue #32: run as `.venv/bin/ddp-orch` (the README's Quick start),
    the lines called a bare `ddp-orch`: "command not found" without one on
    PATH, then a failed tar. Now they call that very script by its absolute
    path, quoted (here a console script like pip's, in a directory with a
    space, started by a relative path), and run as printed with no
    `ddp-orch` on PATH."""
    bin_dir = tmp_path / "my bin"
    bin_dir.mkdir()
    script = bin_dir / "ddp-orch"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom orchestrator.cli import main\n"
                      "sys.exit(main())\n")
    script.chmod(0o755)
    env = user_path(tmp_path)
    dry = subprocess.run([os.path.join(".", "my bin", "ddp-orch"), "up", "--local", "--workload",
                          "noop", "--procs", "1", "--dry-run", "--format", "shell", "--run-id",
                          "s", "--runs-dir", "runs"], cwd=str(tmp_path), env={**os.environ, **env},
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    here, _nodes, _after = sections(dry.stdout)
    assert here[0] == (f"'{script}' bundle --output runs/s/bundle.tar.gz --local "
                       "--workload noop --procs 1")
    run_here(here, tmp_path, env)
    assert (tmp_path / "runs" / "s" / "node-0" / "code" / "ddp_orch_shim.py").is_file()
