"""Launch backends, by the name a cluster file's ``backend:`` gives.

Each backend is one module here defining ``Backend``, a ``LaunchBackend``
(``base.py``); its name is listed in ``config.spec.BACKENDS``, the grammar
of the cluster file. The module is imported only when that backend is
used, so a dry-run of a local file never loads paramiko.
"""

from __future__ import annotations

import importlib
from typing import Callable

from ..config.spec import BACKENDS, ClusterSpec
from ..errors import ConfigError
from ..engine.options import LaunchOptions
from .base import LaunchBackend


def backend_class(name: str) -> type[LaunchBackend]:
    if name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}", path="backend",
                          hint=f"one of {', '.join(BACKENDS)}")
    return importlib.import_module(f"{__name__}.{name}").Backend


def backends_with(has: Callable[[type[LaunchBackend]], bool]) -> list[str]:
    """The registered backends' names whose class ``has`` (a capability), in
    the registry's order."""
    return [name for name in BACKENDS if has(backend_class(name))]


def get_backend(name: str, options: LaunchOptions,
                spec: ClusterSpec | None = None) -> LaunchBackend:
    return backend_class(name)(options, spec)


def backend_for(spec: ClusterSpec, options: LaunchOptions) -> LaunchBackend:
    """The backend ``spec`` names (``backend:``, or its default)."""
    return get_backend(spec.backend, options, spec)
