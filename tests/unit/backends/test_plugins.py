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


def installed(monkeypatch, groups: dict) -> None:
    """``importlib.metadata`` lists ``groups``' entry points, read afresh."""
    from importlib import metadata

    monkeypatch.setattr(metadata, "entry_points", lambda group: groups.get(group, []))
    limits.entry_points_of.cache_clear()


@pytest.fixture(autouse=True)
def _fresh_entry_points():
    yield
    limits.entry_points_of.cache_clear()  # no test's stand-ins outlive it


@pytest.fixture
def plugins(monkeypatch):
    loaded: list[str] = []
    table = {"good": Good, "old": Old, "silent": Silent, "misnamed": Misnamed,
             "broken": ImportError("No module named 'plug'"), "notaclass": len}
    installed(monkeypatch, {limits.PLUGIN_GROUP: [entry(n, t, loaded) for n, t in table.items()]})
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
    assert backends.choose(spec, LaunchOptions()).__class__ is Good
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
    fake = SimpleNamespace(name="slurm", value="plug:Backend")
    other = SimpleNamespace(name="pbs", value="plug:Pbs")
    installed(monkeypatch, {limits.PLUGIN_GROUP: [fake, other]})
    assert limits.backend_names() == ("local", "ssh", "slurm", "pbs")
    assert backends.origin_of("slurm").builtin


def block_entry(name: str, module) -> SimpleNamespace:
    return SimpleNamespace(name=name, value=f"plug.{name}", load=lambda: module,
                           dist=SimpleNamespace(name=f"plug-{name}", version="2.0"))


@pytest.fixture
def queue_block(monkeypatch):
    """The test queue plugin's own block (``tests/plugins/testqueue``), as an
    entry point of ``ddp_orch.blocks``; the entry points read are counted."""
    import importlib
    import os
    import sys

    from conftest import ROOT

    monkeypatch.syspath_prepend(os.path.join(ROOT, "tests", "plugins", "testqueue"))
    module = importlib.import_module("ddp_orch_testqueue.block")
    reads: list[str] = []
    groups = {limits.BLOCK_GROUP: [block_entry("testqueue", module)],
              limits.PLUGIN_GROUP: [entry("testqueue", Good, [])]}

    def entry_points(group):
        reads.append(group)
        return groups.get(group, [])

    from importlib import metadata

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    limits.entry_points_of.cache_clear()
    yield module, groups, reads
    sys.modules.pop("ddp_orch_testqueue.block", None)


QUEUED = "backend: testqueue\nnodes: [{host: a, procs: 1}]\nworkload: {name: noop}\n"


def test_a_plugin_brings_its_own_block_to_the_cluster_file_and_schema(queue_block):
    module, _groups, reads = queue_block
    spec = load_cluster_text("testqueue: {hold: true}\n" + QUEUED)
    assert spec.block("testqueue") == module.Spec(hold=True)
    assert load_cluster_text(QUEUED).block("testqueue") == module.Spec()  # its default
    with pytest.raises(ConfigError) as bad:
        load_cluster_text("testqueue: {hol: true}\n" + QUEUED)
    assert "did you mean 'hold'" in str(bad.value)
    from orchestrator.config.schema import cluster_schema

    schema = cluster_schema()
    assert schema["properties"]["testqueue"] == {"$ref": "#/$defs/testqueue"}
    assert list(schema["$defs"]["testqueue"]["properties"]) == ["hold"]
    # a file of built-ins alone never reads the entry points
    reads.clear()
    limits.entry_points_of.cache_clear()
    load_cluster_text("slurm: {partition: gpu}\nnodes: {count: 2, procs: 1}\n"
                      "workload: {name: noop}\n")
    assert reads == []


@pytest.mark.parametrize("change, said", [
    (lambda m: delattr(m, "schema"), "it lacks schema"),
    (lambda m: setattr(m, "KEY", "queue"), "its KEY is 'queue'"),
])
def test_a_plugin_block_that_does_not_fit_is_refused_by_name(queue_block, change, said):
    import types

    module, groups, _reads = queue_block
    copy = types.ModuleType("copy")
    copy.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    change(copy)
    groups[limits.BLOCK_GROUP] = [block_entry("testqueue", copy)]
    with pytest.raises(ConfigError) as refused:
        load_cluster_text(QUEUED)
    assert f"the cluster-file block 'testqueue' of plug-testqueue 2.0 does not fit: {said}" \
        in str(refused.value)


def test_a_plugin_block_cannot_take_a_builtin_key(queue_block):
    import types

    module, groups, _reads = queue_block
    copy = types.ModuleType("copy")
    copy.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")})
    copy.KEY = "slurm"
    groups[limits.BLOCK_GROUP] = [block_entry("slurm", copy)]
    with pytest.raises(ConfigError) as refused:
        load_cluster_text(QUEUED)
    assert "'slurm' of plug-slurm 2.0 does not fit: a built-in block has that key" \
        in str(refused.value)
