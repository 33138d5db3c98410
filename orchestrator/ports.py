"""The master port: pick a free one on node 0, or check that the given one is free.

Both bind on node 0, where torchrun's TCPStore will listen, not on the
controller: a tiny Python program run through node 0's transport, or, when
node 0 is this machine, a socket bound right here (same answer, no
interpreter start).
"""

from __future__ import annotations

import socket

from .errors import LaunchError
from .transport.base import Transport, TransportError
from .transport.local import LocalTransport

# Prints the port it could bind (0 asks the kernel for a free one).
_BIND = ("import socket, sys\n"
         "s = socket.socket()\n"
         "try:\n"
         "    s.bind(('', int(sys.argv[1])))\n"
         "except OSError as e:\n"
         "    print('busy', e.strerror); sys.exit(3)\n"
         "print(s.getsockname()[1])\n")


def _bind(transport: Transport, python: str, port: int) -> tuple[bool, str]:
    if isinstance(transport, LocalTransport):
        return _bind_here(port)
    try:
        result = transport.run([python, "-c", _BIND, str(port)], timeout=20)
    except TransportError as exc:
        raise LaunchError(f"cannot check ports on {transport.host}: {exc}") from None
    text = result.output.strip()
    if result.exit_code == 3:
        return False, text.removeprefix("busy ").strip()
    if not result.ok:
        raise LaunchError(f"{transport.host}: `{python}` failed while checking ports "
                          f"(exit {result.exit_code}): {text[-300:]}")
    return True, text.splitlines()[-1]


def _bind_here(port: int) -> tuple[bool, str]:
    """``_BIND``'s answer for this machine, without starting ``python``."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError as exc:
            return False, exc.strerror or str(exc)
        return True, str(sock.getsockname()[1])


def pick_free_port(transport: Transport, python: str) -> int:
    _, port = _bind(transport, python, 0)
    return int(port)


def check_port_free(transport: Transport, python: str, port: int) -> None:
    free, why = _bind(transport, python, port)
    if not free:
        raise LaunchError(
            f"master port {port} on {transport.host} (node 0) is already in use ({why}); "
            "pick another `master.port`, or use `port: auto`")
