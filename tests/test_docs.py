"""The README's promises: its two commands, and CI running the test one."""

from __future__ import annotations

import os
import re

from conftest import ROOT


def read(name: str) -> str:
    with open(os.path.join(ROOT, name), encoding="utf-8") as fh:
        return fh.read()


def readme_commands() -> list[str]:
    section = read("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section, re.S)


def test_readme_gives_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2
    assert "ddp-orch up --local" in commands[0]
    assert "pytest" in commands[1]


def test_ci_runs_the_readme_test_command():
    ci_lines = [line.strip() for line in read(".ci/run").splitlines()]
    assert readme_commands()[1] in ci_lines


def test_readme_shows_the_golden_dry_run():
    golden = read("tests/golden/example.text.txt")
    first_node = golden.split("\nnode 1 ")[0]
    assert first_node in read("README.md")
