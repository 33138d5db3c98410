"""The fault matrix's Slurm cells (see test_fault_matrix.py), on the Slurm lab."""

from __future__ import annotations

import pytest

from faultmatrix import CELL, CELLS
from faultrunner import Rig, run_cell

pytestmark = pytest.mark.live


@pytest.mark.parametrize("cell", [pytest.param(c.id, marks=pytest.mark.faultmatrix, id=c.id)
                                  for c in CELLS if c.backend == "slurm"])
def test_slurm_cell(cell, slurm_lab, tmp_path):
    run_cell(CELL[cell], Rig("slurm", ("node1", "node2"), env=slurm_lab.env(), slurm=slurm_lab),
             tmp_path)
