"""Every node-side file name is defined once, in ``orchestrator.agent.layout``."""

from __future__ import annotations

import ast
import os

from conftest import ROOT
from orchestrator.agent import layout

NAMES = {layout.SUPERVISOR_STATE, layout.GUARDIAN_RECORD, layout.KEEPER_STATE,
         layout.FOLLOWER_LOCK, layout.STREAM, layout.RENDEZVOUS, layout.SETUP_DONE_PREFIX}


def _literals(path: str) -> set[str]:
    """The string constants of a module that are not docstrings."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings}


def test_no_module_but_the_layout_spells_a_node_side_file_name():
    package = os.path.join(ROOT, "orchestrator")
    spelled = {}
    for folder, _, names in os.walk(package):
        for name in names:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != layout.__file__:
                found = _literals(path) & NAMES
                if found:
                    spelled[os.path.relpath(path, ROOT)] = sorted(found)
    assert spelled == {}


def test_each_attempt_of_a_kept_run_has_torchrun_logs_of_its_own():
    assert layout.attempt_logs(0) == "torchrun"
    assert layout.attempt_logs(2) == "torchrun.attempt-2"
