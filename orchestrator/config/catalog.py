"""The workloads a cluster file may name (``workload: {name: mnist}``), as the core
reads them: through a ``Catalog``, never by importing a workload.

The loader is handed a catalog and the spec carries it, so the plan (the module a
name runs) and the refusals (a workload's own rules) read the one the file was
checked against. ``builtin()`` is ``workloads/catalog.py``'s table, and this is the
only module of the core that imports it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping, Protocol


class Arg(Protocol):
    """One argument of a workload (``name`` in snake_case, ``flag`` as typed)."""

    name: str
    type: type
    default: Any
    help: str
    choices: tuple
    minimum: int | None
    flag: str


class Workload(Protocol):
    """A workload a name stands for: what ``python -m`` runs, and what it accepts."""

    name: str
    module: str
    summary: str
    seed: str
    args: tuple[Arg, ...]

    def arg(self, name: str) -> Arg | None: ...

    def refusal(self, args: Mapping[str, Any], layout: Any) -> tuple[Any, str] | None:
        """The first rule ``args`` break where the ranks run, with its message."""


@dataclass(frozen=True)
class Catalog:
    """The workloads by name, with what their rules and records are read with:
    ``layout(world_size, device=, gpus=, restarts=)`` describes where the ranks
    run; ``describe_speed(record)`` words a result's ``speed`` record."""

    workloads: Mapping[str, Workload]
    layout: Callable[..., Any]
    describe_speed: Callable[[Mapping[str, Any]], str]

    def __contains__(self, name: object) -> bool:
        return name in self.workloads

    def __getitem__(self, name: str) -> Workload:
        return self.workloads[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.workloads)

    def names(self) -> str:
        """``noop, linear, ...``: for a hint."""
        return ", ".join(self.workloads)


@functools.cache
def builtin() -> Catalog:
    """The workloads that ship with ddp-orch."""
    from workloads import catalog

    return Catalog(MappingProxyType(catalog.CATALOG), catalog.Layout, catalog.describe_speed)
