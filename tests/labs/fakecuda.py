"""A stand-in ``libcuda.so.1`` for tests of the node's CUDA driver probe
(``agent/node/probes.DRIVER_PROBE``) on a machine without a GPU.

``fake_libcuda(directory, **answers)`` compiles a shared library with the
five driver calls the probe makes (cuInit, cuDeviceGetCount,
cuDriverGetVersion, cuDeviceGet, cuDeviceGetAttribute) into ``directory``
and returns the directory, to put first on ``LD_LIBRARY_PATH``. Each call
answers what the test says: ``init`` and ``count_rc`` the return codes of
cuInit and cuDeviceGetCount (999 is CUDA_ERROR_UNKNOWN), ``caps`` each
device's compute capability, ``driver`` the CUDA version the driver
supports (12040 is 12.4), as the real driver API writes them. Needs a C
compiler (``cc``); the fixture skips without one.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

_SOURCE = r"""
typedef int CUresult;
typedef int CUdevice;
static const int caps[][2] = {%(caps)s};
static const int ndev = %(ndev)d;
CUresult cuInit(unsigned int flags) { return %(init)d; }
CUresult cuDeviceGetCount(int *count) { *count = ndev; return %(count_rc)d; }
CUresult cuDriverGetVersion(int *version) { *version = %(driver)d; return 0; }
CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= ndev) return 101;
    *dev = ordinal; return 0;
}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev) {
    if (dev < 0 || dev >= ndev) return 101;
    if (attribute == 75) { *value = caps[dev][0]; return 0; }
    if (attribute == 76) { *value = caps[dev][1]; return 0; }
    return 1;
}
"""


def fake_libcuda(directory, *, init: int = 0, count_rc: int = 0,
                 caps: "tuple[str, ...]" = ("9.0",), driver: int = 12040) -> str:
    os.makedirs(directory, exist_ok=True)
    pairs = [tuple(int(part) for part in cap.split(".")) for cap in caps] or [(0, 0)]
    source = os.path.join(directory, "libcuda.c")
    with open(source, "w", encoding="utf-8") as fh:
        fh.write(_SOURCE % {"caps": ", ".join("{%d, %d}" % pair for pair in pairs),
                            "ndev": len(caps), "init": init, "count_rc": count_rc,
                            "driver": driver})
    subprocess.run(["cc", "-shared", "-fPIC", "-o", os.path.join(directory, "libcuda.so.1"),
                    source], check=True, capture_output=True, timeout=120)
    return str(directory)


@pytest.fixture
def libcuda(tmp_path, monkeypatch):
    """``make(**answers)``: a stand-in libcuda first on LD_LIBRARY_PATH."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    made = []

    def make(**answers) -> str:
        directory = fake_libcuda(tmp_path / f"libcuda{len(made)}", **answers)
        made.append(directory)
        monkeypatch.setenv("LD_LIBRARY_PATH", directory)
        return directory
    return make
