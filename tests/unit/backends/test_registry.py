"""The registry is the one list of backend names: the CLI, the plan, the
engine, the controller, the reports and the node agent ask a backend class
(``LaunchBackend.can``, its ``Capabilities``) or read what it wrote, never its name."""

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


@pytest.mark.parametrize("package", ["cli", "plan", "engine", "controller", "report", "records",
                                     "agent"])
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
    assert backends_with(lambda can: can.queue) == ["slurm"]
    assert backends_with(lambda can: can.restarts) == ["local", "ssh"]
    assert backends_with(lambda can: can.this_machine) == ["local"]
    assert backends_with(lambda can: can.scheduler) == ["slurm"]


@pytest.mark.parametrize("facts, words", [
    ({"scheduler": True}, "scheduler_does"), ({"queue": True}, "queue_wait"),
    ({"restarts": False}, "instead_of_restarts")])
def test_a_capability_a_user_is_told_about_is_refused_without_its_words(facts, words):
    """A fact is read as a fact, never from its words; so a backend that
    says it has a queue must say what the queue's wait is, or a refusal
    would read "only the slurm or  backend has a queue"."""
    from orchestrator.backends.base import Capabilities

    with pytest.raises(TypeError, match=f"say {words}"):
        Capabilities(**facts)
    assert Capabilities(**facts, **{words: "in words"})


def test_only_the_registry_knows_where_a_backend_lives():
    """Below the backends, config says which names a file may give; which
    module implements each is the registry's (``backends/__init__.py``)."""
    found = []
    for folder, _dirs, files in os.walk(os.path.join(ROOT, "orchestrator")):
        if os.path.relpath(folder, ROOT).startswith(os.path.join("orchestrator", "backends")):
            continue
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(folder, name)
            tree = ast.parse(open(path, encoding="utf-8").read())
            found += [f"{os.path.relpath(path, ROOT)}:{node.lineno}" for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str)
                      and "orchestrator.backends" in node.value and id(node)
                      not in _docstrings(tree)]
    assert found == []
    from orchestrator import backends

    assert set(backends.BUILTIN) == NAMES
    assert all(backends.backend_class(name).name == name for name in backends.BUILTIN)
