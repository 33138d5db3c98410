"""A ``~/`` program word (``python: ~/venv/bin/python``) is the node's home
on every transport: the node's shell fills it in over SSH, and this
machine's home is used for a local node (issue 32)."""

from __future__ import annotations

import os
import subprocess
import sys

from orchestrator.transport.base import shell_command
from orchestrator.transport.local import LocalTransport


def venv_under(home) -> None:
    """``home/venv/bin/python``: this Python, under a home of the test's."""
    (home / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, home / "venv" / "bin" / "python")


def test_a_home_word_is_left_to_the_nodes_shell_and_nothing_else_is(tmp_path):
    """The program, when it starts with ``~/``, is under the node's home;
    its arguments (``~/x``, ``a~/b``) and env values reach it as they are:
    argv is verbatim (tests/live/test_ssh_transport.py's hostile argv)."""
    command = shell_command(["~/venv/bin/python", "-c", "import os, sys; print(sys.argv[1:], "
                             "os.environ['A'])", "~/x", "a~/b"], env={"A": "~/y"})
    assert command.startswith("exec env 'A=~/y' \"$HOME\"/venv/bin/python -c ")
    venv_under(tmp_path)
    ran = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                         env={"HOME": str(tmp_path), "PATH": os.environ["PATH"]})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "['~/x', 'a~/b'] ~/y\n"


def test_a_local_node_runs_a_python_under_this_machines_home(tmp_path, monkeypatch):
    venv_under(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    ran = LocalTransport().run(["~/venv/bin/python", "-c", "import sys; print(sys.argv[1])",
                                "~/x"], timeout=30)
    assert (ran.exit_code, ran.output) == (0, "~/x\n"), ran.output
