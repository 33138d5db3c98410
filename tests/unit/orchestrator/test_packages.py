"""The package layout is the architecture, so it is checked, not hoped for.

Every import inside ``orchestrator/`` (function-level ones included) is read
from the source, and each package may import only the packages below it in
``LAYERS``: the CLI on top, the node agent at the bottom importing nothing
of the rest. A cycle between packages cannot follow this order, so it fails
here, naming the importing module. The root holds at most eight modules.
"""

from __future__ import annotations

import ast
import os

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "orchestrator")
# Top to bottom: a package may import those after it, never those before.
# The package itself (``from .. import __version__``) is the entry point's.
LAYERS = ("cli", "controller", "report", "backends", "engine", "plan", "transport",
          "records", "config", "tables", "console", "errors", "agent", "__init__")
MAX_ROOT_MODULES = 8


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


def test_the_root_holds_at_most_eight_modules():
    modules = [n for n in os.listdir(PACKAGE) if n.endswith(".py")]
    assert len(modules) <= MAX_ROOT_MODULES, sorted(modules)
