"""The worker shim is transparent: the same program behaves the same through it.

Each case runs a small program twice, as ``python script.py`` (or ``python
-m pkg.main``) and through ``python -m ddp_orch_shim``, and compares what the
program saw and how it ended. No torch: the shim is standard library only.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT

SHIM_SOURCE = os.path.join(ROOT, "orchestrator", "agent", "worker", "shim.py")

PROBE = """\
import json, os, sys
print(json.dumps({"argv": sys.argv, "file": __file__, "name": __name__,
                  "path0": sys.path[0], "spec": repr(__spec__)}))
"""

PACKAGE_MAIN = """\
import json, sys
from .helper import VALUE
print(json.dumps({"argv0": sys.argv[0], "rest": sys.argv[1:], "name": __name__,
                  "package": __package__, "file": __file__, "value": VALUE}))
"""


@pytest.fixture
def shim_dir(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(SHIM_SOURCE, code / "ddp_orch_shim.py")
    (tmp_path / "probe.py").write_text(PROBE)
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "helper.py").write_text("VALUE = 42\n")
    (pkg / "main.py").write_text(PACKAGE_MAIN)
    return tmp_path


def run(shim_dir, argv, *, shim: bool, env=None, **kwargs):
    full = [sys.executable, *(("-m", "ddp_orch_shim") if shim else ()), *argv]
    path = os.pathsep.join([str(shim_dir / "code"), str(shim_dir)])
    return subprocess.run(full, cwd=shim_dir, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": path, **(env or {})}, **kwargs)


def test_a_script_sees_the_same_argv_file_name_and_path(shim_dir):
    argv = ["probe.py", "--lr", "0.1", "-m", "x y"]
    plain, shimmed = (run(shim_dir, argv, shim=s) for s in (False, True))
    assert plain.returncode == shimmed.returncode == 0, shimmed.stderr
    seen, expected = json.loads(shimmed.stdout), json.loads(plain.stdout)
    for key in ("argv", "file", "name", "path0"):
        assert seen[key] == expected[key], key
    assert seen["name"] == "__main__" and seen["argv"][1:] == ["--lr", "0.1", "-m", "x y"]


def test_a_module_keeps_its_package_and_relative_imports(shim_dir):
    argv = ["-m", "pkg.main", "--epochs", "3"]
    plain, shimmed = (run(shim_dir, argv, shim=s) for s in (False, True))
    assert plain.returncode == shimmed.returncode == 0, shimmed.stderr
    assert json.loads(shimmed.stdout) == json.loads(plain.stdout)
    assert json.loads(shimmed.stdout)["value"] == 42


@pytest.mark.parametrize("body, code", [
    ("import sys; sys.exit(3)", 3),
    ("import sys; sys.exit('bad input')", 1),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM),
    ("raise KeyboardInterrupt", -signal.SIGINT),
    ("pass", 0),
])
def test_exit_codes_are_unchanged(shim_dir, body, code):
    (shim_dir / "ends.py").write_text(body + "\n")
    plain, shimmed = (run(shim_dir, ["ends.py"], shim=s) for s in (False, True))
    assert plain.returncode == shimmed.returncode == code, shimmed.stderr


def test_future_imports_of_the_shim_do_not_leak_into_the_program(shim_dir):
    (shim_dir / "annot.py").write_text("def f(x: int) -> int: return x\n"
                                       "print(f.__annotations__['x'] is int)\n")
    plain, shimmed = (run(shim_dir, ["annot.py"], shim=s) for s in (False, True))
    assert plain.stdout == shimmed.stdout == "True\n"


def test_main_stays_the_programs_module_after_it_returns(shim_dir):
    """An atexit handler pickling a __main__ class still finds it (python -m)."""
    (shim_dir / "pkg" / "keeps.py").write_text(
        "import atexit, pickle, sys\n"
        "class Config: pass\n"
        "atexit.register(lambda: print(len(pickle.dumps(Config())) > 0, "
        "sys.modules['__main__'].__name__))\n")
    plain, shimmed = (run(shim_dir, ["-m", "pkg.keeps"], shim=s) for s in (False, True))
    assert plain.returncode == shimmed.returncode == 0, shimmed.stderr
    assert plain.stdout == shimmed.stdout == "True __main__\n"


def test_an_uncaught_exception_goes_to_torchruns_error_file_and_prints_as_usual(shim_dir):
    (shim_dir / "boom.py").write_text("def f():\n    raise RuntimeError('planned crash')\n\nf()\n")
    error_file = shim_dir / "error.json"
    plain = run(shim_dir, ["boom.py"], shim=False)
    shimmed = run(shim_dir, ["boom.py"], shim=True, env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert plain.returncode == shimmed.returncode == 1
    assert shimmed.stderr == plain.stderr  # the user's frames only, as plain Python prints
    record = json.loads(error_file.read_text())["message"]
    assert record["message"] == "RuntimeError: planned crash"
    assert 'boom.py", line 2, in f' in record["extraInfo"]["py_callstack"]
    assert abs(int(record["extraInfo"]["timestamp"]) - time.time()) < 60


def test_an_error_whose_class_says_one_line_prints_one_line_and_keeps_the_traceback_on_file(
        shim_dir):
    """WorkloadError's flag (workloads/contract.py's ONE_LINE_ERROR): each rank
    prints one line, not a traceback that every rank repeats."""
    from workloads.contract import ONE_LINE_ERROR
    from workloads.harness.context import WorkloadError

    assert getattr(WorkloadError, ONE_LINE_ERROR) is True
    (shim_dir / "bad.py").write_text(
        "class WorkloadError(ValueError):\n"
        f"    {ONE_LINE_ERROR} = True\n\n"
        "def f():\n    raise WorkloadError('--data real: no MNIST at ./data/MNIST/raw')\n\nf()\n")
    error_file = shim_dir / "error.json"
    shimmed = run(shim_dir, ["bad.py"], shim=True,
                  env={"TORCHELASTIC_ERROR_FILE": str(error_file)})
    assert shimmed.returncode == 1
    assert shimmed.stderr == "WorkloadError: --data real: no MNIST at ./data/MNIST/raw\n"
    record = json.loads(error_file.read_text())["message"]
    assert record["message"] == "WorkloadError: --data real: no MNIST at ./data/MNIST/raw"
    assert 'bad.py", line 5, in f' in record["extraInfo"]["py_callstack"]


# A rank whose other thread imports modules without end (as the flight
# recorder's first dump does for seconds, or a data loader's thread): a dump
# of every thread reads that thread's frames while the import frees them, and
# CPython 3.11 died of SIGSEGV within 1 to 6 such dumps (measured).
IMPORTS_BESIDE = """\
import importlib, sys, threading, time
MODULES = ["json", "csv", "tempfile", "argparse", "decimal", "fractions"]
def imports():
    while True:
        for name in MODULES:
            for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
                del sys.modules[loaded]
            importlib.import_module(name)
threading.Thread(target=imports, daemon=True).start()
print('ready', flush=True)
time.sleep(60)
"""


def test_the_stack_signal_dumps_the_main_thread_and_never_ends_the_rank(shim_dir):
    from orchestrator.agent import stackgroups
    from orchestrator.agent.node.stacks import armed, dump_looks_whole
    from orchestrator.agent.worker.shim import STACK_SIGNAL

    (shim_dir / "waits.py").write_text(IMPORTS_BESIDE)
    proc = subprocess.Popen([sys.executable, "-m", "ddp_orch_shim", "waits.py"], cwd=shim_dir,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(shim_dir / "code"), "RANK": "5"})
    dump = shim_dir / "stacks" / "rank-5.txt"
    try:
        assert proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not armed(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for attempt in range(20):
            before = dump.stat().st_size if dump.exists() else 0
            proc.send_signal(STACK_SIGNAL)
            deadline = time.monotonic() + 10
            while proc.poll() is None and time.monotonic() < deadline and not (
                    dump.exists() and dump_looks_whole(dump.read_text()[before:])):
                time.sleep(0.01)
            assert proc.poll() is None, f"dump {attempt + 1} ended the rank: {proc.returncode}"
            text = dump.read_text()[before:]
            assert text.startswith("Stack (most recent call first):"), text
            # The main thread alone, at its sleep (line 11, or 10 where a loaded
            # machine delivers the signal while print still returns).
            assert re.search(r'waits\.py", line 1[01] in <module>', text), text
            assert "imports" not in text and stackgroups.place("faulthandler", text) in (
                "<module> (waits.py:11)", "<module> (waits.py:10)")
    finally:
        proc.kill()
        proc.wait()


def test_stack_dumps_go_to_the_run_directory_not_the_working_directory(tmp_path, monkeypatch):
    """Ranks start in the code root; their stacks files stay in the node's run
    directory, the directory of the result file (as the progress files do)."""
    from orchestrator.agent.worker import shim
    from workloads import contract

    assert shim.RESULT_FILE_ENV == contract.RESULT_FILE_ENV
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(contract.RESULT_FILE_ENV, "/runs/r/node-1/result.json")
    assert shim.stacks_file(shim.run_dir(), "3") == "/runs/r/node-1/stacks/rank-3.txt"
    monkeypatch.delenv(contract.RESULT_FILE_ENV)
    assert shim.run_dir() == str(tmp_path)  # run by hand: here


@pytest.mark.parametrize("version, dropped", [("2.14.1+cu130", True), ("2.8.0", True),
                                               ("2.7.1", False), ("2.5.0a0", False)])
def test_the_old_flight_recorder_names_go_where_torch_reads_the_new(monkeypatch, tmp_path,
                                                                   version, dropped):
    """The version is the one in the version.py of the torch on the path."""
    from orchestrator.agent.worker import shim

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "torch" / "version.py").write_text(
        f"from typing import Optional\n__all__ = ['__version__']\n__version__ = '{version}'\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/r/fr_", "TORCH_FR_DUMP_TEMP_FILE": "/r/fr_",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    shim._flight_recorder_names(env)
    old = {"TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}
    assert (not old & set(env)) if dropped else old <= set(env)
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_the_torch_version_is_read_without_importing_torch(monkeypatch, tmp_path):
    from importlib import metadata

    from orchestrator.agent.worker import shim

    assert shim.torch_version().split("+")[0] == metadata.version("torch").split("+")[0]
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    assert shim.torch_version() is None  # no torch: the names are left alone
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000"}
    shim._flight_recorder_names(env)
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" in env
