"""Transports: how the controller runs a command on a node (see ``base.Transport``).

``LocalTransport`` for this machine, ``SshTransport`` (paramiko, imported
only when a remote node needs it) for the rest. Which one a node gets is
its backend's decision (``orchestrator/backends``).
"""
