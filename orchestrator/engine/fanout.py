"""Run one function on every node at once: the launch, ``check`` and ``down`` all do.
Every node's value or error comes back, never a first error that hides the
others; a node still busy at the deadline is timed out, and the caller closes it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, TypeVar

from ..errors import LaunchError, OrchestratorError

K = TypeVar("K")
T = TypeVar("T")

# Failures a node can cause; anything else is a bug and is raised as is.
NODE_ERRORS = (OrchestratorError, OSError, TimeoutError)


@dataclass(frozen=True)
class GroupResult(Generic[K, T]):
    succeeded: dict = field(default_factory=dict)  # key -> value
    failed: dict = field(default_factory=dict)  # key -> exception

    @property
    def ok(self) -> bool:
        return not self.failed

    def values(self, what: str, label: Callable[[K], str] = str) -> dict:
        """Every value, or one LaunchError that names each node that failed."""
        if self.failed:
            lines = [f"  {label(key)}: {_describe(exc)}"
                     for key, exc in sorted(self.failed.items(), key=lambda kv: str(kv[0]))]
            raise LaunchError(f"{what} failed:\n" + "\n".join(lines))
        return self.succeeded


def on_all(fn: Callable[[K], T], keys: Iterable[K], *,
           timeout_s: float | None = None) -> GroupResult[K, T]:
    """``fn(key)`` for every key in parallel; at most ``timeout_s`` for the group."""
    keys = list(keys)
    results: dict = {}
    errors: dict = {}
    bugs: list[BaseException] = []

    def one(key: K) -> None:
        try:
            results[key] = fn(key)
        except NODE_ERRORS as exc:
            errors[key] = exc
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            bugs.append(exc)

    threads = [threading.Thread(target=one, args=(key,), daemon=True, name=f"fanout-{key}")
               for key in keys]
    for thread in threads:
        thread.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for key, thread in zip(keys, threads):
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            errors[key] = TimeoutError(f"no answer within {timeout_s:g}s")
    if bugs:
        raise bugs[0]
    return GroupResult(succeeded={k: results[k] for k in keys if k in results and k not in errors},
                       failed={k: errors[k] for k in keys if k in errors})


def _describe(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    if message is not None:  # a TransportError: the label already names the host
        hint = getattr(exc, "hint", "")
        return message + (f" ({hint})" if hint else "")
    return str(exc) or type(exc).__name__
