"""How an address and a port are written together, one rule for both sides.

An IPv6 literal needs its brackets. Pure and stdlib-free on purpose: the
dry-run loads it, and ``socket`` (which the probes need) costs more than
the whole rule.
"""

from __future__ import annotations


def hostport(addr: str, port: int | str) -> str:
    """``addr:port`` as it is written: ``10.0.0.1:29500``, ``node0:29500``,
    ``[fd77::10]:29500`` (an IPv6 address in brackets, never doubled)."""
    addr = str(addr)
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"{addr}:{port}"
