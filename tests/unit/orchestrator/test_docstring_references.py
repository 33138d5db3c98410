"""Every module a docstring or comment cites still exists.

A docstring that cites a module which has since moved (``slurmjob.py`` after
it became ``backends/slurm/job.py``) sends the next reader to the wrong file,
or to none, and nothing else notices: the text is read, never run. So every
docstring and comment under ``orchestrator/``, ``workloads/`` and ``bench/``
is read from the source's text (nothing is imported; a docstring is any
string that is a statement of its own) and each reference in it is looked
up in the tree:

* a dotted path, ``orchestrator.engine.run`` or
  ``orchestrator.agent.node.spec.Liveness``: its longest prefix that is a
  module or package exists, and the name after it is defined there (a class's
  member too, one level down);
* a file, ``agent/kept/keeper.py`` or ``plan.py``, from the repo root,
  ``orchestrator/``, the citing file's folder or the folder above it; and a
  name in a file, ``agent/kept/daemon.follow``: that file defines it, at its
  top or in one of its classes;
* ``module.name`` in double backticks, ``results.wanted_files``, where the
  first word names one of the project's modules and no standard library one:
  some module of that name defines the name (or one of its classes does:
  ``keeper._record_progress``). Where the first word, in lower case, names
  no module, and the name is a function or class at the top of exactly one
  other module, the word is that module's old name
  (``slurmcheck.shared_dir_problem``, now in ``backends/slurm/check.py``).

Skipped on purpose, as not module references: ``word.name`` outside double
backticks (too often a variable's attribute); in double backticks, a file's
name (``agent.out``, ``keeper.py``: ``EXTENSIONS``), a cluster-file setting
(``network.interface``) and a word the citing file binds as a variable or
parameter (``node.code_root``); a ``dir/word.name`` whose folder is none of
the project's (``node-K/agent.out``, ``linux/rtnetlink.h``); absolute paths;
and ``NOT_OURS``, files of the user's program and of other projects.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import re
import sys
from dataclasses import dataclass
from functools import cached_property, lru_cache

from conftest import ROOT

TOPS = ("orchestrator", "workloads", "bench")
DOTTED_TOPS = ("orchestrator", "workloads")

DOTTED = re.compile(r"(?<![\w./])(?:orchestrator|workloads)(?:\.[A-Za-z_]\w*)+")
PY_FILE = re.compile(r"(?<![\w./-])(?:[\w-]+/)*[\w-]+\.py\b")
# ``agent/kept/daemon.follow``; not ``schema/ps.schema.json`` (a file's name)
FILE_NAME = re.compile(r"(?<![\w./-])((?:[\w-]+/)+)([A-Za-z_]\w*)\.([A-Za-z_]\w*)\b(?!\.\w)")
TICKED = re.compile(r"``([A-Za-z_]\w*)\.([A-Za-z_]\w*)")
# The source's comments, strings and brackets, in order: a ``#`` or bracket
# inside a string is none, and a string outside brackets that opens its line
# is a statement of its own (a docstring) unless code follows it.
LEXEMES = re.compile(r'#[^\n]*|"""(?:\\.|[^\\])*?"""|' r"'''(?:\\.|[^\\])*?'''|"
                     r'"(?:\\.|[^"\\\n])*"|' r"'(?:\\.|[^'\\\n])*'|[][(){}]", re.S)
# A function or class at a module's top (a line of its own, unindented).
TOP_DEFS = re.compile(r"^(?:async def|def|class) +([A-Za-z_]\w*)", re.M)

# ``keeper.py``, ``agent.out``, ``plan.json``: a file's name, not a module's.
EXTENSIONS = {"py", "out", "err", "log", "txt", "json", "jsonl", "yaml", "yml", "toml", "csv",
              "md", "tar", "gz", "pyz", "pt", "sbatch", "sh", "lock", "pid", "png", "html"}
# Files the text names that are not this project's: the user's program in
# examples (``ddp-orch up c.yaml -- train.py``, a stack frame ``train.py:42``),
# the shim's and the step report's names inside a run's bundle on a node, and
# torch's own files.
NOT_OURS = re.compile(r"(train|script|x|scripts/train|code/ddp_orch_(shim|progress)|version"
                      r"|torch/.*)\.py")
# The cluster file's settings by block (``network.interface``): the blocks
# share their names with modules.
with open(os.path.join(ROOT, "schema", "cluster.schema.json"), encoding="utf-8") as _fh:
    SETTINGS = {key: set(block.get("properties", ()))
                for key, block in json.load(_fh)["properties"].items()}


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _prose(source: str):
    """(line, text) of each comment and docstring (any string statement)."""
    line, pos, depth = 1, 0, 0
    for m in LEXEMES.finditer(source):
        line += source.count("\n", pos, m.start())
        pos, text = m.start(), m.group()
        if text in "([{":
            depth += 1
        elif text in ")]}":
            depth -= 1
        elif text.startswith("#"):
            yield line, text
        elif depth == 0:
            start, end = source.rfind("\n", 0, pos) + 1, source.find("\n", m.end())
            if (source[start:pos].strip() in ("", "r", "R", "u", "U")
                    and source[max(start - 2, 0)] != "\\"  # no line continued
                    and source[m.end():end if end >= 0 else None].strip()[:1] in ("", "#", ";")):
                yield line, text


def _defines(body, into: dict) -> dict:
    """The names a block binds (into ``into``): a class maps to its members."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            into[node.name] = None
        elif isinstance(node, ast.ClassDef):
            members = _defines(node.body, {})
            members.update(dict.fromkeys(  # ``self.x = ...`` in its methods
                t.attr for t in ast.walk(node) if isinstance(t, ast.Attribute)
                and isinstance(t.ctx, ast.Store) and isinstance(t.value, ast.Name)
                and t.value.id == "self"))
            into[node.name] = members
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            into.update(dict.fromkeys(n.id for t in targets for n in ast.walk(t)
                                      if isinstance(n, ast.Name)))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            into.update(dict.fromkeys((a.asname or a.name).split(".")[0] for a in node.names))
        else:  # ``if``, ``try``, ``with``: what they bind at the top level
            for field in ("body", "orelse", "finalbody", "handlers"):
                _defines(getattr(node, field, []), into)
    return into


@lru_cache(maxsize=None)
def _names(path: str) -> dict:
    """What a module file, or a package folder (its modules too), defines."""
    if os.path.isdir(path):
        init = os.path.join(path, "__init__.py")
        found = _names(init) if os.path.isfile(init) else {}
        return {**found, **dict.fromkeys(n[:-3] if n.endswith(".py") else n
                                         for n in os.listdir(path) if n != "__pycache__")}
    return _defines(ast.parse(_read(path)).body, {})


def _holds(names: dict, name: str) -> bool:
    """Whether a module defines ``name``, at its top or in one of its classes."""
    return name in names or any(name in members for members in names.values() if members)


@lru_cache(maxsize=None)
def _modules(root: str) -> dict[str, list[str]]:
    """Each module or package name of the project, with the paths that bear it."""
    out: dict[str, list[str]] = {}
    for top in TOPS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            out.setdefault(os.path.basename(folder), []).append(folder)
            for name in files:
                if name.endswith(".py") and name != "__init__.py":
                    out.setdefault(name[:-3], []).append(os.path.join(folder, name))
    return out


@lru_cache(maxsize=None)
def _owners(root: str) -> dict[str, list[str]]:
    """Each function and class at a module's top, with the modules that define it."""
    out: dict[str, list[str]] = {}
    for paths in _modules(root).values():
        for path in (p for p in paths if p.endswith(".py")):
            for name in TOP_DEFS.findall(_read(path)):
                out.setdefault(name, []).append(path)
    return out


@dataclass
class Citing:
    """The file whose prose is read, in the tree at ``root``."""
    root: str
    path: str
    source: str

    @property
    def folders(self) -> list[str]:
        """Where a path it cites may start: the root, the package, its own
        folder and the one above."""
        here = os.path.dirname(self.path)
        return [self.root, os.path.join(self.root, "orchestrator"), here, os.path.dirname(here)]

    @cached_property
    def bound(self) -> set[str]:
        """The variables and parameters it binds."""
        nodes = ast.walk(ast.parse(self.source))
        return {n.id if isinstance(n, ast.Name) else n.arg for n in nodes
                if isinstance(n, ast.arg)
                or (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))}


def _dotted_stale(at: Citing, m: re.Match) -> bool:
    """``orchestrator.a.b.Name.member``: the longest module prefix exists and
    defines the rest (one class deep)."""
    parts = m.group().split(".")
    for k in range(len(parts), 0, -1):
        base = os.path.join(at.root, *parts[:k])
        for path in (base + ".py", base):
            if os.path.isfile(path) or os.path.isfile(os.path.join(path, "__init__.py")):
                rest, names = parts[k:], _names(path)
                if not rest:
                    return False
                members = names.get(rest[0], ())
                return rest[0] not in names or not (members is None or len(rest) == 1
                                                    or rest[1] in members)
    return True


def _file_stale(at: Citing, m: re.Match) -> bool:
    """``agent/kept/keeper.py``: a file under one of the citing file's folders."""
    return not NOT_OURS.fullmatch(m.group()) and not any(
        os.path.isfile(os.path.join(f, m.group())) for f in at.folders)


def _name_in_file_stale(at: Citing, m: re.Match) -> bool:
    """``agent/kept/daemon.follow``: the file (or package) defines the name."""
    folder, stem, name = m.groups()
    if name == "py" or not any(os.path.isdir(os.path.join(f, folder)) for f in at.folders):
        return False  # a file's name, or a folder not ours (``node-K/agent.out``)
    bases = [os.path.join(f, folder, stem) for f in at.folders]
    return not any(_holds(_names(p), name) for base in bases
                   for p in (base + ".py", base) if os.path.exists(p))


def _ticked_stale(at: Citing, m: re.Match) -> bool:
    """``results.wanted_files`` in double backticks: a module of that name
    defines the name; where none has that name, it is a renamed one's."""
    word, name = m.groups()
    if (word in sys.stdlib_module_names or word in DOTTED_TOPS or name in EXTENSIONS
            or name in SETTINGS.get(word, ())):
        return False
    modules = _modules(at.root)
    if word in modules:
        stale = not any(_holds(_names(p), name) for p in modules[word])
    else:  # a renamed module: the only other one that defines ``name``
        owners = _owners(at.root).get(name, [])
        stale = (word.islower() and not hasattr(builtins, word)
                 and len(owners) == 1 and owners[0] != at.path)
    return stale and word not in at.bound  # ``node.code_root``: a variable's


CHECKS = ((DOTTED, _dotted_stale), (PY_FILE, _file_stale),
          (FILE_NAME, _name_in_file_stale), (TICKED, _ticked_stale))


def stale_in(root: str, citing: str, source: str) -> list[tuple[int, str]]:
    """(line, reference) of each reference in a file's prose that points nowhere."""
    at = Citing(root, citing, source)
    bad = []
    for line, text in _prose(source):
        for pattern, stale in CHECKS:
            bad += [(line + text.count("\n", 0, m.start()), m.group().lstrip("`"))
                    for m in pattern.finditer(text) if stale(at, m)]
    return bad


def stale_references(root: str) -> list[str]:
    """``file:line: reference`` for every stale reference under ``TOPS``."""
    out = []
    for top in TOPS:
        for folder, dirs, files in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(n for n in files if n.endswith(".py")):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, root)
                out += [f"{rel}:{line}: {ref}" for line, ref in stale_in(root, path, _read(path))]
    return out


def test_every_module_the_docstrings_and_comments_cite_exists():
    stale = stale_references(ROOT)
    assert not stale, "cited, but not there:\n" + "\n".join(stale)


def test_a_moved_module_is_named_and_a_present_one_is_not(tmp_path):
    """The check can fail: a small tree whose ``agent/kept`` and ``engine``
    hold the things cited, cited once where they are and once where they were
    (as ``slurmjob.py`` and ``agent/daemon.follow`` were)."""
    pkg = tmp_path / "orchestrator"
    for rel, text in {
            "__init__.py": "", "agent/__init__.py": "", "agent/kept/__init__.py": "",
            "agent/kept/daemon.py": "def follow(): pass\n",
            "agent/node/__init__.py": "",
            "engine/__init__.py": "", "plan/__init__.py": "",
            "plan/secrets.py": "MASK = '***'\n", "plan/network.py": "OFF = 'off'\n",
            "engine/results.py": "class Wanted:\n    def files(self): self.kept = 1\n"
                                 "def wanted_files(): pass\n"}.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    citing = str(pkg / "engine" / "run.py")
    good = ('"""See ``orchestrator.engine.results.wanted_files``,\n'
            "orchestrator.engine.results.Wanted.kept, orchestrator.agent.kept.\n"
            "The stream is agent/kept/daemon.follow (agent/kept/daemon.py,\n"
            "results.py), ``results.wanted_files()``, ``results.files``;\n"
            '``secrets.token_hex`` is the standard library one."""\n'
            "# ddp-orch up c.yaml -- train.py; node-K/agent.out; /tmp/gone.py\n"
            'x = "# not a comment: gone.py"\n'
            'y = print(\n    "not a docstring: gone.py",\n)\n'
            "def f(node):\n"
            '    """``node.code_root``, ``network.interface``, ``results.json``."""\n')
    bad = ('"""See ``orchestrator.engine.wanted_files``, orchestrator.results.\n'
           "The stream is agent/daemon.follow (agent/daemon.py,\n"
           '``results.fetch``), orchestrator.engine.results.Wanted.gone,\n'
           '``resultz.wanted_files``."""\n'
           "x = 1  # and kept/keeper.py, engine/results.wanted\n")
    assert stale_in(str(tmp_path), citing, good) == []
    assert stale_in(str(tmp_path), citing, bad) == [
        (1, "orchestrator.engine.wanted_files"), (1, "orchestrator.results"),
        (3, "orchestrator.engine.results.Wanted.gone"),
        (2, "agent/daemon.py"), (2, "agent/daemon.follow"), (3, "results.fetch"),
        (4, "resultz.wanted_files"), (5, "kept/keeper.py"), (5, "engine/results.wanted")]
