"""The SSH backend: one connection per node (paramiko), the agent over exec; nodes
need sshd (no SFTP) and Python with torch. SSH settings are recorded per node so
that ``down`` can reach the nodes again."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping

from ..config.spec import SshSpec
from ..errors import ConfigError
from ..plan.dryrun import DryRun
from ..plan.model import NodePlan, RunPlan
from .agentbackend import AgentBackend

if TYPE_CHECKING:  # (a dry run starts no transport)
    from ..transport.base import Transport


class Backend(AgentBackend):
    name = "ssh"

    # What ~/.ssh/config said about node 0's host and ddp-orch did not use,
    # when its HostName became the master address (``default_master_addr``).
    master_addr_warnings: tuple[str, ...] = ()

    def default_master_addr(self) -> str | None:
        """Node 0's ``HostName`` from ``~/.ssh/config``: its host may be an alias the
        other nodes cannot resolve. What ddp-orch does not use of its entry becomes a note."""
        first = self.require_spec().nodes[0]
        if self.spec.master_addr is not None or first.is_local:
            return None
        from ..transport.sshconfig import config_hostname

        try:
            addr, self.master_addr_warnings = config_hostname(first.host)
        except ValueError as exc:
            raise ConfigError(f"node 0's master address from ~/.ssh/config: {exc}",
                              path="master.addr", source=self.spec.source,
                              hint="fix the ssh config, or set master.addr") from None
        return addr

    def dryrun(self, plan: RunPlan) -> DryRun:
        info = super().dryrun(plan)
        notes = tuple(f"warning: {w}" for w in self.master_addr_warnings)
        return dataclasses.replace(info, notes=(*info.notes, *notes)) if notes else info

    def connection(self, node_rank: int) -> dict[str, Any]:
        return {"ssh": dataclasses.asdict(self.require_spec().nodes[node_rank].ssh)}

    def transport(self, node_rank: int, host: str, connection: Mapping[str, Any]) -> Transport:
        if host == "localhost":
            from ..transport.local import LocalTransport

            return LocalTransport(host)
        from ..transport.ssh import SshTransport

        ssh = SshSpec(**connection.get("ssh", {}))
        strict = "accept-new" if self.options.accept_new_host_keys else ssh.strict_host_keys
        return SshTransport(host, user=ssh.user, port=ssh.port, identity_file=ssh.identity_file,
                            strict_host_keys=strict, connect_timeout=ssh.connect_timeout)

    def reach(self, node: NodePlan) -> tuple[str, ...]:
        """OpenSSH's ``ssh`` with the file's settings for the node."""
        if node.is_local:
            return ()
        ssh = self.require_spec().nodes[node.node_rank].ssh
        strict = "accept-new" if self.options.accept_new_host_keys else ssh.strict_host_keys
        return ("ssh", *(("-l", ssh.user) if ssh.user else ()),
                *(("-p", str(ssh.port)) if ssh.port else ()),
                *(("-i", ssh.identity_file) if ssh.identity_file else ()),
                *(("-o", f"StrictHostKeyChecking={strict}") if strict else ()),
                *(("-o", f"ConnectTimeout={math.ceil(ssh.connect_timeout)}")
                  if ssh.connect_timeout else ()), node.host)

    def where(self, node: NodePlan) -> str:
        if node.is_local:
            return "local subprocess"
        ssh = self.require_spec().nodes[node.node_rank].ssh
        user = f"{ssh.user}@" if ssh.user else ""
        port = f":{ssh.port}" if ssh.port else ""
        return f"ssh {user}{node.host}{port}"
