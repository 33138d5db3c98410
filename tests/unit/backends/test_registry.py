"""The registry is the one list of backend names: the CLI, the plan, the
engine, the controller, the reports and the node agent ask a backend class
(``LaunchBackend``'s capabilities) or read what it wrote, never its name."""

import ast
import os
import re

import pytest

from conftest import ROOT
from orchestrator.backends import backends_with
from orchestrator.config.spec import BACKENDS

NAMES = set(BACKENDS)
SCHEDULER_VARIABLE = re.compile(r"SLURMD?_[A-Z_]+")


def _docstrings(tree: ast.AST) -> set[int]:
    return {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
            and node.body and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)}


@pytest.mark.parametrize("package", ["cli", "plan", "engine", "controller", "report", "agent"])
def test_no_backend_name_or_scheduler_variable_is_written_outside_the_backends(package):
    found = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "orchestrator", package)):
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            skip = _docstrings(tree)
            found += [f"{os.path.relpath(path, ROOT)}:{node.lineno}: {node.value!r}"
                      for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and id(node) not in skip
                      and (node.value in NAMES or SCHEDULER_VARIABLE.fullmatch(node.value))]
    assert found == [], "decide by the backend class (base.LaunchBackend), not its name"


def test_each_capability_is_declared_by_the_backend_that_has_it():
    assert backends_with(lambda cls: bool(cls.queue)) == ["slurm"]
    assert backends_with(lambda cls: not cls.no_restarts) == ["local", "ssh"]
    assert backends_with(lambda cls: cls.this_machine) == ["local"]
    assert backends_with(lambda cls: bool(cls.scheduler)) == ["slurm"]
