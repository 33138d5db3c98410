"""The variables that select the interface for Gloo's and NCCL's own
connections: their names, the value that selects one interface, and the
interfaces a user's value requires.

The node finds the interface itself (``netroute.route``); the plan decides
who sets these variables (``plan/network.py``) and writes ``auto`` until the
node has found it. Pure, apart from ``netroute``'s socket work, so the
dry-run reads these without loading it. Stdlib only, like the rest of the
agent package.
"""

from __future__ import annotations

from typing import Mapping

GLOO_IFNAME, NCCL_IFNAME = "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"
IFNAME_VARS = (GLOO_IFNAME, NCCL_IFNAME)
AUTO = "auto"  # the plan's value until the node's agent has found its interface


def value_for(var: str, ifname: str) -> str:
    """``var``'s value that selects exactly ``ifname``."""
    return f"={ifname}" if var == NCCL_IFNAME else ifname


def resolve_interfaces(env: Mapping[str, str], ifname: str | None) -> dict[str, str]:
    """``env`` with its ``auto`` interface variables set to ``ifname``."""
    if ifname is None:
        return dict(env)
    return {k: value_for(k, ifname) if k in IFNAME_VARS and v == AUTO else v
            for k, v in env.items()}


def named_interfaces(env: Mapping[str, str]) -> dict[str, list[str]]:
    """{variable: interface names it requires to exist}, for the values the
    user set. Gloo takes a comma-separated list of exact names; NCCL a list
    of prefixes (``eth`` matches ``eth0``), ``=`` for exact names, ``^``
    for exclusions (never required, so not checked)."""
    out = {}
    for var in IFNAME_VARS:
        value = env.get(var)
        if not value or value == AUTO or value.startswith("^"):
            continue
        out[var] = [name for name in value.lstrip("=").split(",") if name]
    return out


def unknown_interfaces(env: Mapping[str, str], present: list[str]) -> list[str]:
    """``VAR=VALUE`` for each user-set variable that names no interface of
    the node, whose interfaces are ``present``."""
    bad = []
    for var, names in named_interfaces(env).items():
        exact = var == GLOO_IFNAME or env[var].startswith("=")
        missing = [n for n in names if not (n in present if exact
                                            else any(p.startswith(n) for p in present))]
        if missing:
            bad.append(f"{var}={env[var]}")
    return bad
