"""The node agent is standard library only: nodes have nothing else for it.

Checked two honest ways: every import statement in the package (function
level ones included) names a stdlib module or the package itself, and every
module imports in ``python -I -S`` with nothing on the path but a copy of the
package under the name it has on a node, leaving only stdlib modules loaded.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys

import pytest

from orchestrator import agent
from orchestrator.agent.wire.bootstrap import PACKAGE, sources

AGENT_DIR = os.path.dirname(agent.__file__)


def _modules() -> dict[str, str]:
    """Every module of the package, sub-packages included: its dotted name
    under the package (``""`` for the package, ``wire`` for a sub-package)
    and its file, found on disk independently of ``bootstrap.sources``."""
    out = {}
    for folder, dirs, names in os.walk(AGENT_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        rel = os.path.relpath(folder, AGENT_DIR)
        parts = [] if rel == "." else rel.split(os.sep)
        for name in names:
            if name.endswith(".py"):
                dotted = parts if name == "__init__.py" else [*parts, name[:-3]]
                out[".".join(dotted)] = os.path.join(folder, name)
    return out


FILES = _modules()
MODULES = sorted(FILES)


def test_every_import_statement_names_the_stdlib_or_the_package():
    bad = []
    for name in MODULES:
        with open(FILES[name], encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue  # relative: the package itself
            bad += [f"{FILES[name]}: {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names]
    assert bad == []


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_with_only_the_stdlib(module, tmp_path):
    shutil.copytree(AGENT_DIR, tmp_path / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = f"{PACKAGE}.{module}" if module else PACKAGE
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import json, {target}\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules})\n"
            "print(json.dumps([m for m in loaded if m not in sys.stdlib_module_names\n"
            "                  and m != '__main__']))\n")
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [PACKAGE]


def test_what_is_shipped_is_the_whole_package_and_nothing_else():
    assert sorted(sources()) == sorted(f"{PACKAGE}.{m}" if m else PACKAGE for m in MODULES)
    assert any("." in m for m in MODULES)  # sub-packages are shipped too


def test_the_shipped_agent_imports_its_sub_packages_from_memory():
    """BOOT's finder serves sub-packages: a node with nothing on disk runs
    ``supervise`` (in ``node``) and reads its usage line (``__main__``)."""
    from orchestrator.agent.wire.bootstrap import command, payload

    ran = subprocess.run(command(sys.executable), input=payload(["nonsense"]),
                         capture_output=True, timeout=60, cwd="/")
    assert ran.returncode == 2 and b"usage: ddp_orch_agent" in ran.stderr
    probe = ("import ddp_orch_agent.wire.protocol as p, ddp_orch_agent.node.supervisor as s, "
             "ddp_orch_agent.kept.keeper as k; print(p.__name__, s.__name__, k.__name__)")
    boot = command(sys.executable)[-1].replace(
        "from ddp_orch_agent.__main__ import main\nsys.exit(main(head[\"argv\"]))", "")
    assert "ddp_orch_agent.__main__" not in boot
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", boot + probe],
                         input=payload([]), capture_output=True, timeout=60, cwd="/")
    assert ran.stdout.split() == [b"ddp_orch_agent.wire.protocol",
                                  b"ddp_orch_agent.node.supervisor",
                                  b"ddp_orch_agent.kept.keeper"], ran.stderr
