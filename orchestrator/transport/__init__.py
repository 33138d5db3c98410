"""Transports: how the controller reaches a node (see ``base.Transport``)."""

from __future__ import annotations

from ..plan import NodePlan
from ..spec import SshSpec
from .base import CommandResult, ProcessHandle, Transport, TransportError
from .local import LocalTransport

__all__ = ["CommandResult", "ProcessHandle", "Transport", "TransportError",
           "LocalTransport", "transport_for", "make_transport"]


def transport_for(node: NodePlan, *, strict_host_keys: str | None = None) -> Transport:
    """The transport for a planned node (see ``make_transport``)."""
    return make_transport(node.host, node.is_local, node.ssh, strict_host_keys=strict_host_keys)


def make_transport(host: str, is_local: bool, ssh: SshSpec, *,
                   strict_host_keys: str | None = None) -> Transport:
    """A local transport for ``localhost`` nodes, SSH (paramiko) for the rest.

    paramiko is imported only when a remote node needs it, so local runs and
    dry-runs stay fast. ``None`` settings fall back to ~/.ssh/config, then
    to the defaults (strict host keys, a 10 s connect timeout).
    """
    if is_local:
        return LocalTransport(host)
    from .ssh import SshTransport

    return SshTransport(host, user=ssh.user, port=ssh.port, identity_file=ssh.identity_file,
                        strict_host_keys=strict_host_keys or ssh.strict_host_keys,
                        connect_timeout=ssh.connect_timeout)
