"""Backends from outside the tree (``ddp_orch.backends`` entry points): found
by name only, loaded when named, and refused clearly when they do not fit.
The entry points here are stand-ins with what ``importlib.metadata`` gives
(``name``, ``value``, ``dist``, ``load``); the real thing, a distribution on
PYTHONPATH, is ``tests/live/test_plugin_backend.py``'s."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator import backends
from orchestrator.backends.scheduler.backend import SchedulerBackend
from orchestrator.config import limits
from orchestrator.config.loader import load_cluster_text
from orchestrator.engine.options import LaunchOptions
from orchestrator.errors import ConfigError


class Good(SchedulerBackend):
    name = "good"
    interface = backends.INTERFACE

    def submit_job(self, plan, run, env):
        raise AssertionError("not submitted here")

    job_state = cancel_job = check = submit_job


class Old(Good):
    name = "old"
    interface = 0


class Silent(SchedulerBackend):  # declares no interface at all
    name = "silent"


class Misnamed(Good):
    name = "other"


def entry(name: str, target, loaded: list[str]):
    def load():
        loaded.append(name)
        if isinstance(target, Exception):
            raise target
        return target

    return SimpleNamespace(name=name, value=f"plug.{name}:Backend", load=load,
                           dist=SimpleNamespace(name=f"plug-{name}", version="2.0"))


@pytest.fixture
def plugins(monkeypatch):
    loaded: list[str] = []
    table = {"good": Good, "old": Old, "silent": Silent, "misnamed": Misnamed,
             "broken": ImportError("No module named 'plug'"), "notaclass": len}
    monkeypatch.setattr(limits, "_plugins", {n: entry(n, t, loaded) for n, t in table.items()})
    return loaded


def test_names_come_from_the_entry_points_without_loading_any(plugins):
    assert limits.backend_names() == ("local", "ssh", "slurm", "broken", "good",
                                      "misnamed", "notaclass", "old", "silent")
    assert str(backends.origin_of("good")) == "plug-good 2.0 (plug.good:Backend)"
    assert str(backends.origin_of("slurm")) == "built in"
    assert backends.backend_class("local").name == "local"
    assert plugins == []  # nothing loaded until a plugin is named


def test_a_plugin_that_fits_is_the_backend_a_file_names(plugins):
    spec = load_cluster_text("backend: good\nnodes: [{host: a, procs: 1}]\n"
                             "workload: {name: noop}\n")
    assert spec.backend == "good"
    assert backends.backend_for(spec, LaunchOptions()).__class__ is Good
    assert plugins == ["good"]


@pytest.mark.parametrize("name, said", [
    ("old", "backend 'old' (plug-old 2.0 (plug.old:Backend)) was built for backend interface "
            "0; this ddp-orch has interface 2"),
    ("silent", "was built for backend interface None; this ddp-orch has interface 2"),
    ("broken", "backend 'broken' (plug-broken 2.0 (plug.broken:Backend)) could not be loaded: "
               "ImportError: No module named 'plug'"),
    ("notaclass", "is not a LaunchBackend class"),
    ("misnamed", "calls itself 'other'"),  # the class's name differs from its entry point's
])
def test_a_plugin_that_does_not_fit_is_one_clear_error(plugins, name, said):
    with pytest.raises(ConfigError, match="^backend: ") as refused:
        backends.backend_class(name)
    assert said in str(refused.value)


def test_a_misspelt_backend_is_refused_with_the_installed_names(plugins):
    with pytest.raises(ConfigError) as refused:
        load_cluster_text("backend: goood\nnodes: [{host: a, procs: 1}]\n"
                          "workload: {name: noop}\n")
    assert "'goood' is not one of local, ssh, slurm, broken, good" in str(refused.value)
    assert "did you mean 'good'" in str(refused.value)
    assert plugins == []


def test_a_plugin_cannot_take_a_builtin_name(monkeypatch):
    from importlib import metadata

    fake = SimpleNamespace(name="slurm", value="plug:Backend")
    other = SimpleNamespace(name="pbs", value="plug:Pbs")
    monkeypatch.setattr(limits, "_plugins", None)
    monkeypatch.setattr(metadata, "entry_points", lambda group: [fake, other]
                        if group == limits.PLUGIN_GROUP else [])
    assert limits.backend_names() == ("local", "ssh", "slurm", "pbs")
    assert backends.origin_of("slurm").builtin
