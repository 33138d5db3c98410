"""A throwaway $HOME whose ~/.ssh/config points at an SSH lab.

The CLI then resolves lab hosts exactly as it would real ones: aliases,
ports, users, keys and known_hosts all come from ~/.ssh/config.
"""

from __future__ import annotations

import os
import shutil
import sys

from sshlab import SshLab

PROGRAMS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "programs")


def lab_home(lab: SshLab, root, *, omit_known: tuple = ()) -> dict[str, str]:
    """Write ``<root>-home/.ssh/{config,known_hosts}``; return env for ``run_cli``.

    The home lies beside ``root``, not in it: ``root`` holds the test's
    scripts, and a script directory that contains the home directory is
    refused (it would upload the keys in it)."""
    home = root.parent / f"{root.name}-home"
    ssh_dir = home / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    known = lab.write_known_hosts(str(ssh_dir / "known_hosts"), omit=omit_known)
    with open(lab.ssh_config, encoding="utf-8") as fh:
        config = fh.read().replace(lab.known_hosts, known)
    (ssh_dir / "config").write_text(config)
    os.chmod(ssh_dir, 0o700)
    return {"HOME": str(home)}


def lab_cluster(lab: SshLab, root, nodes: list[str], workload: str, *, extra: str = "",
                name: str = "lab") -> str:
    """A cluster file over lab aliases, with runs under ``root/remote``."""
    text = (f"name: {name}\npython: {sys.executable}\nworkdir: {root / 'remote'}\n{extra}"
            "nodes:\n" + "".join(f"  - {node}\n" for node in nodes) + workload)
    path = root / f"{name}.yaml"
    path.write_text(text)
    return str(path)


def lab_job(lab: SshLab, root, name: str, program: str, nodes: list[str], *,
            args: str = "", extra: str = "") -> tuple[dict[str, str], str]:
    """``tests/programs/PROGRAM`` copied into ``root`` and run on the lab's
    ``nodes``: the env of a home for the lab (``lab_home``) and the cluster
    file (``lab_cluster``, its workload ``{script: PROGRAM[, args: ARGS]}``)."""
    shutil.copy(os.path.join(PROGRAMS, program), root)
    workload = f"workload: {{script: {program}" + (f", args: {args}" if args else "") + "}\n"
    return lab_home(lab, root), lab_cluster(lab, root, nodes, workload, extra=extra, name=name)
