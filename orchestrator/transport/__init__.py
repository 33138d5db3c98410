"""Transports: how the controller runs a command on a node (``base.Transport``).
Nothing is imported here, so paramiko loads only when a remote node needs it."""
