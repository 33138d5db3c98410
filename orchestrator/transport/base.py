"""One interface for running commands on a node, whatever the node is.

``LocalTransport`` (subprocess) and ``SshTransport`` (paramiko) implement it
with the same signatures and the same result types, the way fabric's
``Connection.run`` and ``local`` do. The backends never know which one they
hold.

Commands are argv tuples. They are turned into a shell string exactly once,
by ``shell_command`` below, at the transport boundary; values are never
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
    """A command started with ``Transport.start`` and still owned by us.

    ``stdout`` carries the command's stdout and stderr merged, as bytes, so
    the relay keeps the order in which the program wrote its lines.
    Closing stdin is the "controller is gone" signal the node supervisor
    listens for.
    """

    stdout: BinaryIO

    def read_chunk(self, size: int) -> bytes:
        """Up to ``size`` bytes of output, as soon as any is there; b"" at EOF.

        Use either this or ``stdout``, not both: they do not share a buffer.
        """
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
    """Runs commands on one node. That is all a node must allow: files move
    over a command's stdin and stdout (``engine.agentlink``), so no SFTP
    or other file service is needed there."""

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
        """Run ``argv`` to completion and collect its merged output.

        The output is drained on a thread so that a command that hangs
        without closing its output still times out.
        """
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
    """The one place where an argv becomes shell text (for SSH exec).

    Every word is quoted with ``shlex.quote``; ``env`` is passed through
    ``env(1)`` as NAME=VALUE words, so a value full of quotes, ``$()``,
    backticks, ``;`` or newlines reaches the program verbatim and runs
    nothing. One exception: the program itself (``argv[0]``), when it starts
    with ``~/`` (``python: ~/venv/bin/python``), is under the node's home,
    so it becomes ``"$HOME"/'rest'`` for the node's shell to fill in, as the
    shell dry-run writes it (``plan/shell.py``). Its arguments, ``~`` or
    not, arrive verbatim.

    ``merge_stderr``: the program's stderr goes to its stdout pipe (``2>&1``
    on the ``exec``), so one stream keeps the order its lines were written
    in; a wrapper program in front of ``argv`` would hide the program from
    the rule above.
    """
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
    """``argv`` with a leading ``~/`` of its program expanded to this
    machine's home: what ``shell_command`` makes of it on a node whose shell
    reads it, for a transport that starts its command without a shell
    (``LocalTransport``). The arguments stay as they are."""
    words = list(argv)
    if words and words[0].startswith("~/"):
        words[0] = os.path.expanduser(words[0])
    return words
