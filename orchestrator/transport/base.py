"""One interface for running commands on a node, whatever the node is, so the
backends never know which transport they hold. Commands are argv tuples,
turned into shell text once, by ``shell_command``; values are never
concatenated into shell text anywhere else.
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import BinaryIO, Mapping, Sequence

from ..errors import TransportError


@dataclass(frozen=True)
class CommandResult:
    """The outcome of a command run to completion with ``Transport.run``."""

    host: str
    argv: tuple[str, ...]
    exit_code: int
    output: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ProcessHandle(ABC):
    """A started command. ``stdout`` has stderr merged, so lines keep their
    order; closing stdin tells the node supervisor its controller is gone."""

    stdout: BinaryIO

    def read_chunk(self, size: int) -> bytes:
        """Up to ``size`` bytes of output, as soon as any is there; b"" at EOF.
        Use this or ``stdout``, not both: they do not share a buffer."""
        return self.stdout.read1(size)

    @abstractmethod
    def send(self, data: bytes) -> None:
        """Write ``data`` to the command's stdin."""

    @abstractmethod
    def close_stdin(self) -> None:
        """Signal end-of-input to the command."""

    @abstractmethod
    def poll(self) -> int | None:
        """The exit code, or None while the command runs."""

    @abstractmethod
    def abort(self) -> None:
        """Cut the command off now: kill it (local) or drop its channel (SSH)."""

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit code; raise ``TimeoutError`` after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            code = self.poll()
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"still running after {timeout:.1f}s")
            time.sleep(0.02)


class Transport(ABC):
    """Runs commands on one node: all a node must allow, as files move over
    a command's stdin and stdout (no SFTP)."""

    host: str
    # What the way to the node was configured with but will not use (an
    # ~/.ssh/config keyword ddp-orch does not support), for `check` and `up`.
    warnings: tuple[str, ...] = ()

    @abstractmethod
    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              cwd: str | None = None) -> ProcessHandle:
        """Start ``argv`` on the node; ``env`` is added to the node's own."""

    def close(self) -> None:
        """Release connections; the default has none."""

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
            cwd: str | None = None, timeout: float = 30.0) -> CommandResult:
        """Run ``argv`` to completion and collect its merged output, drained on
        a thread so that a command that hangs with its output open still times out."""
        started = time.monotonic()
        handle = self.start(argv, env=env, cwd=cwd)
        handle.close_stdin()
        chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: chunks.append(handle.stdout.read()),
                                  daemon=True)
        reader.start()
        try:
            code = handle.wait(timeout)
        except TimeoutError:
            handle.abort()
            raise TransportError(self.host, f"`{shlex.join(argv)}` timed out after {timeout:g}s")
        reader.join(max(0.1, timeout - (time.monotonic() - started)))
        return CommandResult(self.host, tuple(argv), code,
                             b"".join(chunks).decode("utf-8", "replace"),
                             time.monotonic() - started)

    def __enter__(self) -> "Transport":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shell_command(argv: Sequence[str], *, env: Mapping[str, str] | None = None,
                  cwd: str | None = None, merge_stderr: bool = False) -> str:
    """The one place where an argv becomes shell text (for SSH exec). Each
    word is quoted and ``env`` goes through ``env(1)``, so any value reaches
    the program verbatim and runs nothing; only the program's leading ``~/``
    is left to the node's shell. ``2>&1`` keeps one stream in written order."""
    for name in env or {}:
        if not name or "=" in name or not name.replace("_", "a").isalnum():
            raise ValueError(f"invalid environment variable name {name!r}")
    words = [*(["env", *(shlex.quote(f"{k}={v}") for k, v in env.items())] if env else []),
             *[_home_word(word) if i == 0 else shlex.quote(word)
               for i, word in enumerate(argv)]]
    command = "exec " + " ".join(words) + (" 2>&1" if merge_stderr else "")
    if cwd:
        command = f"cd {shlex.quote(cwd)} && {command}"
    return command


def _home_word(program: str) -> str:
    """The program quoted for the shell, a leading ``~/`` left to it as ``"$HOME"``."""
    if program.startswith("~/"):
        return '"$HOME"/' + shlex.quote(program[2:])
    return shlex.quote(program)


def home_expanded(argv: Sequence[str]) -> list[str]:
    """``argv`` with its program's leading ``~/`` expanded here, as
    ``shell_command`` has the node's shell do, for a transport with no shell."""
    words = list(argv)
    if words and words[0].startswith("~/"):
        words[0] = os.path.expanduser(words[0])
    return words
