"""The socket-interface variables of each node: Gloo's and NCCL's.

The user's value wins, checked to exist before anything starts; ``auto``
waits for the interface the node's agent finds. ``NCCL_SOCKET_IFNAME`` gets
``=NAME``, so that ``eth0`` does not also match ``eth0.100``.
"""

from __future__ import annotations

from typing import Mapping

from ..agent.node.ifvars import (AUTO, GLOO_IFNAME, IFNAME_VARS,  # noqa: F401 (re-exported)
                                 named_interfaces, resolve_interfaces, unknown_interfaces,
                                 value_for)

OFF = "off"  # network: {interface: off}: the libraries choose


def interface_env(setting: str, env: Mapping[str, str]) -> dict[str, str]:
    """What the plan adds to a node's ``env`` under ``network.interface`` ``setting``."""
    if setting == OFF:
        return {}
    return {var: AUTO if setting == AUTO else value_for(var, setting)
            for var in IFNAME_VARS if var not in env}


def needs_interface(env: Mapping[str, str]) -> bool:
    """Does this node's env wait for the interface its agent finds?"""
    return any(env.get(var) == AUTO for var in IFNAME_VARS)
