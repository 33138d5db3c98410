"""The package layout is the architecture, so it is checked, not hoped for.

Every import inside ``orchestrator/`` (function-level ones included) is read
from the source, and each package may import only the packages below it in
``LAYERS``: the CLI on top, the node agent at the bottom importing nothing
of the rest. A cycle between packages cannot follow this order, so it fails
here, naming the importing module. Nor may modules import each other in a
circle, inside a package or across (``import_cycles``; an import under ``if
TYPE_CHECKING:`` runs never, so it does not count). The root holds at most
eight modules.

What the installed packages (``orchestrator``, ``workloads``) import from
outside the standard library is their declared dependencies and nothing
else: what only an example or a test needs (accelerate, for
``examples/accelerate``) is a test tool, in pyproject's ``test`` extra alone.
"""

from __future__ import annotations

import ast
import os
import re
import sys

import pytest

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "orchestrator")
# Top to bottom: a package may import those after it, never those before.
# The package itself (``from .. import __version__``) is the entry point's.
LAYERS = ("cli", "controller", "report", "backends", "engine", "plan", "transport",
          "records", "config", "tables", "console", "errors", "agent", "__init__")
MAX_ROOT_MODULES = 8
# Each installed package's imports from outside the standard library: the
# controller's dependencies and its `report` extra (matplotlib, imported
# lazily), the workloads' extra (torch, torchvision; numpy only for
# make_tiny_datasets, a tool).
OUTSIDE_IMPORTS = {
    "orchestrator": {"click", "yaml", "paramiko", "matplotlib", "workloads"},
    "workloads": {"torch", "torchvision", "numpy"},
}
# Needed by the examples and their tests only, never by what is installed.
EXAMPLES_ONLY = "accelerate"
# What the core may import of ``workloads``: the contract both sides speak
# (environment names, the result file's keys) anywhere; the catalog only
# through its one interface; the package itself only to ship it.
WORKLOADS_SEAMS = {"workloads.contract": None, "workloads.catalog": {"config/catalog.py"},
                   "workloads": {"engine/bundle.py"}}


def _imports(package: str, path: str) -> list[str]:
    """The modules of ``package`` that a file imports, as dotted names below it."""
    rel = os.path.relpath(path, package)[:-3].split(os.sep)
    here = rel[:-1]  # the file's package, relative to the top package
    with open(path, encoding="utf-8") as fh:
        tree = ast.parse(fh.read())
    top = os.path.basename(package) + "."
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = here[:len(here) - (node.level - 1)]
            target = [*base, *(node.module.split(".") if node.module else [])]
            out.append(".".join(target) or "__init__")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(top):
            out.append(node.module[len(top):])
        elif isinstance(node, ast.Import):
            out += [a.name[len(top):] for a in node.names if a.name.startswith(top)]
    return out


def outside_imports(package: str) -> dict[str, set[str]]:
    """Each top-level module from outside the standard library and the
    package itself that a file of ``package`` imports (function-level and
    guarded imports too), with the files that import it."""
    seen: dict[str, set[str]] = {}
    own, parent = os.path.basename(package), os.path.dirname(package)
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    tops = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    if top != own and top not in sys.stdlib_module_names:
                        seen.setdefault(top, set()).add(os.path.relpath(path, parent))
    return seen


def layer_violations(package: str) -> list[str]:
    """Every import of a package's file that points up or sideways in ``LAYERS``."""
    bad = []
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, package).split(os.sep)
            unit = rel[0] if len(rel) > 1 else rel[0][:-3]
            if unit == "__main__":
                continue  # ``python -m orchestrator`` runs the CLI: the entry point
            if unit not in LAYERS:
                bad.append(f"{'/'.join(rel)}: {unit} has no place in LAYERS")
                continue
            for target in _imports(package, path):
                layer = target.split(".")[0]
                if layer != unit and (layer not in LAYERS
                                      or LAYERS.index(layer) <= LAYERS.index(unit)):
                    bad.append(f"{'/'.join(rel)} imports {target} ({layer} is not below {unit})")
    return bad


def test_every_package_imports_only_the_layers_below_it():
    assert layer_violations(PACKAGE) == []


def test_an_upward_or_cyclic_import_is_named(tmp_path):
    """The check can fail: an engine module importing the CLI, and the CLI
    importing the engine back, are both named, with the file."""
    pkg = tmp_path / "orchestrator"
    for rel, text in {"__init__.py": "", "cli/__init__.py": "", "engine/__init__.py": "",
                      "cli/main.py": "from ..engine import gang\n",
                      "engine/gang.py": "def f():\n    from ..cli.main import main\n",
                      "agent/x.py": "import orchestrator.plan.model\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert layer_violations(str(pkg)) == [
        "agent/x.py imports plan.model (plan is not below agent)",
        "engine/gang.py imports cli.main (cli is not below engine)"]


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of ``package`` (dotted, below it) -> the modules it
    imports at run time, function-level imports included. ``from . import
    x`` points at the module ``x`` where there is one, else at the package."""
    files = {}
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in names:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), package)[:-3].split(os.sep)
                files[".".join(rel[:-1] if rel[-1] == "__init__" else rel)] = \
                    os.path.join(folder, name)
    top = os.path.basename(package) + "."
    graph = {}
    for module, path in files.items():
        here = module.split(".") if path.endswith("__init__.py") else module.split(".")[:-1]
        here = [part for part in here if part]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        found = set()
        for node in _runtime_nodes(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - (node.level - 1)]
                    target = ".".join([*base, *(node.module.split(".") if node.module else [])])
                elif (node.module or "").startswith(top):
                    target = node.module[len(top):]
                else:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if target else alias.name
                    found.add(sub if sub in files else target)
            elif isinstance(node, ast.Import):
                found |= {a.name[len(top):] for a in node.names if a.name.startswith(top)}
        graph[module] = {m for m in found if m in files and m != module}
    return graph


def import_cycles(package: str) -> list[list[str]]:
    """The modules of ``package`` that import each other in a circle, one
    sorted list per circle (Tarjan's strongly connected components)."""
    graph = module_graph(package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in sorted(graph[module]):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            circle = []
            while True:
                other = stack.pop()
                circle.append(other)
                if other == module:
                    break
            if len(circle) > 1:
                cycles.append(sorted(circle))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_modules_import_each_other_in_a_circle():
    assert import_cycles(PACKAGE) == []


def test_a_circle_of_imports_is_found_even_through_a_function_but_not_for_type_checking(
        tmp_path):
    """The check can fail: a keeper's daemon that imports its roles inside a
    function, while a role imports the daemon, is a circle; an import for
    the type checker alone is not."""
    pkg = tmp_path / "orchestrator"
    for rel, text in {
            "__init__.py": "", "agent/__init__.py": "", "agent/kept/__init__.py": "",
            "agent/kept/daemon.py": "def keeper_for():\n    from .head import Head\n",
            "agent/kept/head.py": "from . import keeper\n",
            "agent/kept/keeper.py": "from . import daemon, peers\n",
            "agent/kept/peers.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from .keeper import Keeper\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert import_cycles(str(pkg)) == [
        ["agent.kept.daemon", "agent.kept.head", "agent.kept.keeper"]]


def workloads_imports(package: str) -> list[str]:
    """Every import of ``workloads`` by a file of ``package`` that
    ``WORKLOADS_SEAMS`` does not allow, as ``file imports module``."""
    bad = []
    for folder, dirs, names in os.walk(package):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, package).replace(os.sep, "/")
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                    targets = [node.module] if node.module != "workloads" else \
                        [f"workloads.{a.name}" for a in node.names]
                else:
                    continue
                for target in targets:
                    if target.split(".")[0] != "workloads":
                        continue
                    allowed = WORKLOADS_SEAMS.get(target, set())
                    if allowed is not None and rel not in allowed:
                        bad.append(f"{rel} imports {target}")
    return sorted(bad)


def test_the_core_reads_the_workloads_through_the_contract_and_the_catalog_only():
    assert workloads_imports(PACKAGE) == []


def test_a_workload_imported_past_its_seam_is_named(tmp_path):
    """The check can fail: the plan reading the catalog, or a workload's
    module, itself; the contract stays allowed anywhere."""
    pkg = tmp_path / "orchestrator"
    for rel, text in {"plan/build.py": "from workloads import contract, catalog\n",
                      "report/summary.py": "def f():\n    import workloads.mnist\n",
                      "config/catalog.py": "from workloads import catalog\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    assert workloads_imports(str(pkg)) == ["plan/build.py imports workloads.catalog",
                                           "report/summary.py imports workloads.mnist"]


def test_the_root_holds_at_most_eight_modules():
    modules = [n for n in os.listdir(PACKAGE) if n.endswith(".py")]
    assert len(modules) <= MAX_ROOT_MODULES, sorted(modules)


@pytest.mark.parametrize("package", sorted(OUTSIDE_IMPORTS))
def test_the_installed_packages_import_only_their_declared_dependencies(package):
    seen = outside_imports(os.path.join(ROOT, package))
    undeclared = {top: sorted(files) for top, files in seen.items()
                  if top not in OUTSIDE_IMPORTS[package]}
    assert undeclared == {}, f"{package} imports what it does not declare: {undeclared}"
    assert EXAMPLES_ONLY not in OUTSIDE_IMPORTS[package]


def test_an_undeclared_import_is_named_with_its_file(tmp_path):
    """The check can fail: a workload importing accelerate, even inside a
    function, is found."""
    pkg = tmp_path / "workloads"
    (pkg / "harness").mkdir(parents=True)
    (pkg / "harness" / "loop.py").write_text(
        "import os\nimport torch.nn\nfrom . import data\nfrom workloads import contract\n"
        "def train():\n    from accelerate import Accelerator\n")
    seen = outside_imports(str(pkg))
    assert {top: sorted(files) for top, files in seen.items()} == {
        "torch": ["workloads/harness/loop.py"], "accelerate": ["workloads/harness/loop.py"]}


def test_accelerate_is_a_test_tool_and_no_dependency_of_what_is_installed():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        project = tomllib.load(fh)["project"]
    groups = {"dependencies": project["dependencies"], **project["optional-dependencies"]}
    holding = sorted(group for group, reqs in groups.items()
                     if any(re.match(r"[\w.-]+", req).group(0) == EXAMPLES_ONLY
                            for req in reqs))
    assert holding == ["test"]
