"""Typed errors. The library raises these; only the CLI prints ``str(error)``
(what was given and how to fix it, no traceback) and exits."""

from __future__ import annotations


class OrchestratorError(Exception):
    """Base class: a problem the user can act on."""

    exit_code = 1


class ConfigError(OrchestratorError):
    """A cluster file or command-line value is wrong: ``source`` the file (or
    "command line"), ``line`` 1-based if known, ``path`` as ``nodes[1].gpus``."""

    exit_code = 2

    def __init__(self, message: str, *, path: str = "", source: str = "",
                 line: int | None = None, hint: str = ""):
        self.message = message
        self.path = path
        self.source = source
        self.line = line
        self.hint = hint
        super().__init__(self._render())

    def _render(self) -> str:
        where = self.source
        if where and self.line is not None:
            where = f"{where}:{self.line}"
        head = ": ".join(part for part in (where, self.path, self.message) if part)
        return head + (f"\n  hint: {self.hint}" if self.hint else "")


class TransportError(OrchestratorError):
    """A node could not be reached, or a command or transfer on it failed."""

    def __init__(self, host: str, message: str, hint: str = ""):
        self.host = host
        self.message = message
        self.hint = hint
        super().__init__(f"{host}: {message}" + (f" ({hint})" if hint else ""))


class LaunchError(OrchestratorError):
    """A run could not start (a node unreachable, a port busy, ...)."""


class Signalled(KeyboardInterrupt):
    """A signal (``ddp-orch down``, a plain ``kill``) the CLI turns into its
    Ctrl-C teardown; its number says who stopped the run."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"signal {signum}")


class RunFailed(OrchestratorError):
    """A run started but did not succeed; carries the collected outcome."""

    def __init__(self, message: str, outcome: object = None):
        self.outcome = outcome
        super().__init__(message)
