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
from orchestrator.agent.bootstrap import PACKAGE, sources

AGENT_DIR = os.path.dirname(agent.__file__)
MODULES = sorted(name[:-3] for name in os.listdir(AGENT_DIR) if name.endswith(".py"))


def test_every_import_statement_names_the_stdlib_or_the_package():
    bad = []
    for name in MODULES:
        with open(os.path.join(AGENT_DIR, f"{name}.py"), encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue  # relative: the package itself
            bad += [f"{name}.py: {n}" for n in names
                    if n.split(".")[0] not in sys.stdlib_module_names]
    assert bad == []


@pytest.mark.parametrize("module", MODULES)
def test_each_module_imports_with_only_the_stdlib(module, tmp_path):
    shutil.copytree(AGENT_DIR, tmp_path / PACKAGE,
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = PACKAGE if module == "__init__" else f"{PACKAGE}.{module}"
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import json, {target}\n"
            "loaded = sorted({m.split('.')[0] for m in sys.modules})\n"
            "print(json.dumps([m for m in loaded if m not in sys.stdlib_module_names\n"
            "                  and m != '__main__']))\n")
    ran = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True, timeout=60, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout) == [PACKAGE]


def test_what_is_shipped_is_the_whole_package_and_nothing_else():
    assert sorted(sources()) == sorted(
        PACKAGE if m == "__init__" else f"{PACKAGE}.{m}" for m in MODULES)
