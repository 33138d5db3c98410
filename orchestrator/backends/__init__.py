"""The registry of launch backends, by the name a cluster file's ``backend:`` gives.

Built in (``BUILTIN``: each name of ``config.limits.BACKENDS`` is the module
of that name here) or a plugin's entry point in the ``ddp_orch.backends``
group, so a site adds its scheduler without forking. Imported only when named: a dry-run never loads paramiko and a
broken plugin cannot break ``--help``. A plugin declaring another
``INTERFACE`` is a clear error, not an AttributeError mid-launch.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ..config.limits import (BACKENDS, PLUGIN_GROUP, backend_names, distribution_of,
                             entry_points_of)
from ..config.spec import ClusterSpec
from ..engine.options import LaunchOptions
from ..errors import ConfigError
from .base import Capabilities, LaunchBackend

if TYPE_CHECKING:
    from ..records.store import RunRecord

# The version of the interface a backend fills (``LaunchBackend``, and
# ``scheduler.backend.SchedulerBackend`` for a scheduler). It goes up when a
# method a backend must provide, or what the engine asks of it, changes.
INTERFACE = 2
# Each built-in backend's module: ``backend: NAME`` is ``backends/NAME``.
BUILTIN = {name: f"{__name__}.{name}" for name in BACKENDS}


def plugin_backends() -> dict:
    """The plugins' backends' entry points by name, none loaded."""
    return {name: ep for name, ep in entry_points_of(PLUGIN_GROUP).items()
            if name not in BUILTIN}


@dataclass(frozen=True)
class BackendOrigin:
    """Where a backend comes from: built in, or a plugin's distribution."""

    builtin: bool
    where: str  # the module, or "package.module:Class" of the entry point
    distribution: str = ""  # "name version" of a plugin's distribution

    def __str__(self) -> str:
        return "built in" if self.builtin else f"{self.distribution} ({self.where})"


def backend_class(name: str) -> type[LaunchBackend]:
    """The class of backend ``name``, importing its module now."""
    if name in BUILTIN:
        return importlib.import_module(BUILTIN[name]).Backend
    entry = plugin_backends().get(name)
    if entry is None:
        from ..config.yamlsrc import closest_hint

        names = backend_names()
        raise ConfigError(f"unknown backend {name!r}", path="backend",
                          hint=closest_hint(name, names) or f"one of {', '.join(names)}")
    origin = origin_of(name)
    try:
        cls = entry.load()
    except Exception as exc:  # noqa: BLE001 (whatever a plugin raises, said as its fault)
        raise ConfigError(f"backend {name!r} ({origin}) could not be loaded: "
                          f"{type(exc).__name__}: {exc}", path="backend",
                          hint="reinstall it, or ask its authors; the built-in backends "
                               "work without it") from None
    if not (isinstance(cls, type) and issubclass(cls, LaunchBackend)):
        raise ConfigError(f"backend {name!r} ({origin}) is not a LaunchBackend class",
                          path="backend", hint="its entry point must name the class")
    declared = getattr(cls, "interface", None)
    if declared != INTERFACE:
        raise ConfigError(f"backend {name!r} ({origin}) was built for backend interface "
                          f"{declared!r}; this ddp-orch has interface {INTERFACE}",
                          path="backend", hint="install the plugin's release for this "
                          "ddp-orch, or the ddp-orch it was built for")
    if getattr(cls, "name", None) != name:
        raise ConfigError(f"backend {name!r} ({origin}) calls itself "
                          f"{getattr(cls, 'name', None)!r}", path="backend",
                          hint="its class's `name` must be its entry point's name")
    return cls


def origin_of(name: str) -> BackendOrigin:
    """Where backend ``name`` comes from, without importing it."""
    if name in BUILTIN:
        return BackendOrigin(True, BUILTIN[name])
    entry = plugin_backends()[name]
    return BackendOrigin(False, entry.value, distribution_of(entry) or "a plugin")


def backends_with(has: Callable[[Capabilities], bool]) -> list[str]:
    """The built-in backends whose capabilities ``has``, in registry order."""
    return [name for name in BUILTIN if has(backend_class(name).can)]


def fit(spec: ClusterSpec, options: LaunchOptions, backend: str | None = None) -> ClusterSpec:
    """``spec`` under ``backend`` (``--backend`` over the file's choice), once
    every option the backend cannot honour (``LaunchBackend.can``) is refused
    before anything runs: the one place the command line's options meet a
    backend's, so that none is silently moot.
    """
    return choose(spec, options, backend).spec


def choose(spec: ClusterSpec, options: LaunchOptions,
           backend: str | None = None) -> LaunchBackend:
    """The backend that runs ``spec`` with ``options``, as ``fit`` chose it."""
    if backend is not None and backend != spec.backend:
        if backend_class(backend).can.this_machine and not all(n.is_local for n in spec.nodes):
            raise ConfigError(f"--backend {backend} runs every node on this machine, but the "
                              "file lists remote hosts", path="--backend",
                              source="command line",
                              hint="use --local to run the file's workload here")
        spec = dataclasses.replace(spec, backend=backend)
    chosen = backend_class(spec.backend)
    if options.queue_timeout_s is not None and not chosen.can.queue:
        queued = backends_with(lambda can: can.queue)
        words = "; ".join(backend_class(name).can.queue_wait for name in queued)
        raise ConfigError(f"only the {' or '.join(queued)} backend has a queue to time out "
                          f"({words}); this run uses the {spec.backend} "
                          "backend, which starts at once", path="--queue-timeout",
                          source="command line",
                          hint="drop --queue-timeout; --start-timeout bounds how long every "
                               f"node has to join (or use --backend {' or '.join(queued)})")
    if options.max_restarts and not chosen.can.restarts:
        having = backends_with(lambda can: can.restarts)
        raise ConfigError(f"gang restarts are for the {' and '.join(having)} backends",
                          path="--max-restarts", source="command line",
                          hint=chosen.can.instead_of_restarts)
    if options.detach and options.hang_timeout_s is not None and not chosen.can.restarts:
        raise ConfigError(f"a detached {spec.backend} job has no hang watchdog: the nodes' "
                          f"keepers run it, and the {spec.backend} backend starts none",
                          path="--hang-timeout", source="command line",
                          hint="follow the job (drop --detach) to keep the watchdog, or "
                               "drop --hang-timeout (or hang_timeout:)")
    return chosen(options, spec)


def backend_of(record: "RunRecord", options: LaunchOptions) -> LaunchBackend:
    """The backend a recorded run runs on; a damaged record names none, and says so."""
    from ..records.outcome import RunState  # not for a dry-run, which reads no record

    if record.state is RunState.DAMAGED:
        raise ConfigError(f"run {record.run_id}: {record.error}", source="command line",
                          hint=f"`ddp-orch prune {record.run_id}` removes it here; what it "
                               "started on its nodes, if anything, cannot be found without "
                               "its record")
    return backend_class(record.backend)(options)

