"""A run's ``outputs:`` on node 0: which files under the code root come home.

Only regular files inside the code root, with no symbolic link on the way
down (a link could lead anywhere on the node), each file, their total and
their count capped; what is refused is named. A fetch is checked again.
"""

from __future__ import annotations

import glob
import os
import stat

MAX_FILES = 1000  # files brought home from one run
MAX_LISTED = 100  # refused entries named in one reply (the rest are counted)
MAX_PATH = 400  # characters of a path brought home: the reply stays one control line


def pattern_problem(pattern: str) -> str:
    """Why ``pattern`` cannot name files under the code root, or ""; the loader asks too."""
    if not isinstance(pattern, str) or not pattern:
        return "is not a path"
    if any(ord(ch) < 32 for ch in pattern):
        return "holds a control character"
    if pattern.startswith(("/", "\\")):
        return "is an absolute path, outside the code root"
    if pattern.startswith("~"):
        return "starts with ~, outside the code root"
    if any(part == ".." for part in pattern.replace("\\", "/").split("/")):
        return "escapes the code root (..)"
    if not pattern.strip("/. "):
        return "names the whole code root; name what to bring home (out/, out/*.json)"
    return ""


def collect(root: str, patterns: list[str], max_file: int, max_total: int) -> dict:
    """The files ``patterns`` bring home, relative to ``root``, and those
    refused; not ``ok`` only where the code root itself is not there."""
    root = os.path.expanduser(root)
    try:
        info = os.lstat(root)
    except OSError as exc:
        return {"ok": False, "error": f"no code root {root} on the node ({exc.strerror})"}
    if not stat.S_ISDIR(info.st_mode):
        return {"ok": False, "error": f"the code root {root} is not a directory"}
    real_root = os.path.realpath(root)
    files: dict[str, int] = {}
    refused: dict[str, str] = {}
    unmatched: list[str] = []
    total = 0

    def refuse(rel: str, why: str) -> None:
        refused.setdefault(rel[:MAX_PATH], why)

    def consider(rel: str, size: int) -> None:
        nonlocal total
        if rel in files or rel in refused:
            return
        if len(rel) > MAX_PATH:
            refuse(rel, f"a path longer than {MAX_PATH} characters")
        elif size > max_file:
            refuse(rel, f"{size} bytes, more than the {max_file} a file may have")
        elif total + size > max_total:
            refuse(rel, f"over the {max_total} bytes all outputs may have together")
        elif len(files) >= MAX_FILES:
            refuse(rel, f"more than {MAX_FILES} files")
        else:
            files[rel] = size
            total += size

    for pattern in patterns:
        problem = pattern_problem(pattern)
        if problem:
            refuse(str(pattern)[:200], problem)
            continue
        matches = sorted(glob.glob(os.path.join(glob.escape(real_root), pattern),
                                   recursive=True))
        if not matches:
            unmatched.append(pattern)
        for match in matches:
            rel = os.path.relpath(match, real_root).replace(os.sep, "/")
            if rel == "." or rel.startswith("../"):
                refuse(pattern, "names the code root or what is outside it")
                continue
            why = _link_on_the_way(real_root, rel)
            if why:
                refuse(rel, why)
                continue
            st = os.lstat(match)
            if stat.S_ISREG(st.st_mode):
                consider(rel, st.st_size)
            elif stat.S_ISDIR(st.st_mode):
                for sub, size, why in _walk(match, rel):
                    if why:
                        refuse(sub, why)
                    else:
                        consider(sub, size)
            else:
                refuse(rel, "not a regular file (a device, FIFO or socket)")
    listed = sorted(refused.items())
    return {"ok": True, "files": [{"path": p, "size": s} for p, s in sorted(files.items())],
            "refused": [{"path": p, "why": w} for p, w in listed[:MAX_LISTED]],
            "refused_more": max(0, len(listed) - MAX_LISTED), "unmatched": unmatched,
            "total": total}


def _link_on_the_way(root: str, rel: str) -> str:
    """Why ``root/rel`` is refused for a link on its way ("" if none is)."""
    here = root
    for part in rel.split("/"):
        here = os.path.join(here, part)
        try:
            if stat.S_ISLNK(os.lstat(here).st_mode):
                return "a symbolic link (never followed)"
        except OSError as exc:
            return f"cannot be read ({exc.strerror})"
    return ""


def _walk(directory: str, rel: str):
    """(relative path, size, "" or why refused) of everything under ``directory``."""
    for here, dirs, names in os.walk(directory, followlinks=False):
        base = os.path.relpath(here, directory).replace(os.sep, "/")
        prefix = rel if base == "." else f"{rel}/{base}"
        for name in sorted(dirs):
            if os.path.islink(os.path.join(here, name)):
                yield f"{prefix}/{name}", 0, "a symbolic link (never followed)"
        for name in sorted(names):
            path = os.path.join(here, name)
            try:
                st = os.lstat(path)
            except OSError as exc:
                yield f"{prefix}/{name}", 0, f"cannot be read ({exc.strerror})"
                continue
            if stat.S_ISLNK(st.st_mode):
                yield f"{prefix}/{name}", 0, "a symbolic link (never followed)"
            elif not stat.S_ISREG(st.st_mode):
                yield f"{prefix}/{name}", 0, "not a regular file (a device, FIFO or socket)"
            else:
                yield f"{prefix}/{name}", st.st_size, ""


def inside(root: str, path: str) -> bool:
    """Whether ``path``, its links resolved, lies inside ``root`` (``get``'s check)."""
    real_root = os.path.realpath(os.path.expanduser(root))
    real = os.path.realpath(os.path.expanduser(path))
    return real.startswith(real_root.rstrip("/") + "/")
