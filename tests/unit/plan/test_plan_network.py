"""Unit tests of plan/network.py and the network settings in the plan:
what the plan adds, `auto` resolved per node, refusals."""

from __future__ import annotations

import pytest

from orchestrator.engine.netfacts import interface_from, route_request
from orchestrator.config.loader import load_cluster_text
from orchestrator.errors import ConfigError, LaunchError
from orchestrator.plan.build import build_plan, resolve_plan
from orchestrator.plan.network import interface_env, needs_interface, unknown_interfaces


TWO = "nodes:\n  - {host: a, gpus: 0}\n  - {host: b, gpus: 0, env: %s}\nworkload: {name: noop}\n"


def plan_of(text: str):
    return build_plan(load_cluster_text(text), run_id="r", local_run_dir="/tmp/r")


@pytest.mark.parametrize("setting,env,expected", [
    ("auto", {}, {"GLOO_SOCKET_IFNAME": "auto", "NCCL_SOCKET_IFNAME": "auto"}),
    ("off", {}, {}),
    ("eth0", {}, {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=eth0"}),
    ("auto", {"GLOO_SOCKET_IFNAME": "ens5"}, {"NCCL_SOCKET_IFNAME": "auto"}),
    ("eth0", {"NCCL_SOCKET_IFNAME": "ib"}, {"GLOO_SOCKET_IFNAME": "eth0"}),
])
def test_the_plan_adds_what_the_user_did_not_set(setting, env, expected):
    assert interface_env(setting, env) == expected


def test_auto_in_the_plan_is_resolved_per_node_and_a_user_value_stays():
    plan = plan_of(TWO % "{GLOO_SOCKET_IFNAME: ens5}")
    assert plan.nodes[0].env["GLOO_SOCKET_IFNAME"] == "auto"
    assert plan.nodes[1].env["GLOO_SOCKET_IFNAME"] == "ens5"
    assert all(needs_interface(n.env) for n in plan.nodes)
    resolved = resolve_plan(plan, master_port=29500, homes={},
                            interfaces={0: "eth0", 1: "enp3s0"})
    assert dict(resolved.nodes[0].env)["GLOO_SOCKET_IFNAME"] == "eth0"
    assert dict(resolved.nodes[0].env)["NCCL_SOCKET_IFNAME"] == "=eth0"
    assert dict(resolved.nodes[1].env)["GLOO_SOCKET_IFNAME"] == "ens5"  # the user's wins
    assert dict(resolved.nodes[1].env)["NCCL_SOCKET_IFNAME"] == "=enp3s0"


def test_network_off_and_a_forced_name_reach_the_plan():
    off = plan_of("network: {interface: off}\n" + TWO % "{}")
    assert not any(k.endswith("_SOCKET_IFNAME") for n in off.nodes for k in n.env)
    assert route_request(off, off.nodes[0]) is None
    forced = plan_of("network: {interface: bond0}\n" + TWO % "{}")
    assert forced.nodes[1].env["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert route_request(forced, forced.nodes[1])["host"] == "a"  # checked on the node


@pytest.mark.parametrize("text,words", [
    ("network: {interface: 'eth 0'}\n", "is not an interface name"),
    ("network: {interfce: eth0}\n", "interface"),
    ("network: eth0\n", "mapping"),
])
def test_a_bad_network_setting_is_refused_with_the_field(text, words):
    with pytest.raises(ConfigError) as caught:
        load_cluster_text(text + TWO % "{}")
    assert words in str(caught.value) and "network" in str(caught.value)


@pytest.mark.parametrize("env,present,bad", [
    ({"GLOO_SOCKET_IFNAME": "eth0"}, ["lo", "eth0"], []),
    ({"GLOO_SOCKET_IFNAME": "eth0,eth1"}, ["lo", "eth0"], ["GLOO_SOCKET_IFNAME=eth0,eth1"]),
    ({"NCCL_SOCKET_IFNAME": "eth"}, ["lo", "eth0"], []),        # NCCL: a prefix
    ({"NCCL_SOCKET_IFNAME": "=eth"}, ["lo", "eth0"], ["NCCL_SOCKET_IFNAME==eth"]),
    ({"NCCL_SOCKET_IFNAME": "^docker,lo"}, ["lo"], []),          # exclusions need nothing
    ({"GLOO_SOCKET_IFNAME": "auto"}, [], []),
])
def test_a_user_set_interface_must_exist_on_its_node(env, present, bad):
    assert unknown_interfaces(env, present) == bad


def test_a_missing_interface_is_refused_naming_the_node_and_what_it_has():
    plan = plan_of(TWO % "{GLOO_SOCKET_IFNAME: ens5}")
    with pytest.raises(LaunchError) as caught:
        interface_from(plan.nodes[1], {"ok": True, "ifname": "eth0", "interfaces": ["lo", "eth0"]})
    message = str(caught.value)
    assert "no interface for GLOO_SOCKET_IFNAME=ens5 on this node" in message
    assert "its interfaces are lo, eth0" in message
    assert interface_from(plan.nodes[0], {"ok": True, "ifname": "eth0", "interfaces": []}) == "eth0"
