"""The transport for nodes whose host is this machine: plain subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Sequence

from .base import ProcessHandle, Transport, TransportError, home_expanded


class LocalProcessHandle(ProcessHandle):
    def __init__(self, popen: subprocess.Popen):
        self._popen = popen
        self.stdout = popen.stdout  # type: ignore[assignment]

    @property
    def pid(self) -> int:
        return self._popen.pid

    def send(self, data: bytes) -> None:
        try:
            self._popen.stdin.write(data)  # type: ignore[union-attr]
            self._popen.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, ValueError):
            pass  # the command is gone; its exit code tells the rest

    def close_stdin(self) -> None:
        try:
            self._popen.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass

    def poll(self) -> int | None:
        return self._popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"still running after {timeout:.1f}s") from None

    def abort(self) -> None:
        """SIGKILL the command's whole process group (it leads its own session)."""
        if self._popen.poll() is None:
            try:
                os.killpg(self._popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._popen.wait()


class LocalTransport(Transport):
    """Runs commands on this machine with ``subprocess``, no shell involved."""

    def __init__(self, host: str = "localhost"):
        self.host = host

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> LocalProcessHandle:
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            popen = subprocess.Popen(
                home_expanded(argv), env=full_env, cwd=cwd,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: teardown reaches all of it
            )
        except OSError as exc:
            raise TransportError(self.host, f"cannot start {argv[0]!r}: {exc.strerror}") from exc
        return LocalProcessHandle(popen)
