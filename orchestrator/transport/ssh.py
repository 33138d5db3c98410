"""The transport for remote nodes: one paramiko SSH connection per node,
opened on first use, shared by all threads and reopened if it died. Every
failure a user can cause becomes a ``TransportError`` naming the node and
the fix, never a traceback.

``SshProcessHandle.poll()``: the remote status (0-255); ``-N`` if killed by
signal N; ``EXIT_ABORTED`` after ``abort()``; ``EXIT_CONNECTION_LOST`` (255,
as ``ssh`` exits) when the channel closed with no status.
"""

from __future__ import annotations

import logging
import shlex
import signal
import socket
import threading
from typing import Callable, Mapping, Sequence

import paramiko
from paramiko.common import MSG_CHANNEL_REQUEST, cMSG_CHANNEL_REQUEST

from ..errors import TransportError
from .sshconfig import DEFAULT_SSH_CONFIG, SshTarget, resolve_target
from .base import ProcessHandle, Transport, shell_command
from .sshauth import (NETWORK_ERRORS, authenticate, check_host_key, describe,
                      prefer_known_key_types)

EXIT_CONNECTION_LOST = 255
EXIT_ABORTED = -signal.SIGTERM

# paramiko logs failures (with tracebacks) from its own threads. Without any
# handler Python's last-resort handler prints them on stderr, next to our own
# TransportError; this keeps them out unless the application configures logging.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


def _handle_channel_request(chan: paramiko.Channel, m: paramiko.Message) -> None:
    """Record ``exit-signal``, which paramiko ignores: sshd sends it instead of
    ``exit-status`` for a killed command, which would look like a dropped link."""
    start = m.packet.tell()
    if m.get_text() == "exit-signal":
        m.get_boolean()
        chan.ddp_exit_signal = m.get_text()  # e.g. "KILL"
    m.packet.seek(start)
    paramiko.Channel._handle_request(chan, m)


_CHANNEL_HANDLERS = {**paramiko.Transport._channel_handler_table,
                     MSG_CHANNEL_REQUEST: _handle_channel_request}


class SshProcessHandle(ProcessHandle):
    """A command running in one SSH session channel (no pty, stderr merged)."""

    def __init__(self, channel: paramiko.Channel):
        self._channel = channel
        self._aborted = False
        self.stdout = channel.makefile("rb")  # type: ignore[assignment]

    def read_chunk(self, size: int) -> bytes:
        """The channel's data as it arrives, straight from paramiko's buffer."""
        return self._channel.recv(size)

    def wait(self, timeout: float | None = None) -> int:
        """Block on paramiko's exit-status event; an aborted channel is over
        at once (a frozen peer may never send its status)."""
        if self._aborted:
            return EXIT_ABORTED
        if not self._channel.status_event.wait(timeout):
            raise TimeoutError(f"still running after {timeout:.1f}s")
        return super().wait(timeout=1.0)

    def send(self, data: bytes) -> None:
        try:
            self._channel.sendall(data)
        except NETWORK_ERRORS:
            pass  # the command or the connection is gone; poll() tells which

    def close_stdin(self) -> None:
        """Send EOF: the remote command reads end-of-file on its stdin."""
        try:
            self._channel.shutdown_write()
        except NETWORK_ERRORS:
            pass

    def poll(self) -> int | None:
        channel = self._channel
        if not channel.exit_status_ready():
            return EXIT_ABORTED if self._aborted else None
        if channel.exit_status >= 0:  # paramiko keeps -1 until exit-status arrives
            return channel.exit_status
        name = getattr(channel, "ddp_exit_signal", None)
        if name and hasattr(signal, f"SIG{name}"):
            return -getattr(signal, f"SIG{name}")
        return EXIT_ABORTED if self._aborted else EXIT_CONNECTION_LOST

    @property
    def connection_lost(self) -> bool:
        """True when the command ended because the connection dropped."""
        return self.poll() == EXIT_CONNECTION_LOST and self._channel.exit_status < 0

    def abort(self) -> None:
        """Ask sshd to SIGTERM the command (RFC 4254 "signal"), then drop the
        channel: dropping alone leaves a command that neither reads nor writes
        running. The signal misses its children; some servers ignore it."""
        self._aborted = True
        channel = self._channel
        try:
            if not channel.closed:
                message = paramiko.Message()
                message.add_byte(cMSG_CHANNEL_REQUEST)
                message.add_int(channel.remote_chanid)
                message.add_string("signal")
                message.add_boolean(False)
                message.add_string("TERM")
                channel.transport._send_user_message(message)
        except NETWORK_ERRORS:
            pass
        channel.close()


class SshTransport(Transport):
    """Runs commands on one node over SSH. An argument left ``None`` falls back
    to ``~/.ssh/config``, then the defaults; keys accepted under accept-new go
    to the first ``known_hosts``. Construction reads the config file, no more."""

    def __init__(self, host: str, *, user: str | None = None, port: int | None = None,
                 identity_file: str | None = None, connect_timeout: float | None = None,
                 strict_host_keys: str | None = None,
                 known_hosts: str | Sequence[str] | None = None,
                 ssh_config: str | None = DEFAULT_SSH_CONFIG,
                 proxy_jump: str | None = None, keepalive_s: float = 15.0):
        self.host = host
        try:
            self.target: SshTarget = resolve_target(
                host, user=user, port=port, identity_file=identity_file,
                connect_timeout=connect_timeout, strict_host_keys=strict_host_keys,
                known_hosts=known_hosts, ssh_config=ssh_config, proxy_jump=proxy_jump)
        except ValueError as exc:
            raise TransportError(host, f"bad SSH settings: {exc}") from exc
        self.warnings = self.target.warnings
        self.keepalive_s = keepalive_s
        self._lock = threading.Lock()       # guards connecting and the chain
        self._chain: list[paramiko.Transport] = []  # jump hosts..., then the node

    # -- Transport interface ----------------------------------------------

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> SshProcessHandle:
        # sshd carries stdout and stderr as two streams read from two pipes,
        # so merging them on our side loses their relative order: the command
        # writes both to one pipe, like LocalTransport's stderr=STDOUT.
        command = shell_command(argv, env=env, cwd=cwd, merge_stderr=True)
        connection = self._connection()
        try:
            channel = connection.open_session(timeout=self.target.connect_timeout)
            channel.set_combine_stderr(True)  # the login shell's own errors (cd, env)
        except paramiko.ChannelException as exc:
            raise self._error(f"sshd refused a new session: {exc.text}",
                              "too many concurrent commands for its MaxSessions?") from None
        except NETWORK_ERRORS as exc:
            raise self._error(f"connection lost while starting `{shlex.join(argv)}`: "
                              f"{describe(exc)}") from None
        try:
            channel.exec_command(command)
        except NETWORK_ERRORS as exc:
            channel.close()
            if not connection.is_active():
                raise self._error(f"connection lost while starting `{shlex.join(argv)}`: "
                                  f"{describe(exc)}") from None
            raise self._error(
                f"sshd refused to run a command ({describe(exc)})",
                "ddp-orch needs exec sessions on the node: allow them in its sshd_config "
                "(no ForceCommand for this user) and in authorized_keys (no command=)") from None
        return SshProcessHandle(channel)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    # -- connecting -------------------------------------------------------

    def _connection(self) -> paramiko.Transport:
        """The live connection to the node, opened (or reopened) on demand."""
        with self._lock:
            if not self._chain or not self._chain[-1].is_active():
                self._close_locked()
                self._chain = self._open(self.target)
            return self._chain[-1]

    def _close_locked(self) -> None:
        for connection in reversed(self._chain):
            _ignore_errors(connection.close)
        self._chain = []

    def _open(self, target: SshTarget) -> list[paramiko.Transport]:
        """Connect to ``target``, through its jump hosts; returns the whole chain."""
        chain: list[paramiko.Transport] = []
        if target.jump is None:
            sock = self._tcp_connect(target)
        else:
            try:
                chain = self._open(target.jump)
            except TransportError as exc:
                raise self._error(f"jump host {target.jump.describe()}: {exc.message}",
                                  exc.hint) from None
            try:
                sock = chain[-1].open_channel("direct-tcpip", (target.hostname, target.port),
                                              ("127.0.0.1", 0), timeout=target.connect_timeout)
            except NETWORK_ERRORS as exc:
                _close_all(chain)
                reason = exc.text if isinstance(exc, paramiko.ChannelException) else describe(exc)
                raise self._error(f"unreachable: jump host {target.jump.address} cannot "
                                  f"connect to {target.address}: {reason}") from None
        try:
            chain.append(self._handshake(sock, target))
        except BaseException:
            _close_all(chain)
            raise
        return chain

    def _tcp_connect(self, target: SshTarget) -> socket.socket:
        try:
            sock = socket.create_connection((target.hostname, target.port),
                                            timeout=target.connect_timeout)
        except socket.gaierror as exc:
            raise self._error(f"unreachable: cannot resolve host name {target.hostname!r} "
                              f"({exc.strerror})") from None
        except TimeoutError:
            raise self._error(f"unreachable: no answer from {target.address} within "
                              f"{target.connect_timeout:g}s") from None
        except ConnectionRefusedError:
            raise self._error(f"unreachable: connection refused by {target.address}",
                              "is sshd running there, on that port?") from None
        except OSError as exc:
            raise self._error(f"unreachable: cannot connect to {target.address}: "
                              f"{exc.strerror or exc}") from None
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if self.keepalive_s and hasattr(socket, "TCP_USER_TIMEOUT"):
            # Unacknowledged data (our keepalives) for this long kills the
            # socket; otherwise a vanished peer takes ~15 min to notice.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                            int(self.keepalive_s * 3 * 1000))
        return sock

    def _handshake(self, sock, target: SshTarget) -> paramiko.Transport:
        """SSH handshake, host key check and login on an open socket/channel."""
        connection = paramiko.Transport(sock)
        try:
            connection._channel_handler_table = _CHANNEL_HANDLERS
            connection.banner_timeout = connection.handshake_timeout = target.connect_timeout
            prefer_known_key_types(connection, target)
            try:
                # start_client returns quietly (no exception) when its own
                # timeout expires mid-handshake, hence the check after it.
                connection.start_client(timeout=target.connect_timeout + 1)
                if not (connection.is_active() and connection.initial_kex_done):
                    raise paramiko.SSHException(
                        f"no complete handshake within {target.connect_timeout:g}s")
            except NETWORK_ERRORS as exc:
                raise self._error(f"unreachable: SSH handshake with {target.address} failed: "
                                  f"{describe(exc)}") from None
            check_host_key(connection, target, self.host)
            authenticate(connection, target, self.host)
            if self.keepalive_s:
                connection.set_keepalive(max(1, int(self.keepalive_s)))
            return connection
        except BaseException:
            connection.close()
            raise

    # -- helpers ----------------------------------------------------------

    def _error(self, message: str, hint: str = "") -> TransportError:
        return TransportError(self.host, message, hint)


def _close_all(chain: list[paramiko.Transport]) -> None:
    for connection in reversed(chain):
        _ignore_errors(connection.close)


def _ignore_errors(action: Callable[[], object]) -> None:
    try:
        action()
    except Exception:
        pass
