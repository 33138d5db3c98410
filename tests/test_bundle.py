"""The code bundle each node receives: the workloads it runs, nothing for developers."""

from __future__ import annotations

import tarfile

from orchestrator.backends.bundle import build_bundle


def names_in(path) -> set[str]:
    with tarfile.open(path) as tar:
        return set(tar.getnames())


def test_the_bundle_has_the_workloads_and_no_dev_tools_or_caches(tmp_path):
    build_bundle(str(tmp_path / "b.tar.gz"))
    names = names_in(tmp_path / "b.tar.gz")
    assert {"code/workloads/contract.py", "code/workloads/linear.py",
            "code/workloads/harness/train.py"} <= names
    assert "code/workloads/make_tiny_datasets.py" not in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_a_script_directory_comes_along_without_vcs_or_venv(tmp_path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "config").write_text("x")
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "lib").mkdir()
    (project / "lib" / "util.py").write_text("")
    build_bundle(str(tmp_path / "b.tar.gz"), str(project / "train.py"))
    names = names_in(tmp_path / "b.tar.gz")
    assert {"script/train.py", "script/lib/util.py"} <= names
    assert not [n for n in names if ".git" in n or ".venv" in n]
