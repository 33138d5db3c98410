"""The variables that select the interface for Gloo's and NCCL's own
connections, and the interfaces a user's value requires. Pure (no socket
work), so the dry-run reads it without ``netroute``.
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
    """{variable: interface names it requires}, for the values the user set:
    Gloo's are exact names, NCCL's prefixes (``=``: exact; ``^``: excluded, unchecked)."""
    out = {}
    for var in IFNAME_VARS:
        value = env.get(var)
        if not value or value == AUTO or value.startswith("^"):
            continue
        out[var] = [name for name in value.lstrip("=").split(",") if name]
    return out


def unknown_interfaces(env: Mapping[str, str], present: list[str]) -> list[str]:
    """``VAR=VALUE`` for each user-set variable that names no interface in ``present``."""
    bad = []
    for var, names in named_interfaces(env).items():
        exact = var == GLOO_IFNAME or env[var].startswith("=")
        missing = [n for n in names if not (n in present if exact
                                            else any(p.startswith(n) for p in present))]
        if missing:
            bad.append(f"{var}={env[var]}")
    return bad
