"""Transports: how the controller reaches a node (see ``base.Transport``)."""

from __future__ import annotations

from ..plan import NodePlan
from .base import CommandResult, ProcessHandle, Transport, TransportError
from .local import LocalTransport

__all__ = ["CommandResult", "ProcessHandle", "Transport", "TransportError",
           "LocalTransport", "transport_for"]


def transport_for(node: NodePlan, *, strict_host_keys: str | None = None) -> Transport:
    """A local transport for ``localhost`` nodes, SSH (paramiko) for the rest.

    paramiko is imported only when a remote node needs it, so local runs and
    dry-runs stay fast.
    """
    if node.is_local:
        return LocalTransport(node.host)
    from .ssh import SshTransport

    return SshTransport(
        node.host, user=node.ssh.user, port=node.ssh.port,
        identity_file=node.ssh.identity_file,
        strict_host_keys=strict_host_keys or node.ssh.strict_host_keys,
        connect_timeout=node.ssh.connect_timeout)  # None: ~/.ssh/config, then defaults
