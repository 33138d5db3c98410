"""Shared test setup: the repo on sys.path, helpers for running the CLI."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
# The suite by layer: unit/<package>/ (fast, no processes of ddp-orch's own),
# live/ (real torchrun, sshd, network namespaces, Slurm) and labs/ (the
# hosts, networks and Slurm the live tests run on, with tests of their own).
LABS = os.path.join(TESTS, "labs")
LIVE = os.path.join(TESTS, "live")  # live suites share helpers (test_long_runs.up)
for path in (ROOT, TESTS, LABS, LIVE):
    if path not in sys.path:
        sys.path.insert(0, path)

# A command run without --runs-dir, away from a runs/ of ddp-orch, falls back
# to the user's default (~/.local/share/ddp-orch/runs): the suite's own runs
# go to a directory of its own instead, inherited by every command it starts.
os.environ["XDG_DATA_HOME"] = tempfile.mkdtemp(prefix="ddp-orch-tests-xdg-")

# A suite started in the background of a shell without job control (`cmd &`,
# `nohup cmd &`) has SIGINT ignored, and every command it starts inherits
# that: a test's Ctrl-C (attach, up) would then do nothing and the test
# would fail for the way it was started. A user's terminal delivers SIGINT;
# so do the suite's commands, whatever started the suite.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# scripts/mutation runs the tests once per mutant: there Hypothesis draws 10
# examples per test, a test's own @settings(max_examples=...) included.
if os.environ.get("DDP_ORCH_MUTATION"):
    from hypothesis import settings as _settings

    _settings.register_profile("mutation", max_examples=10, deadline=None, database=None)
    _settings.load_profile("mutation")


# Under `pytest -n 2` (README's test command) the live tests, labs' own
# included, run one after another on one worker, in file order, exactly as
# without xdist: the labs are session-scoped, the tests' time bounds assume no
# second run beside them, and their run ids and addresses are unique only
# within one session. The other worker takes the unit and in-process workload
# tests, which start no run. (xdist's own `--dist loadgroup` cannot do it:
# under pytest 9 its group suffix never reaches the node id.) The modules
# are named by path, since xdist's scheduler sees only node ids; a live test
# outside them is a usage error, so the rule cannot drift from the marker.
LIVE_MODULES = ("tests/live/", "tests/labs/", "tests/workloads/test_wl_live.py",
                "tests/workloads/test_wl_seed_layout.py", "tests/workloads/test_wl_orchestrated.py",
                "tests/workloads/test_wl_device_policy.py", "tests/workloads/test_wl_gpu.py")
LIVE_GROUP = "live"


def runs_apart(nodeid: str) -> bool:
    """Is the test ``nodeid`` one of the live tests run one at a time?"""
    return nodeid.startswith(LIVE_MODULES)


def pytest_xdist_make_scheduler(config, log):
    """The live tests are one unit of xdist's work, every other test a unit
    of its own; the largest unit (the live tests) is handed out first."""
    from xdist.scheduler import LoadScopeScheduling

    class LiveTestsApart(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return LIVE_GROUP if runs_apart(nodeid) else nodeid

    return LiveTestsApart(config, log)


def pytest_collection_modifyitems(config, items):
    strays = [item.nodeid for item in items
              if item.get_closest_marker("live") is not None and not runs_apart(item.nodeid)]
    if strays:
        raise pytest.UsageError(f"live tests outside tests/conftest.py's LIVE_MODULES (add "
                                f"their modules there, or move them): {', '.join(strays[:5])}")
    if os.environ.get("DDP_ORCH_MUTATION"):
        _cap_hypothesis(items)


def _cap_hypothesis(items) -> None:
    """Under ``DDP_ORCH_MUTATION``, cap a test's own ``@settings`` too (they
    win over a profile): Hypothesis keeps them on the test function."""
    from hypothesis import settings as _settings

    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)
        if own is not None:
            test._hypothesis_internal_use_settings = _settings(own, max_examples=10, deadline=None,
                                                               database=None)


def run_cli(*args: str, cwd: str | None = None, timeout: float = 300,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m orchestrator`` as a user would, capturing its output."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = ROOT
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=cwd or ROOT,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """``python -m orchestrator ARGS`` in the background (its own session),
    stdout and stderr together, for tests that act while it runs."""
    return subprocess.Popen([sys.executable, "-m", "orchestrator", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for_lines(proc: subprocess.Popen, text: str, count: int = 1) -> str:
    """Read ``proc``'s output until ``text`` has appeared ``count`` times."""
    seen = ""
    while seen.count(text) < count:
        line = proc.stdout.readline()
        assert line, seen
        seen += line
    return seen


def local_job(tmp_path, name: str, program: str, nodes: str, extra: str = "") -> str:
    """``tests/programs/PROGRAM`` as a cluster file for this machine: the
    program copied beside ``NAME.yaml``, ``nodes`` as YAML flow text, and
    ``extra`` top-level lines first. Returns the file's path."""
    shutil.copy(os.path.join(TESTS, "programs", program), tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"{extra}nodes: {nodes}\nworkload: {{script: {program}}}\n")
    return str(path)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def project(tmp_path):
    """An empty project as people lay it out: a package, configs, scripts
    (``workload.code`` tests write their cluster file beside them)."""
    for rel in ("proj/__init__.py", "proj/train.py", "configs/x.yaml", "scripts/train.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    return tmp_path


from slurmlab import slurm_lab  # noqa: E402,F401  (fixtures for every test module)
from sshlab import make_ssh_lab, ssh_lab  # noqa: E402,F401
from netlab import make_net_lab, net_lab  # noqa: E402,F401


def every_file_holding(root, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes hold ``secret`` (gzip members unpacked)."""
    import gzip

    found = []
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if path.suffix == ".gz":
                data = gzip.decompress(data)
            if secret.encode() in data:
                found.append(str(path.relative_to(root)))
    return found
