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


# Under `pytest -n 2` (README's test command) the live tests run two at a
# time, one module per xdist worker, beside the unit tests: most of a live
# test's time is spent waiting (for a timeout, a hang verdict, a link given
# up on), so a second one beside it nearly halves the suite's wall time on
# 2 cores. What two live modules may not share:
# * the Slurm lab: one slurmctld per session, so every module that uses it is
#   one unit of work (SLURM_MODULES), run on one worker in file order;
# * run ids: the "nothing left" scan (labs/procscan.py) finds a run's
#   processes by its id, so an id is one module's (procscan refuses an id a
#   second module uses, whichever ran first);
# * anything else machine-wide: SSH labs listen on ports of their own,
#   network labs take a free 10.77.N.0/24 under a lock, GPU locks are per
#   (fake) GPU, and each worker has its own XDG_DATA_HOME.
# The bounds the live tests assert are measured on the runs' own records
# (labs/bounds.py), not on the wall clock around them, so a busy machine
# does not fail them. (xdist's own `--dist loadgroup` cannot group by
# module: under pytest 9 its group suffix never reaches the node id.) The
# modules are named by path, since xdist's scheduler sees only node ids; a
# live test outside them is a usage error, so the rule cannot drift from
# the marker, and so is a Slurm-lab test outside SLURM_MODULES.
LIVE_MODULES = ("tests/live/", "tests/labs/", "tests/workloads/test_wl_live.py",
                "tests/workloads/test_wl_seed_layout.py", "tests/workloads/test_wl_orchestrated.py",
                "tests/workloads/test_wl_device_policy.py", "tests/workloads/test_wl_gpu.py")
SLURM_MODULES = ("tests/live/test_fault_matrix_slurm.py", "tests/live/test_hang.py",
                 "tests/live/test_setup_outputs_live.py",
                 "tests/live/test_shell_dryrun.py", "tests/live/test_slurm_keeps_the_job.py",
                 "tests/live/test_slurm_launch.py")
SLURM_UNIT = "slurm-lab"
SLURM_FIXTURE = "slurm_lab"
RUN_IDS_ENV = "DDP_ORCH_TEST_RUN_IDS"  # labs/procscan.py: which module took each run id

if not os.environ.get("PYTEST_XDIST_WORKER"):  # the session's process; workers inherit it
    os.environ[RUN_IDS_ENV] = tempfile.mkdtemp(prefix="ddp-orch-tests-run-ids-")


def work_unit(nodeid: str) -> str:
    """The unit of xdist's work ``nodeid`` belongs to: its module (so a
    module-scoped fixture is set up once, not once per worker), every
    Slurm-lab test together."""
    if nodeid.startswith(SLURM_MODULES):
        return SLURM_UNIT
    return nodeid.split("::", 1)[0]


def unit_order(unit: str, size: int) -> tuple[int, int]:
    """Which unit a free worker takes first: the Slurm lab's (the longest),
    then the live modules, then the unit tests, each the largest first.
    Live modules mostly wait, so they start at once and overlap; the unit
    tests are pure CPU and fill in at the end, wherever a worker is free."""
    kind = 0 if unit == SLURM_UNIT else 1 if unit.startswith(LIVE_MODULES) else 2
    return kind, -size


def pytest_configure(config):
    """``DDP_ORCH_TEST_CPU=FILE``: each test's CPU, its processes' included
    (labs/cpuusage.py: where the suite's time goes)."""
    import cpuusage

    cpuusage.register(config)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling over ``work_unit``, handing units out in
    ``unit_order``."""
    from xdist.scheduler import LoadScopeScheduling

    class LiveModulesFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            first = min(self.workqueue, key=lambda unit: unit_order(unit,
                                                                    len(self.workqueue[unit])))
            self.workqueue.move_to_end(first, last=False)  # what xdist pops next
            super()._assign_work_unit(node)

    return LiveModulesFirst(config, log)


def pytest_collection_modifyitems(config, items):
    strays = [item.nodeid for item in items
              if item.get_closest_marker("live") is not None
              and not item.nodeid.startswith(LIVE_MODULES)]
    if strays:
        raise pytest.UsageError(f"live tests outside tests/conftest.py's LIVE_MODULES (add "
                                f"their modules there, or move them): {', '.join(strays[:5])}")
    slurm = [item.nodeid for item in items if SLURM_FIXTURE in getattr(item, "fixturenames", ())
             and not item.nodeid.startswith(SLURM_MODULES)]
    if slurm:
        raise pytest.UsageError(f"Slurm-lab tests outside tests/conftest.py's SLURM_MODULES (add "
                                f"their modules there): {', '.join(slurm[:5])}")
    if os.environ.get("DDP_ORCH_MUTATION"):
        _cap_hypothesis(items)
    _fault_matrix_share(config, items)


FAULT_MATRIX_SHARE = 2  # cells a CI run takes, chosen by its commit, besides the regressions


def _fault_matrix_share(config, items) -> None:
    """The fault matrix's cells run whole with ``-m faultmatrix`` (and ``-k``
    for some); otherwise (the suite, CI) only this commit's share: cells
    chosen by the commit's hash, so that over a few commits every cell runs,
    and every cell that has ever failed (``labs/fault_regressions.txt``)."""
    cells = [item for item in items if item.get_closest_marker("faultmatrix") is not None]
    if not cells or "faultmatrix" in (config.option.markexpr or ""):
        return
    import faultmatrix

    commit = os.environ.get("DDP_ORCH_FAULT_COMMIT") or _commit()
    share = set(faultmatrix.ci_share(commit, FAULT_MATRIX_SHARE, faultmatrix.regressions()))
    dropped = [item for item in cells if item.callspec.params.get("cell") not in share]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        keep = set(map(id, dropped))
        items[:] = [item for item in items if id(item) not in keep]


def _commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True)
    return done.stdout.strip() or "no-commit"


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


def load_script(name: str):
    """``scripts/NAME`` (no ``.py``) imported as a module, for its functions."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader(name.replace("-", "_"),
                                                  os.path.join(ROOT, "scripts", name))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


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
