"""The collective smoke test's program (``workloads/collective.py``): the
transports NCCL chose, read from its INFO lines as NCCL prints them
(quoted from public reports: NVIDIA/nccl#290, pytorch issues, cluster
logs) and the bus bandwidth. The program under torchrun is in
``test_wl_live.py``; on the network lab, ``tests/live/test_check.py``."""

from __future__ import annotations

import pytest

from workloads.collective import bus_bandwidth, transports

LINES = [
    "esm2-worker-0:53:271 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[0] [receive] via NET/Socket/0",
    "node001:175945:177561 [0] NCCL INFO Channel 00 : 1[60] -> 0[60] [receive] via NET/Socket/0",
    "gpu2-ru7:2144:2556 [2] NCCL INFO Ring 00 : 2[3d000] -> 3[3e000] via direct shared memory",
    "host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read",
    "host:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via SHM/direct/direct",
    "host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/IB/0/GDRDMA",
    "host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 4[0] [send] via NET/Libfabric/0/GDRDMA",
    "host:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>",
    "host:1:2 [0] NCCL INFO Connected all rings",
]


def test_the_transports_nccl_chose_in_a_users_words_each_once():
    assert transports(LINES) == ["socket", "SHM", "P2P", "IB", "Libfabric"]
    assert transports(LINES[3:4]) == ["P2P"] and transports([]) == []
    assert transports(["NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>"]) == []


@pytest.mark.parametrize("nbytes, seconds, ranks, expected", [
    (1 << 30, 1.0, 2, 1.073741824),  # two ranks: the algorithm's bandwidth
    (1 << 30, 1.0, 8, 1.073741824 * 2 * 7 / 8),
    (1 << 20, 0.0, 2, None), (1 << 20, 1.0, 1, None),
])
def test_bus_bandwidth_is_nccl_tests(nbytes, seconds, ranks, expected):
    got = bus_bandwidth(nbytes, seconds, ranks)
    assert (got is None and expected is None) or abs(got - expected) < 1e-9
