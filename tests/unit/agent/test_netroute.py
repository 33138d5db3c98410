"""Unit tests of agent/node/netroute.py on this host."""

from __future__ import annotations

from orchestrator.agent.node import netroute


def test_this_host_routes_loopback_through_lo_and_lists_its_addresses():
    table = netroute.addresses()
    assert ("lo", "127.0.0.1") in table
    found = netroute.route("127.0.0.1", 29500, remote_peers=False)
    assert found["ok"] and found["ifname"] == "lo" and found["addr"] == "127.0.0.1"
    assert "lo" in found["interfaces"]
    missing = netroute.route("no-such-host.invalid", 29500, remote_peers=True)
    assert not missing["ok"] and "no route to no-such-host.invalid" in missing["error"]
