"""Bad input, as a user meets it: one clear message, exit code 2, no traceback.

Each file in ``tests/bad_inputs/`` is a malformed cluster file that says in
its leading comments what ``ddp-orch up FILE --dry-run`` must print::

    # what is wrong with this file
    # expect-line: 9                 1-based line in the whole file (comments count)
    # expect-path: nodes[1].gpus     the field path, or (none) for whole-file errors
    # expect: duplicate GPU 2        a substring of the message
    # expect-hint: ...               optional: a substring of the hint line

The line an error points at is also marked ``# <-`` in most files. Every
file goes through the real command line in a subprocess (run in parallel,
so the ~70 files take a few seconds). Files that cannot be stored as text
(non-UTF-8 bytes, control characters) or that depend on this machine
(an unreadable key file) are written at test time below, as are the bad
command lines.
"""

from __future__ import annotations

import concurrent.futures
import glob
import os
import re
import subprocess

import pytest

from conftest import ROOT, run_cli
from wording import shared_words

CORPUS_DIR = os.path.join("tests", "bad_inputs")
CORPUS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, CORPUS_DIR, "*.yaml")))
NAME_RE = re.compile(r"^\d\d-[a-z0-9-]+\.yaml$")
EXPECT_RE = re.compile(r"^# (expect(?:-[a-z]+)?): ?(.*)$")
IS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def expectations(name: str) -> dict[str, str]:
    """The ``# expect...:`` lines at the top of a corpus file."""
    found: dict[str, str] = {}
    with open(os.path.join(ROOT, CORPUS_DIR, name), encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            match = EXPECT_RE.match(line.rstrip("\n"))
            if match:
                found[match.group(1)] = match.group(2)
    return found


def assert_one_error(result: subprocess.CompletedProcess, *, source: str, line: int | str,
                     path: str, expect: str, hint: str = "") -> None:
    """Exit 2, nothing on stdout, and stderr exactly one ``ddp-orch: error:``
    line (``FILE:LINE: field.path: message``) plus at most one hint line."""
    err = result.stderr
    assert result.returncode == 2, (result.returncode, err)
    assert "Traceback" not in err, err
    assert result.stdout == "", result.stdout
    lines = err.rstrip("\n").split("\n")
    assert len(lines) in (1, 2), err
    assert lines[0].startswith("ddp-orch: error: "), err
    where = f"ddp-orch: error: {source}:{line}: " + (f"{path}: " if path else "")
    assert lines[0].startswith(where), f"expected {where!r}...\ngot {err}"
    assert expect in lines[0][len(where):], f"expected {expect!r} in the message\ngot {err}"
    if len(lines) == 2:
        assert lines[1].startswith("  hint: ") and len(lines[1]) > len("  hint: "), err
    if hint:
        assert len(lines) == 2 and hint in lines[1], f"expected hint {hint!r}\ngot {err}"


# the corpus ---------------------------------------------------------------


def test_the_corpus_is_large_and_well_formed():
    assert len(CORPUS) >= 32
    numbers = [name[:2] for name in CORPUS]
    assert len(set(numbers)) == len(numbers), "two files share a number"
    for name in CORPUS:
        assert NAME_RE.match(name), name
        expect = expectations(name)
        assert {"expect-line", "expect-path", "expect"} <= set(expect), name
        assert expect["expect"].strip(), name
        with open(os.path.join(ROOT, CORPUS_DIR, name), encoding="utf-8") as fh:
            text = fh.read()
        line = int(expect["expect-line"])
        assert 1 <= line <= len(text.splitlines()) + 1, name
        marked = [n for n, text_line in enumerate(text.splitlines(), 1)
                  if text_line.endswith("# <-")]
        assert marked in ([], [line]), f"{name}: '# <-' is on line {marked}, expect-line {line}"


@pytest.fixture(scope="module")
def corpus_results() -> dict[str, subprocess.CompletedProcess]:
    """``ddp-orch up FILE --dry-run`` for every corpus file, a few at a time."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(run_cli, "up", os.path.join(CORPUS_DIR, name), "--dry-run",
                                     timeout=60)
                   for name in CORPUS}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("name", CORPUS)
def test_each_bad_file_gives_one_clear_error(name, corpus_results):
    expect = expectations(name)
    path = expect["expect-path"]
    assert_one_error(corpus_results[name], source=os.path.join(CORPUS_DIR, name),
                     line=expect["expect-line"], path="" if path == "(none)" else path,
                     expect=expect["expect"], hint=expect.get("expect-hint", ""))


@pytest.mark.parametrize("name", CORPUS)
def test_each_hint_adds_what_its_message_does_not_say(name, corpus_results):
    """Issue #45: a hint that repeats its message tells the user nothing more;
    no hint shares a run of four words with its message."""
    lines = corpus_results[name].stderr.splitlines()
    hint = next((line.split("hint: ", 1)[1] for line in lines if "  hint: " in line), "")
    assert not shared_words(lines[0], hint), (lines[0], hint)


# files written at test time -------------------------------------------------

GOOD_TAIL = "nodes:\n  - host: a\n    gpus: 0\nworkload:\n  name: linear\n"

WRITTEN = [
    # (file name, bytes, line, path, message, hint)
    ("latin1.yaml", b"# caf\xe9 cluster\n" + GOOD_TAIL.encode(), 1, "",
     "not UTF-8 text: byte 0xe9 cannot be decoded", "save the file as UTF-8"),
    ("binary.yaml", b"name: demo\n" + bytes(range(0x80, 0x100)) + b"\n", 2, "",
     "not UTF-8 text: byte 0x80", "UTF-8"),
    ("utf16.yaml", GOOD_TAIL.encode("utf-16"), 1, "", "not UTF-8 text: byte 0xff", ""),
    ("form-feed.yaml", b"name: demo\n\x0c\n" + GOOD_TAIL.encode(), 2, "",
     "unacceptable character #x000c: control characters are not allowed", "plain UTF-8 text"),
    ("nul-byte.yaml", GOOD_TAIL.encode().replace(b"host: a", b"host: a\x00"), 2, "",
     "unacceptable character #x0000", ""),
]


@pytest.mark.parametrize("name, data, line, path, message, hint", WRITTEN,
                         ids=[w[0] for w in WRITTEN])
def test_files_that_are_not_text_give_one_clear_error(tmp_path, name, data, line, path, message,
                                                      hint):
    bad = tmp_path / name
    bad.write_bytes(data)
    assert_one_error(run_cli("up", str(bad), "--dry-run"), source=str(bad), line=line, path=path,
                     expect=message, hint=hint)


@pytest.mark.parametrize("kind", [
    "directory",
    pytest.param("chmod-000", marks=pytest.mark.skipif(
        IS_ROOT, reason="root reads a chmod 000 file anyway; the directory case stands in")),
])
def test_an_unreadable_identity_file_is_refused(tmp_path, kind):
    """An identity_file that exists but cannot be read. As root (CI containers)
    permissions do not stop a read, so a directory in the key's place is the
    portable way to have a path that exists and is not a readable key file."""
    key = tmp_path / "id_ed25519"
    if kind == "directory":
        key.mkdir()
    else:
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
        key.chmod(0)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"ssh:\n  identity_file: {key}\n" + GOOD_TAIL)
    assert_one_error(run_cli("up", str(cluster), "--dry-run"), source=str(cluster), line=2,
                     path="ssh.identity_file", expect=f"cannot read the key file '{key}'",
                     hint="permissions")


def test_a_key_file_without_read_permission_is_refused_even_as_root(tmp_path, monkeypatch):
    """The permission branch itself, in-process: ``os.access`` answers as it
    would for a user without read permission on the key file."""
    from orchestrator.config import loader
    from orchestrator.errors import ConfigError

    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    real_access = os.access

    def access(p, mode, **kw):
        return False if p == str(key) else real_access(p, mode, **kw)

    monkeypatch.setattr(loader.os, "access", access)
    with pytest.raises(ConfigError) as info:
        loader.load_cluster_text(f"ssh:\n  identity_file: {key}\n" + GOOD_TAIL, source="c.yaml")
    assert str(info.value).startswith(
        f"c.yaml:2: ssh.identity_file: cannot read the key file '{key}'")


# bad command lines ----------------------------------------------------------

LOCAL = ("up", "--local", "--workload", "linear")
CLI = "command line"

DDP_ERRORS = [
    # (argv, the error line after "ddp-orch: error: ", hint substring)
    ((*LOCAL, "--gpus", "0,,1", "--dry-run"),
     f"{CLI}: --gpus: an empty entry in '0,,1' is not a GPU index", "whole numbers"),
    ((*LOCAL, "--gpus", "0,1,1", "--dry-run"), f"{CLI}: --gpus: duplicate GPU 1 in '0,1,1'", ""),
    ((*LOCAL, "--gpus", "\u00b2", "--dry-run"),  # was a ValueError traceback
     f"{CLI}: --gpus: '\u00b2' in '\u00b2' is not a GPU index", ""),
    ((*LOCAL, "--gpus", "-1", "--dry-run"), f"{CLI}: --gpus: '-1' in '-1' is not a GPU index", ""),
    ((*LOCAL, "--arg", "epochs", "--dry-run"), f"{CLI}: --arg: 'epochs' is not KEY=VALUE", ""),
    ((*LOCAL, "--arg", "epochs=ten", "--dry-run"), f"{CLI}: --arg epochs: expected int, got 'ten'",
     ""),
    (("up", "--local", "--workload", "toy", "--arg", "dataset=moons", "--dry-run"),
     f"{CLI}: --arg dataset: 'moons' is not one of seed, blobs", ""),
    (("up", "--local", "--workload", "linaer", "--dry-run"),
     f"{CLI}: --workload: unknown workload 'linaer'", "did you mean 'linear'?"),
    ((*LOCAL, "--gpus", "0", "--procs", "2", "--dry-run"),
     f"{CLI}: give --gpus or --procs, not both", ""),
    (("up", "/nonexistent/cluster.yaml", "--dry-run"), "no such file: /nonexistent/cluster.yaml",
     "pass the path of a cluster file"),
    (("up", "--dry-run"), f"{CLI}: give a cluster file, or --local", ""),
    (("up", "cluster.yaml.example", "--gpus", "0", "--dry-run"),
     f"{CLI}: --workload, --gpus, --procs and --device go with --local", ""),
    (("up", "cluster.yaml.example", "--run-id", "../x", "--dry-run"),
     f"{CLI}: --run-id: '../x' is not a valid run id", ""),
    # options that would be ignored without a word: refused, with the fix
    (("up", "cluster.yaml.example", "--format", "json"),
     f"{CLI}: --format: json is a form of the dry-run's output; without --dry-run",
     "add --dry-run"),
    ((*LOCAL, "--procs", "2", "--format", "shell"),
     f"{CLI}: --format: shell is a form of the dry-run's output", "--dry-run --format shell"),
    ((*LOCAL, "--procs", "2", "--queue-timeout", "60", "--dry-run"),
     f"{CLI}: --queue-timeout: only the slurm backend has a queue to time out", "--start-timeout"),
    (("up", "cluster.yaml.example", "--queue-timeout", "60"),
     f"{CLI}: --queue-timeout: only the slurm backend", "drop --queue-timeout"),
    (("compare", "--local", "--workload", "noop", "--procs", "2", "--queue-timeout", "60"),
     f"{CLI}: --queue-timeout: only the slurm backend", "drop --queue-timeout"),
    # kept runs watch for hangs through their keepers; a detached Slurm job has none
    (("up", "tests/golden/slurm.yaml", "--detach", "--hang-timeout", "60", "--dry-run"),
     f"{CLI}: --hang-timeout: a detached slurm job has no hang watchdog", "drop --detach"),
]


@pytest.mark.parametrize("argv, error, hint", DDP_ERRORS,
                         ids=[" ".join(argv[1:]) for argv, *_ in DDP_ERRORS])
def test_bad_command_lines_give_one_ddp_orch_error(argv, error, hint):
    result = run_cli(*argv, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.rstrip("\n").split("\n")
    assert lines[0].startswith(f"ddp-orch: error: {error}"), result.stderr
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), result.stderr
    if hint:
        assert hint in lines[-1], result.stderr


CLICK_ERRORS = [
    # click's own checks, reported in ddp-orch's format: one error line and a hint
    ((*LOCAL, "--procs", "0"), "Invalid value for '--procs': 0 is not in the range 1<=x<=1024"),
    ((*LOCAL, "--procs", "many"), "Invalid value for '--procs': 'many' is not a valid integer"),
    (("up", "cluster.yaml.example", "--dry-run", "--format", "xml"),
     "Invalid value for '--format': 'xml' is not one of 'text', 'json', 'shell'"),
    ((*LOCAL, "--device", "gpu"), "Invalid value for '--device': 'gpu' is not one of"),
    (("up", CORPUS_DIR, "--dry-run"), "is a directory"),
    (("up", "--no-such-flag"), "No such option"),
]


@pytest.mark.parametrize("argv, error", CLICK_ERRORS,
                         ids=[" ".join(argv[1:]) for argv, _ in CLICK_ERRORS])
def test_bad_options_give_one_usage_error(argv, error):
    result = run_cli(*argv, timeout=60)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stdout == ""
    lines = result.stderr.rstrip("\n").split("\n")
    assert len(lines) == 2 and lines[0].startswith("ddp-orch: error: "), result.stderr
    assert error in lines[0] and lines[1].startswith("  hint: see `ddp-orch"), result.stderr


@pytest.mark.parametrize("value", [
    "2020-13-45",  # ValueError: YAML reads a date that does not exist
    "!!int x",  # ValueError from the int constructor
    "0x" + "f" * 5000,  # ValueError later, when the plan does str() of a 20000-bit int
    "[" * 1200,  # RecursionError in PyYAML's composer
], ids=["bad-date", "bad-int-tag", "huge-hex", "deep-nesting"])
def test_an_arg_value_yaml_cannot_read_is_an_error_not_a_traceback(value):
    result = run_cli(*LOCAL, "--arg", f"epochs={value}", "--dry-run", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-300:]
    assert result.stderr.startswith("ddp-orch: error: command line: --arg")
