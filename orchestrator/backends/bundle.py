"""The code bundle shipped to every node, so nodes need no ddp-orch install.

One gzipped tar per run, unpacked by the node supervisor into the node's
run directory::

    code/workloads/...   the built-in workloads package (and the contract)
    script/...           the directory of the user's ``script:``, if any
"""

from __future__ import annotations

import os
import tarfile

import workloads

from ..errors import LaunchError

MAX_SCRIPT_DIR_BYTES = 64 * 1024 * 1024
_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".venv", "venv", "node_modules",
              "runs", ".ipynb_checkpoints", ".pytest_cache", ".mypy_cache"}


# Part of the workloads package, but for developers on this machine only.
_DEV_ONLY = {"code/workloads/make_tiny_datasets.py"}


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


def build_bundle(path: str, script: str | None = None) -> int:
    """Write the bundle to ``path``; returns its size in bytes."""
    package_dir = os.path.dirname(os.path.abspath(workloads.__file__))
    if script is not None:
        _check_size(os.path.dirname(script))
    with tarfile.open(path, "w:gz", compresslevel=3) as tar:
        tar.add(package_dir, arcname="code/workloads", filter=_skip)
        if script is not None:
            tar.add(os.path.dirname(script), arcname="script", filter=_skip)
    return os.path.getsize(path)


def _check_size(directory: str) -> None:
    total = 0
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS]
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files
                     if os.path.isfile(os.path.join(root, f)))
        if total > MAX_SCRIPT_DIR_BYTES:
            raise LaunchError(
                f"the script's directory {directory} holds more than "
                f"{MAX_SCRIPT_DIR_BYTES // 2**20} MiB, all of which would be uploaded to every node; "
                "move the script into a directory of its own and read data from --data-dir")
