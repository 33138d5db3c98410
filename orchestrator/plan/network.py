"""The socket-interface variables of each node: Gloo's and NCCL's.

A node's collectives must use the interface its peers can reach it on
(``agent/node/netroute.py`` says why the libraries' own picks fail on real
hosts). The rule, per node and per variable:

* the user's value wins, from the cluster-wide or the node's ``env`` (or
  ``network: {interface: NAME}``, which sets both to NAME everywhere); it is
  checked to exist on the node before anything starts (``unknown_interfaces``);
* otherwise, with ``network: {interface: auto}`` (the default), the plan
  holds ``auto``, as the dry-run shows it, and the launch replaces it with
  the interface the node's agent found (``resolve_interfaces``), a launch-time
  fact like the master port;
* ``network: {interface: off}`` sets nothing: the libraries choose.

``NCCL_SOCKET_IFNAME`` gets the exact-match form ``=NAME``, so that ``eth0``
does not also match ``eth0.100``; ``GLOO_SOCKET_IFNAME`` takes names only.
Pure code, like the rest of the plan.
"""

from __future__ import annotations

from typing import Mapping

from ..agent.node.ifvars import (AUTO, GLOO_IFNAME, IFNAME_VARS,  # noqa: F401 (re-exported)
                                 named_interfaces, resolve_interfaces, unknown_interfaces,
                                 value_for)

OFF = "off"  # network: {interface: off}: the libraries choose


def interface_env(setting: str, env: Mapping[str, str]) -> dict[str, str]:
    """What the plan adds to a node whose env is ``env`` under the cluster
    file's ``network.interface`` ``setting`` (auto, off or a name)."""
    if setting == OFF:
        return {}
    return {var: AUTO if setting == AUTO else value_for(var, setting)
            for var in IFNAME_VARS if var not in env}


def needs_interface(env: Mapping[str, str]) -> bool:
    """Does this node's env wait for the interface its agent finds?"""
    return any(env.get(var) == AUTO for var in IFNAME_VARS)
