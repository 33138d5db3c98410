"""The code bundle each node receives: the workloads it runs, nothing for developers."""

from __future__ import annotations

import dataclasses
import os
import tarfile

import pytest

from orchestrator.engine import bundle as bundle_mod
from orchestrator.engine.bundle import (
    ScriptDirScan, build_bundle, parse_patterns, render_scan, scan_script_dir)
from orchestrator.errors import ConfigError, LaunchError


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


def test_the_code_directory_comes_along_without_vcs_or_venv(tmp_path):
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / ".git" / "config").write_text("x")
    (project / ".venv" / "bin").mkdir(parents=True)
    (project / "train.py").write_text("print('hi')\n")
    (project / "lib").mkdir()
    (project / "lib" / "util.py").write_text("")
    build_bundle(str(tmp_path / "b.tar.gz"), str(project))
    names = names_in(tmp_path / "b.tar.gz")
    assert {"project", "project/train.py", "project/lib/util.py"} <= names
    assert not [n for n in names if ".git" in n or ".venv" in n]


# --- what of a code directory may leave the machine -------------------------------

def make_tree(root, files: dict[str, str]):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def script_names(tmp_path, project) -> set[str]:
    out = tmp_path / "b.tar.gz"
    build_bundle(str(out), str(project))
    return {n[len("project/"):] for n in names_in(out) if n.startswith("project/")}


SECRETS = {".ssh/id_ed25519": "KEY", ".ssh/id_ed25519.pub": "PUB", ".aws/credentials": "AWS",
           ".env": "TOKEN=1", "server.pem": "PEM", ".netrc": "machine x", "deploy.key": "K",
           "certs/client.p12": "P12", "sub/id_rsa": "RSA", "sub/.hidden/x.py": ""}


def test_secrets_and_dotfiles_never_leave_the_machine(tmp_path):
    project = make_tree(tmp_path / "project", {"train.py": "", "lib/util.py": "", **SECRETS})
    assert script_names(tmp_path, project) == {"train.py", "lib/util.py"}


def test_the_include_file_re_admits_what_it_names_but_never_git(tmp_path):
    project = make_tree(tmp_path / "project", {
        "train.py": "", **SECRETS, ".git/config": "x", ".gitattributes": "",
        ".config/app.toml": "", ".config/token": "",
        ".ddp-orch-include": "# ship these\n.env\n.git\n.git/config\n.config/\n!.config/token\n"})
    assert script_names(tmp_path, project) == {"train.py", ".env", ".config/app.toml"}
    scan = scan_script_dir(str(project))
    assert ".env" not in scan.skipped and ".config/token" in scan.skipped
    assert ".ssh/id_ed25519" in scan.skipped and ".gitattributes" in scan.skipped


IGNORE_TREE = {
    "train.py": "", "data/a.csv": "", "src/data/b.csv": "", "data.py": "",
    "m.ckpt": "", "sub/n.ckpt": "", "keep.ckpt": "", "sub/keep.ckpt": "",
    "build/out.o": "", "src/build/ok.py": "", "build.py": "",
    "tmp/a.log": "", "x/tmp/b.log": "", "x/y/tmp/c.log": "", "tmp/a.txt": "", "x/tmp/deep/d.log": "",
    "notes.log": "",
}
IGNORE_RULES = "# comment\n\ndata/\n*.ckpt\n!keep.ckpt\n/build\n**/tmp/*.log\n"
AFTER_IGNORE = {"train.py", "data.py", "keep.ckpt", "sub/keep.ckpt", "src/build/ok.py",
                "build.py", "tmp/a.txt", "x/tmp/deep/d.log", "notes.log"}


@pytest.mark.parametrize("ignore_file", [".gitignore", ".ddp-orch-ignore"])
def test_ignore_files_behave_like_gitignore(tmp_path, ignore_file):
    project = make_tree(tmp_path / "project", {**IGNORE_TREE, ignore_file: IGNORE_RULES})
    assert script_names(tmp_path, project) == AFTER_IGNORE
    scan = scan_script_dir(str(project))
    assert scan.skipped == ()  # ignored is not "skipped as secret-looking", nor the ignore file


def test_ddp_orch_ignore_comes_after_gitignore_and_a_data_file_is_a_file(tmp_path):
    project = make_tree(tmp_path / "project", {
        "train.py": "", "a.bin": "", "b.bin": "", "data": "a file, not a dir",
        ".gitignore": "*.bin\ndata/\n", ".ddp-orch-ignore": "!b.bin\n"})
    assert script_names(tmp_path, project) == {"train.py", "b.bin", "data"}


def test_pattern_subset():
    def ignored(text, rel, is_dir=False):
        return bool(bundle_mod._last_match(parse_patterns(text), rel, is_dir))
    assert ignored("a/**", "a/b/c") and not ignored("a/**", "a", True)
    assert ignored("a/**/b", "a/b") and ignored("a/**/b", "a/x/y/b")
    assert ignored("docs/*.md", "docs/x.md") and not ignored("docs/*.md", "docs/sub/x.md")
    assert not ignored("docs/*.md", "src/docs/x.md")
    assert ignored("\\#x", "#x") and ignored("\\!x", "!x")
    assert ignored("*.log   ", "a/b.log")
    assert not ignored("out/", "out") and ignored("out/", "out", True)


def test_links_and_devices_are_counted_nowhere(tmp_path):
    project = make_tree(tmp_path / "project", {"train.py": "", "real/x.py": ""})
    outside = make_tree(tmp_path / "outside", {"secret.txt": "s"})
    os.symlink(outside / "secret.txt", project / "link.txt")
    os.symlink(outside, project / "linkdir")
    os.symlink(outside / "secret.txt", project / ".env")
    os.mkfifo(project / "fifo")
    scan = scan_script_dir(str(project))
    assert [f for f, _ in scan.files] == ["real/x.py", "train.py"]
    assert scan.skipped == ()
    assert script_names(tmp_path, project) == {"train.py", "real/x.py"}


def test_home_and_above_and_root_are_refused(tmp_path, monkeypatch):
    home = tmp_path / "home" / "me"
    make_tree(home, {"train.py": "", ".ssh/id_ed25519": "KEY"})
    make_tree(tmp_path / "home", {"train.py": ""})
    monkeypatch.setenv("HOME", str(home))
    for where in (home, tmp_path / "home"):
        with pytest.raises(LaunchError) as caught:
            build_bundle(str(tmp_path / "b.tar.gz"), str(where))
        assert str(where) in str(caught.value)
        assert "set workload.code to your project's own directory" in str(caught.value)
    with pytest.raises(LaunchError, match="filesystem root"):
        scan_script_dir("/")
    make_tree(home / "proj", {"train.py": ""})  # below home is fine
    assert script_names(tmp_path, home / "proj") == {"train.py"}


def test_the_cap_counts_what_is_uploaded_and_names_the_largest_files(tmp_path, monkeypatch):
    project = make_tree(tmp_path / "project", {"train.py": "x"})
    for i in range(12):
        (project / f"f{i:02}.bin").write_bytes(b"x" * (100 + i))
    (project / "big.ckpt").write_bytes(b"x" * 5000)      # ignored: not counted
    (project / ".env").write_bytes(b"x" * 5000)          # skipped: not counted
    (project / ".gitignore").write_text("*.ckpt\n")
    total = 1 + sum(100 + i for i in range(12))
    monkeypatch.setattr(bundle_mod, "MAX_SCRIPT_DIR_BYTES", total)
    assert script_names(tmp_path, project) >= {"train.py", "f11.bin"}  # at the cap: fine
    monkeypatch.setattr(bundle_mod, "MAX_SCRIPT_DIR_BYTES", total - 1)
    with pytest.raises(ConfigError) as caught:  # bad input: exit 2, as the dry-run's
        build_bundle(str(tmp_path / "c.tar.gz"), str(project))
    message = str(caught.value)
    assert str(project) in message and f"({total} bytes)" in message
    assert "keep data, checkpoints and outputs out of it" in message
    listed = [f"f{i:02}.bin" for i in range(2, 12)]
    assert all(name in message for name in listed)
    assert "f00.bin" not in message and "f01.bin" not in message and "train.py" not in message
    assert message.index("f11.bin") < message.index("f10.bin")  # largest first
    assert "111 B" in message
    assert not (tmp_path / "c.tar.gz").exists()


def test_scan_totals_and_the_dry_run_line(tmp_path):
    project = make_tree(tmp_path / "project", {
        "train.py": "x" * 1000, "lib/util.py": "y" * 24, ".env": "T", ".ssh/id_ed25519": "K",
        "weights.ckpt": "z" * 99, ".gitignore": "*.ckpt\n", "__pycache__/a.pyc": "c"})
    (project / "big.bin").write_bytes(b"\0" * (3 * 2**20 + 400 * 2**10))
    scan = scan_script_dir(str(project))
    assert isinstance(scan, ScriptDirScan)
    assert scan.files == (("big.bin", 3 * 2**20 + 400 * 2**10), ("lib/util.py", 24),
                          ("train.py", 1000))
    assert scan.total_bytes == sum(size for _, size in scan.files)
    assert scan.skipped == (".env", ".ssh/id_ed25519")
    assert render_scan(scan) == scan.summary() == (
        f"code dir   {project}: 3 files, 3.4 MiB uploaded to each node; "
        "2 skipped as secret-looking: .env, .ssh/id_ed25519; "
        "held back by .gitignore/.ddp-orch-ignore: weights.ckpt (99 B)")
    with pytest.raises(dataclasses.FrozenInstanceError):
        scan.total_bytes = 0  # type: ignore[misc]
    # the bundle holds exactly the scanned files
    assert script_names(tmp_path, project) == {f for f, _ in scan.files}


def test_the_dry_run_line_without_skips_and_with_many(tmp_path):
    one = make_tree(tmp_path / "one", {"train.py": "abc"})
    assert render_scan(scan_script_dir(str(one))) == \
        f"code dir   {one}: 1 file, 3 B uploaded to each node"
    many = make_tree(tmp_path / "many", {"train.py": "", **{f".d/k{i:02}": "" for i in range(13)}})
    line = render_scan(scan_script_dir(str(many)))
    assert line.endswith("13 skipped as secret-looking: " + ", ".join(
        f".d/k{i:02}" for i in range(10)) + " and 3 more")


def test_the_dry_run_line_names_what_the_ignore_files_held_back_largest_first(tmp_path,
                                                                               monkeypatch):
    """Issue #32 item 6: "6 files, 3.2 KiB" and never a word of the 20 MiB
    data/ that .gitignore kept home. Outermost entries only, with sizes; a
    directory too big to walk for a dry-run is "large"."""
    project = make_tree(tmp_path / "project", {
        "train.py": "t", "data/train/a.bin": "a" * 3000, "data/train/b.bin": "b" * 2000,
        "data/val/c.bin": "c" * 100, "logs/x.log": "x" * 10, "model.ckpt": "m" * 50,
        ".gitignore": "data/\n*.ckpt\n", ".ddp-orch-ignore": "logs/\n"})
    scan = scan_script_dir(str(project))
    assert scan.ignored == (("data/", 5100), ("logs/", 10), ("model.ckpt", 50))
    assert scan.summary().endswith(
        "; held back by .gitignore/.ddp-orch-ignore: data/ (5.0 KiB), model.ckpt (50 B), "
        "logs/ (10 B)")
    monkeypatch.setattr(bundle_mod, "_IGNORED_WALK_BUDGET", 3)
    assert scan_script_dir(str(project)).ignored[0] == ("data/", None)
    assert "data/ (large)" in scan_script_dir(str(project)).summary()


def test_a_script_the_upload_would_leave_out_is_refused_before_anything_starts(tmp_path):
    """The dry-run's scan is the bundle's: a script it would not carry (ignored, a
    link, secret-looking) is an error with the field, not a failure on every node."""
    from orchestrator.config.loader import load_cluster_text
    from orchestrator.errors import ConfigError
    from orchestrator.plan.build import build_plan

    project = make_tree(tmp_path / "project", {
        "scripts/train.py": "", "gen/train.py": "", ".hidden/train.py": "", "ok.py": "",
        ".gitignore": "gen/\n"})
    (project / "link.py").symlink_to(project / "ok.py")

    def notes(script: str) -> tuple[str, ...]:
        spec = load_cluster_text(f"nodes:\n  - {{host: a, procs: 1}}\nworkload:\n  code: .\n"
                                 f"  script: {script}\n", source="c.yaml", base_dir=str(project))
        return bundle_mod.code_notes(build_plan(spec, run_id="r", local_run_dir="/r"), "c.yaml")

    assert notes("scripts/train.py")[0].startswith(f"code dir   {project}: 2 files")  # and ok.py
    for script, why in (("gen/train.py", "ignored (.gitignore"),
                        (".hidden/train.py", "held back as secret-looking"),
                        ("link.py", "a symbolic link")):
        with pytest.raises(ConfigError) as caught:
            notes(script)
        assert caught.value.path == "workload.script", script
        assert f"the script {script} would not reach the nodes" in str(caught.value)
        assert why in str(caught.value)


def test_an_empty_code_directory_is_still_the_workers_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    build_bundle(str(tmp_path / "b.tar.gz"), str(tmp_path / "empty"))
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        assert tar.getmember("project").isdir()
