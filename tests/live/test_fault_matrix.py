"""The fault matrix on this machine and on an SSH cluster of network
namespaces (tests/labs/faultmatrix.py declares the cells, faultrunner.py
runs one). The whole matrix: ``pytest -m faultmatrix tests/live/test_fault_matrix*.py``
(an hour or two); one cell: ``-m faultmatrix -k 'ssh and attached and
workers_starting and frozen'``. Without ``-m faultmatrix`` (the suite, CI)
only this commit's share runs (``tests/conftest.py``)."""

from __future__ import annotations

import pytest

from faultmatrix import CELL, CELLS
from faultrunner import Rig, run_cell
from labhome import lab_home

pytestmark = pytest.mark.live


def cells(backend: str) -> list:
    return [pytest.param(c.id, marks=pytest.mark.faultmatrix, id=c.id)
            for c in CELLS if c.backend == backend]


@pytest.fixture(scope="module")
def local_rig() -> Rig:
    return Rig("local", ("localhost", "localhost"))


@pytest.fixture(scope="module")
def ssh_rig(tmp_path_factory):
    from netlab import NetLab, _require_netns

    _require_netns()
    with NetLab(2) as lab:
        root = tmp_path_factory.mktemp("fm-ssh")
        yield Rig("ssh", (lab.hosts[0].alias, lab.hosts[1].alias), env=lab_home(lab, root),
                  lab=lab, netlab=lab)


@pytest.mark.parametrize("cell", cells("local"))
def test_local_cell(cell, local_rig, tmp_path):
    run_cell(CELL[cell], local_rig, tmp_path)


@pytest.mark.parametrize("cell", cells("ssh"))
def test_ssh_cell(cell, ssh_rig, tmp_path):
    run_cell(CELL[cell], ssh_rig, tmp_path)
