"""A fake nvidia-smi for tests of GPU refusals."""

from __future__ import annotations

import stat



LOCAL = ("up", "--local")


def fake_smi(directory, *indices: int) -> str:
    """A directory holding an ``nvidia-smi`` that lists GPUs ``indices``."""
    directory.mkdir(exist_ok=True)
    smi = directory / "nvidia-smi"
    listing = "".join(f"GPU {k}: Fake GPU (UUID: GPU-{k})\\n" for k in indices)
    smi.write_text(f"#!/bin/sh\nprintf '{listing}'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return str(directory)
