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


# -- the slow link ------------------------------------------------------------------

def sysfs(root, links: dict) -> str:
    """A /sys/class/net with ``{name: (speed or None, operstate)}``."""
    for name, (speed, state) in links.items():
        (root / name).mkdir(parents=True)
        (root / name / "operstate").write_text(state + "\n")
        if speed is not None:
            (root / name / "speed").write_text(f"{speed}\n")
    return str(root)


def test_a_much_faster_link_that_is_up_with_an_address_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(netroute, "SYS_NET", sysfs(tmp_path, {
        "eno1": (1000, "up"), "ens5f0": (100000, "up"), "ens5f1": (200000, "down"),
        "docker0": (-1, "up"), "ib0": (3999, "up"), "lo": (None, "unknown")}))
    table = [("eno1", "10.0.0.5"), ("ens5f0", "10.1.0.5"), ("ens5f0", "fe80::1"),
             ("ens5f1", "10.2.0.5"), ("docker0", "172.17.0.1"), ("ib0", "10.3.0.5"),
             ("lo", "127.0.0.1")]
    assert netroute.link_speed("eno1") == 1000 and netroute.link_speed("docker0") is None
    assert netroute.faster_link("eno1", table) == {"ifname": "ens5f0", "addr": "10.1.0.5",
                                                   "speed": 100000}
    assert netroute.faster_link("ens5f0", table) is None  # nothing 4x as fast is up
    # 3.999x is not much faster; a chosen link of unknown speed says nothing
    assert netroute.faster_link("eno1", [("ib0", "10.3.0.5")]) is None
    assert netroute.faster_link("docker0", table) is None
    assert netroute.faster_link("eno1", [("ens5f0", "fe80::1")]) is None
