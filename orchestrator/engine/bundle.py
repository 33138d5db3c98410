"""The code bundle shipped to every node, so nodes need no ddp-orch install.

One gzipped tar per run, unpacked into the node's run directory; the code
directory (``workload.code``) becomes ``project/``, the workers' cwd.

The code directory goes to *every* node, so each path in it is filtered,
in this order:

1. Never: ``_SKIP_DIRS``, bytecode, anything not a regular file (a
   symlinked directory is not followed) and the control files at the top.
2. Ignored: what the ignore files at the top match, the last match winning.
   An ignored directory is not entered, so nothing under it can be un-ignored.
3. Held back as secret-looking, unless ``.ddp-orch-include`` names it (or a
   directory above it).
4. The rest, up to ``MAX_SCRIPT_DIR_BYTES``. The cluster file goes with its
   secrets masked (``stand_ins``): its ``env`` would otherwise reach every
   node in clear.

Patterns are a subset of gitignore, matched per component with ``fnmatch``
(case sensitive; ``*`` never crosses a ``/``). Not supported: ``.gitignore``
below the top, git's global excludes, escaped trailing spaces.
"""

from __future__ import annotations

import fnmatch
import io
import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Sequence

import workloads

from ..agent.worker import progress, shim
from ..config.loader import too_broad
from ..config.spec import ClusterSpec
from ..errors import ConfigError, LaunchError
from ..plan.model import BUILTIN_DIR, PROJECT_DIR, RunPlan
from ..plan.secrets import stored_cluster_file
from ..plan.torchrun import SHIM

if TYPE_CHECKING:  # a dry run's code notes scan the directory; only a bundle is a tar
    import tarfile

MAX_SCRIPT_DIR_BYTES = 64 * 1024 * 1024
_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "node_modules",
              "runs", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache"}

# Read from the top of the code directory; never uploaded themselves.
IGNORE_FILES = (".gitignore", ".ddp-orch-ignore")
INCLUDE_FILE = ".ddp-orch-include"
_CONTROL_FILES = set(IGNORE_FILES) | {INCLUDE_FILE}

# Base names (lower-cased, fnmatch) of files that hold keys or credentials.
_SECRET_NAMES = (
    "*.pem", "*.key", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx",
    "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    "credentials", "credentials.json", "client_secret*.json",
    ".netrc", "_netrc", ".pgpass", ".htpasswd", ".env", "*.env",
)

# Part of the workloads package, but for developers on this machine only.
_DEV_ONLY = {f"{BUILTIN_DIR}/workloads/make_tiny_datasets.py"}


def _skip(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = info.name.split("/")
    if any(p in _SKIP_DIRS for p in parts) or info.name.endswith((".pyc", ".pyo")) \
            or info.name in _DEV_ONLY:
        return None
    if not (info.isfile() or info.isdir()):
        return None  # no links or devices: the node unpacks with the data filter
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


# --- patterns -----------------------------------------------------------------

@dataclass(frozen=True)
class _Pattern:
    parts: tuple[str, ...]   # the pattern split on "/"; one part when unanchored
    negated: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        segments = rel.split("/")
        if not self.anchored:
            return fnmatch.fnmatchcase(segments[-1], self.parts[0])
        return _match_parts(self.parts, tuple(segments))


def _match_parts(pattern: tuple[str, ...], path: tuple[str, ...]) -> bool:
    if not pattern:
        return not path
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if not rest:                      # "a/**": everything inside a, not a
            return len(path) >= 1
        return any(_match_parts(rest, path[i:]) for i in range(len(path) + 1))
    return bool(path) and fnmatch.fnmatchcase(path[0], head) and _match_parts(rest, path[1:])


def parse_patterns(text: str) -> tuple[_Pattern, ...]:
    """The patterns of one ignore/include file (the subset in the module doc)."""
    patterns = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        if negated:
            line = line[1:]
        elif line.startswith(("\\#", "\\!")):
            line = line[1:]
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        parts = tuple(p for p in line.lstrip("/").split("/") if p)
        if not parts:
            continue
        if not anchored and parts[0] == "**":
            parts = ("*",)
        patterns.append(_Pattern(parts, negated, dir_only, anchored))
    return tuple(patterns)


def _last_match(patterns: tuple[_Pattern, ...], rel: str, is_dir: bool) -> bool | None:
    """True if the last pattern matching ``rel`` is positive, False if negated, None if none."""
    for pattern in reversed(patterns):
        if pattern.matches(rel, is_dir):
            return not pattern.negated
    return None


def _read_patterns(directory: str, names: tuple[str, ...]) -> tuple[_Pattern, ...]:
    patterns: list[_Pattern] = []
    for name in names:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):  # follows a link: the user's own config
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                patterns.extend(parse_patterns(fh.read()))
        except OSError as exc:
            raise LaunchError(f"cannot read {path}: {exc.strerror or exc}") from exc
    return tuple(patterns)


def _secret_looking(name: str) -> bool:
    lowered = name.lower()
    return name.startswith(".") or any(fnmatch.fnmatchcase(lowered, p) for p in _SECRET_NAMES)


# --- the scan -----------------------------------------------------------------

@dataclass(frozen=True)
class ScriptDirScan:
    """What of a code directory goes to every node. ``files``: (relative
    posix path, bytes), sorted; ``skipped``: held back as secret-looking."""

    directory: str
    files: tuple[tuple[str, int], ...]
    total_bytes: int
    skipped: tuple[str, ...]
    # What an ignore file held back, outermost entries only (a directory ends
    # in "/"), each with its size (None: larger than the dry-run would walk).
    ignored: tuple[tuple[str, int | None], ...] = ()

    def summary(self, max_names: int = 10) -> str:
        """The dry-run's ``code dir`` line: what goes, what was held back."""
        count = len(self.files)
        line = (f"code dir   {self.directory}: {count} file{'' if count == 1 else 's'}, "
                f"{human_size(self.total_bytes)} uploaded to each node")
        if self.skipped:
            line += (f"; {len(self.skipped)} skipped as secret-looking: "
                     f"{_names(self.skipped, max_names)}")
        if self.ignored:
            largest = sorted(self.ignored, key=lambda e: (-(e[1] if e[1] is not None
                                                           else 1 << 62), e[0]))
            shown = [f"{rel} ({'large' if size is None else human_size(size)})"
                     for rel, size in largest]
            line += f"; held back by {'/'.join(IGNORE_FILES)}: {_names(shown, max_names)}"
        return line

    def largest(self, n: int = 10) -> tuple[tuple[str, int], ...]:
        return tuple(sorted(self.files, key=lambda f: (-f[1], f[0]))[:n])

    def check_size(self, program: str = "your program", source: str = "") -> None:
        """Raise ConfigError (exit 2) past ``MAX_SCRIPT_DIR_BYTES``."""
        if self.total_bytes <= MAX_SCRIPT_DIR_BYTES:
            return
        rows = "\n".join(f"  {human_size(size):>10}  {rel}" for rel, size in self.largest(10))
        raise ConfigError(
            f"the code directory {self.directory} holds {human_size(self.total_bytes)} "
            f"({self.total_bytes} bytes) in {len(self.files)} files to upload, more than the "
            f"{human_size(MAX_SCRIPT_DIR_BYTES)} cap ({MAX_SCRIPT_DIR_BYTES} bytes), and all of "
            f"it would go to every node; the largest files:\n{rows}",
            path="workload.code", source=source,
            hint=f"keep data, checkpoints and outputs out of it ({program} can read them "
                 "from a directory on the nodes, given by an absolute path in its arguments "
                 f"or env:), or list what the run does not need in {IGNORE_FILES[1]} there "
                 f"(gitignore patterns; {IGNORE_FILES[0]} is read too)")


def render_scan(scan: ScriptDirScan) -> str:
    """The dry-run line for ``scan`` (same as ``scan.summary()``)."""
    return scan.summary()


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")


def _refuse_broad(directory: str) -> None:
    why = too_broad(directory)
    if why:
        raise LaunchError(
            f"the code directory {directory} {why}; all of it would be uploaded to every "
            "node (keys and credentials included); set workload.code to your project's own "
            "directory")


def scan_script_dir(directory: str) -> ScriptDirScan:
    """Walk ``directory`` under the module doc's rules; refuses ``/`` and ``~`` or above."""
    directory = os.path.abspath(directory)
    _refuse_broad(directory)
    ignore = _read_patterns(directory, IGNORE_FILES)
    include = _read_patterns(directory, (INCLUDE_FILE,))
    files: list[tuple[str, int]] = []
    skipped: list[str] = []
    ignored: list[tuple[str, int | None]] = []
    budget = [_IGNORED_WALK_BUDGET]

    def walk(path: str, prefix: str, included: bool, secret: bool) -> None:
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return  # unreadable: as os.walk does, leave it out
        for entry in entries:
            name = entry.name
            rel = prefix + name
            if name in _SKIP_DIRS or (not prefix and name in _CONTROL_FILES
                                      and not _last_match(include, rel, False)):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if not is_dir and (not stat.S_ISREG(st.st_mode) or name.endswith((".pyc", ".pyo"))):
                continue  # links, devices, sockets, fifos; bytecode
            if _last_match(ignore, rel, is_dir):
                ignored.append((rel + "/" if is_dir else rel,
                                _sized(entry.path, budget) if is_dir else st.st_size))
                continue
            inc = _last_match(include, rel, is_dir)
            now_included = included if inc is None else inc
            now_secret = secret or (_secret_looking(name) if not is_dir else name.startswith("."))
            if is_dir:
                walk(entry.path, rel + "/", now_included, now_secret)
            elif now_secret and not now_included:
                skipped.append(rel)
            else:
                files.append((rel, st.st_size))

    walk(directory, "", False, False)
    return ScriptDirScan(directory=directory, files=tuple(files),
                         total_bytes=sum(size for _, size in files), skipped=tuple(skipped),
                         ignored=tuple(ignored))


# Entries the dry-run walks to size what was held back (a dataset directory
# may hold millions of files; past this its size is shown as "large", so a
# dry-run stays a fraction of a second).
_IGNORED_WALK_BUDGET = 5000


def _sized(path: str, budget: list[int]) -> int | None:
    """Bytes of the regular files under ``path`` (links not followed), or
    None once ``budget[0]`` entries have been visited in all."""
    total = 0
    stack = [path]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    budget[0] -= 1
                    if budget[0] < 0:
                        return None
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(entry.path)
                    elif stat.S_ISREG(st.st_mode):
                        total += st.st_size
        except OSError:
            continue
    return total


def _names(names: Sequence[str], max_names: int) -> str:
    shown = ", ".join(names[:max_names])
    more = len(names) - max_names
    return shown + (f" and {more} more" if more > 0 else "")


# --- the bundle ---------------------------------------------------------------

def _normalize(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    if not info.isfile():
        return None  # it changed since the scan: a link now, say
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def stand_ins(spec: ClusterSpec | None) -> dict[str, bytes]:
    """{absolute path: contents} of the files the bundle carries in another
    form than on disk: the cluster file ``spec`` came from, secrets masked.
    Only an uploaded project can hold it: a built-in workload's bundle needs none."""
    if spec is None or spec.workload.code is None or not spec.text \
            or not os.path.isfile(spec.source):
        return {}
    text = stored_cluster_file(spec)
    return {os.path.realpath(spec.source): text.encode()}


def build_bundle(path: str, code: str | None = None,
                 replaced: Mapping[str, bytes] | None = None) -> int:
    """Write the bundle to ``path``; its size in bytes. A file whose real
    path is in ``replaced`` (``stand_ins``) carries that text instead."""
    import tarfile

    replaced = replaced or {}
    package_dir = os.path.dirname(os.path.abspath(workloads.__file__))
    scan = None
    if code is not None:
        scan = scan_script_dir(code)
        scan.check_size()
    with tarfile.open(path, "w:gz", compresslevel=3) as tar:
        tar.add(package_dir, arcname=f"{BUILTIN_DIR}/workloads", filter=_skip)
        tar.add(shim.__file__, arcname=f"{BUILTIN_DIR}/{SHIM}.py", filter=_normalize)
        tar.add(progress.__file__, arcname=f"{BUILTIN_DIR}/{progress.MODULE}.py",
                filter=_normalize)
        if scan is not None:
            root = tarfile.TarInfo(PROJECT_DIR)  # there even when empty: the workers' cwd
            root.type, root.mode, root.mtime = tarfile.DIRTYPE, 0o755, int(os.stat(code).st_mtime)
            tar.addfile(root)
            for rel, _size in scan.files:
                source = os.path.join(scan.directory, *rel.split("/"))
                arcname = f"{PROJECT_DIR}/{rel}"
                stand_in = replaced.get(os.path.realpath(source))
                if stand_in is not None:
                    info = _normalize(tar.gettarinfo(source, arcname=arcname))
                    if info is not None:
                        info.size = len(stand_in)
                        tar.addfile(info, io.BytesIO(stand_in))
                    continue
                try:
                    tar.add(source, arcname=arcname, recursive=False, filter=_normalize)
                except OSError as exc:
                    raise LaunchError(
                        f"cannot read {source} for the code bundle: {exc.strerror or exc}; "
                        f"make it readable or list it in {IGNORE_FILES[1]}") from exc
    return os.path.getsize(path)


def code_notes(plan: RunPlan, source: str = "") -> tuple[str, ...]:
    """The dry-run's line on the code directory. A script the upload would
    leave out, or a directory over the cap, is refused before anything starts."""
    if plan.code is None:
        return ()
    scan = scan_script_dir(plan.code)
    entry = plan.entrypoint
    scan.check_size(entry.script or f"python -m {entry.module}", source)
    script = plan.entrypoint.script
    if script is not None and script not in {rel for rel, _ in scan.files}:
        where = os.path.join(plan.code, *script.split("/"))
        why = ("held back as secret-looking (a dotfile or a key's name)" if script in scan.skipped
               else "a symbolic link, which is never uploaded" if os.path.islink(where)
               else f"ignored ({', '.join(IGNORE_FILES)}, or a directory that never goes, "
                    f"such as {', '.join(sorted(d for d in _SKIP_DIRS if not d.startswith('.')))})")
        raise ConfigError(f"the script {script} would not reach the nodes: in the code "
                          f"directory {plan.code} it is {why}", path="workload.script",
                          source=source,
                          hint=f"un-ignore it (!{script} in {IGNORE_FILES[1]}), name a "
                               f"secret-looking one in {INCLUDE_FILE}, or put the file itself "
                               "in place of a link")
    return (scan.summary(),)
