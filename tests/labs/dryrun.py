"""Dry-run helpers shared by the unit and live tests of `--format shell`."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from conftest import ROOT
from ports import free_port


PYTHON = sys.executable
# The golden shell dry-runs call the ddp-orch that printed them by its path,
# which is this machine's: they hold SELF_WORD in its place. ``run_cli``
# (``python -m orchestrator``) prints SELF for it.
SELF_WORD = "{ddp-orch}"
SELF = shlex.join([PYTHON, "-m", "orchestrator"])


def golden_shell(text: str, self_words: str = SELF) -> str:
    """A golden shell dry-run as printed by ``self_words``."""
    return text.replace(SELF_WORD, self_words)


def sections(text: str) -> tuple[list[str], dict[int, list[str]], list[str]]:
    """The commands of a shell dry-run: this machine's (before the first
    node), each node's, and those after the nodes (``wait``)."""
    here: list[str] = []
    nodes: dict[int, list[str]] = {}
    after: list[str] = []
    current = here
    for line in text.splitlines():
        node = re.match(r"# node (\d+)  ", line)
        if node:
            current = nodes.setdefault(int(node.group(1)), [])
        elif line.startswith("# every node's step"):
            current = after
        elif line and not line.startswith("#"):
            current.append(line)
    return here, nodes, after


def user_path(tmp_path, ssh_config: str | None = None) -> dict[str, str]:
    """The environment of the shell that ran the dry-run (PYTHONPATH: this
    tree, as ``run_cli`` gives it), with no `ddp-orch` on PATH: the lines
    call the one that printed them by its path (a user of
    `.venv/bin/ddp-orch` has none on PATH). For the SSH lab, an `ssh` that
    reads the lab's config; MASTER_PORT, a free port."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if ssh_config:
        (bin_dir / "ssh").write_text(f"#!/bin/sh\nexec /usr/bin/ssh -F {ssh_config} \"$@\"\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    port = free_port()
    path = [str(bin_dir)] + [d for d in os.environ["PATH"].split(os.pathsep)
                             if d and not os.access(os.path.join(d, "ddp-orch"), os.X_OK)]
    assert shutil.which("ddp-orch", path=os.pathsep.join(path)) is None
    return {"PATH": os.pathsep.join(path), "PYTHONPATH": ROOT, "MASTER_PORT": str(port)}


def run_gang(commands: list[list[str]], timeout: float) -> list[tuple[int, str]]:
    """Start every command at once and wait for them as a gang: when one
    fails, the rest are stopped rather than waited on (a node whose peer
    died waits for it until torchrun's rendezvous times out). Each one's
    (exit status, output)."""
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for argv in commands]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return [(p.wait(), p.stdout.read()) for p in procs]


def run_here(lines: list[str], cwd, env: dict[str, str]) -> None:
    """Each line in a fresh shell, one after the other, as typed."""
    for line in lines:
        done = subprocess.run(["sh", "-c", line], cwd=str(cwd), env={**os.environ, **env},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
