"""``setup: {commands, when_changed}``: whether a node runs its setup again.

Each run gets a fresh code root, so a setup whose effect lives outside it
(a ``pip install``, a cache) would be redone on every run. With
``when_changed`` it is skipped while its inputs are unchanged; env values
are hashed, so secrets stay off the disk.

The stamp is removed before a setup runs and written only once it
succeeded, so a setup that failed half-way is never skipped. One stamp per
host and Python, not per set of inputs: after B's requirements replaced
A's, going back to A must run again.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .. import layout

STAMP_VERSION = 1
GLOB_CHARS = "*?["
MAX_NAMED = 3  # files named in a console line; the rest are counted
_MISSING = "missing"  # a listed file's digest when the node has no such file


def path_problem(path: object) -> str:
    """Why ``path`` cannot name a file under the code root, or "". The loader
    refuses such a path too; the node checks again, as it crossed a boundary."""
    if not isinstance(path, str) or not path:
        return "is not a path"
    if any(ord(ch) < 32 for ch in path):
        return "holds a control character"
    if path.startswith(("/", "\\")):
        return "is an absolute path, outside the code root"
    if path.startswith("~"):
        return "starts with ~, outside the code root"
    if any(part == ".." for part in path.replace("\\", "/").split("/")):
        return "escapes the code root (..)"
    if any(ch in path for ch in GLOB_CHARS):
        return "is a glob; when_changed takes file paths, each file listed"
    if not path.strip("/. "):
        return "names the whole code root; list the files setup reads (requirements.txt)"
    if path.endswith("/"):
        return "names a directory; list the files in it that setup reads"
    return ""


def _sha(data: bytes) -> str:
    import hashlib  # here, as below: the loader imports this module for path_problem alone

    return hashlib.sha256(data).hexdigest()


def _canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def file_digest(root: str, path: str) -> str:
    """The sha256 of ``root/path``'s content, or ``"missing"`` where it is no regular file."""
    if path_problem(path):
        return _MISSING
    import hashlib

    full = os.path.join(root, path)
    digest = hashlib.sha256()
    if not os.path.isfile(full):  # before opening it: a FIFO would block the open
        return _MISSING
    try:
        with open(full, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return _MISSING
    return digest.hexdigest()


def fingerprint(files: dict[str, str], commands: list[list[str]], env: dict[str, str],
                python: tuple[str, str]) -> dict:
    """What a stamp holds: each file's digest, a sha256 each of the commands, env, python."""
    return {"files": dict(sorted(files.items())),
            "commands": _sha(_canonical([list(argv) for argv in commands])),
            "env": _sha(_canonical(dict(sorted(env.items())))),
            "python": _sha(_canonical(list(python)))}


def changed(stamp: dict | None, now: dict) -> list[str]:
    """The inputs that differ from ``stamp``'s; all of them without a usable stamp."""
    before = stamp.get("inputs") if isinstance(stamp, dict) \
        and stamp.get("version") == STAMP_VERSION else None
    if not isinstance(before, dict) or not isinstance(before.get("files"), dict):
        return [*now["files"], "commands", "env", "python"]
    out = [path for path, digest in now["files"].items() if before["files"].get(path) != digest]
    if set(before["files"]) - set(now["files"]):  # a file no longer listed: the list changed
        out.append("when_changed")
    return out + [key for key in ("commands", "env", "python") if before.get(key) != now[key]]


def verdict(stamp: dict | None, now: dict) -> tuple[bool, str]:
    """(skip, the node's line about it), from ``stamp`` and ``now``'s ``fingerprint``."""
    diff = changed(stamp, now)
    if not diff:
        files = _named(list(now["files"]) or ["the files"])
        return True, (f"setup skipped: {files}, commands, env and python unchanged since "
                      f"{_when(stamp.get('at'))} (the last successful setup here)")
    if stamp is None:
        return False, "setup runs: no successful setup recorded here yet (when_changed)"
    return False, (f"setup runs: {_named(diff)} changed since {_when(stamp.get('at'))} "
                   "(the last successful setup here)")


def _named(names: list[str]) -> str:
    shown = names[:MAX_NAMED]
    if len(names) > MAX_NAMED:
        shown.append(f"{len(names) - MAX_NAMED} more")
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " and " + shown[-1]


def _when(at: object) -> str:
    if not isinstance(at, (int, float)):
        return "at an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


def this_python() -> tuple[str, str]:
    return sys.executable, sys.version


def stamp_path(run_dir: str, host: str, python: str) -> str:
    """The stamp of ``host``'s setups with ``python``, in the runs directory:
    a Slurm job's nodes may share it, hence the host in its name."""
    runs = os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))
    key = _sha(_canonical([host, python]))[:24]
    return os.path.join(runs, layout.SETUP_STAMPS, f"{key}.json")


def read_stamp(path: str) -> dict | None:
    """The stamp at ``path``, or None: the setup then runs, which is always safe."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def forget(path: str) -> str:
    """Remove the stamp before a setup runs: "" or why it could not be."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        return f"could not remove the setup stamp {path}: {exc.strerror or exc}"
    return ""


def write_stamp(path: str, now: dict, at: float) -> str:
    """Record a successful setup of ``now``'s inputs, atomically: "" or why not."""
    data = _canonical({"version": STAMP_VERSION, "at": at, "inputs": now})
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return f"could not write the setup stamp {path}: {exc.strerror or exc}"
    return ""


class NodeStamp:
    """One node's stamp for one run, asked before and after its setup."""

    def __init__(self, run_dir: str, cwd: str, commands: list[list[str]],
                 when_changed: dict, env: dict[str, str]):
        import socket  # here: the loader imports this module for ``path_problem``

        python = this_python()
        self.path = stamp_path(run_dir, socket.gethostname(), python[0])
        names = [str(name) for name in when_changed.get("env", ())]
        self.now = fingerprint(
            {path: file_digest(cwd, path) for path in when_changed.get("paths", ())},
            commands, {name: env[name] for name in names if name in env}, python)

    def check(self) -> tuple[bool, str]:
        """(skip, the line that says so); a setup about to run forgets the
        stamp first, so only its success writes one again."""
        skip, line = verdict(read_stamp(self.path), self.now)
        if not skip:
            trouble = forget(self.path)
            line += f"; {trouble}" if trouble else ""
        return skip, line

    def done(self) -> str:
        """The setup succeeded: "" or why its stamp could not be written."""
        return write_stamp(self.path, self.now, time.time())
