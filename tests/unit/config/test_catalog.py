"""The core knows workloads only through the catalog it is handed: a site's own
catalog, with none of the built-ins, is what the loader checks names and
arguments against, what the plan runs, what the refusals rule with and what
the schema offers. Each assertion fails if one of those reads the built-in
table instead."""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.config.catalog import Catalog, builtin
from orchestrator.config.loader import load_cluster_text
from orchestrator.config.localmode import local_spec, with_args
from orchestrator.config.schema import cluster_schema
from orchestrator.controller.session import prepare
from orchestrator.engine.options import LaunchOptions
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan
from workloads.catalog import ArgSpec, Layout, Rule, WorkloadInfo, describe_speed

SWEEP = WorkloadInfo(
    name="sweep", module="site.sweep", summary="a site's own sweep", seed="-",
    args=(ArgSpec("steps", int, 10, "steps per trial", minimum=1),
          ArgSpec("trials", int, 2, "trials, one per rank at most")),
    rules=(Rule("trials", lambda a, lay: a["trials"] > lay.world_size,
                lambda a, lay: f"--trials {a['trials']} over {lay.world_size} ranks",
                "one trial per rank at most"),))
SITE = Catalog({"sweep": SWEEP}, Layout, describe_speed)
FILE = "nodes:\n  - {host: localhost, procs: 2}\nworkload: {name: sweep%s}\n"


def site_spec(args: str = ""):
    return load_cluster_text(FILE % args, catalog=SITE)


def test_the_loader_checks_names_and_arguments_against_the_catalog_it_is_given():
    assert site_spec(", args: {steps: 3}").workload.args == {"steps": 3}
    with pytest.raises(ConfigError) as unknown:
        load_cluster_text(FILE.replace("sweep", "mnist") % "", catalog=SITE)
    assert (unknown.value.message, unknown.value.hint) == (
        "unknown workload 'mnist'", "built-in workloads: sweep")
    with pytest.raises(ConfigError) as low:
        site_spec(", args: {steps: 0}")
    assert low.value.message == "0 is below the minimum 1"
    with pytest.raises(ConfigError):  # and the built-ins' by default
        load_cluster_text(FILE % "")


def test_the_plan_runs_the_module_the_given_catalog_names():
    plan = build_plan(site_spec(", args: {steps: 3}"), run_id="r", local_run_dir="/tmp/r")
    assert (plan.workload, plan.entrypoint.module, plan.entrypoint.args) == (
        "sweep", "site.sweep", ("--steps", "3"))


def test_the_refusals_rule_with_the_given_catalogs_rules():
    prepare(site_spec(", args: {trials: 2}"), LaunchOptions(), run_id="r",
            local_run_dir="/tmp/r")
    with pytest.raises(ConfigError) as refused:
        prepare(site_spec(", args: {trials: 3}"), LaunchOptions(), run_id="r",
                local_run_dir="/tmp/r")
    assert (refused.value.message, refused.value.path) == ("--trials 3 over 2 ranks",
                                                           "workload.args.trials")


def test_the_command_lines_options_keep_the_files_catalog():
    spec = with_args(site_spec(), {"steps": 4})
    assert spec.workload.args == {"steps": 4} and spec.catalog is SITE
    here = local_spec(spec, workload=None, gpus=None, procs=3, device=None, args={})
    assert here.catalog is SITE
    with pytest.raises(ConfigError) as unknown:
        local_spec(spec, workload="linear", gpus=None, procs=2, device=None, args={})
    assert unknown.value.path == "--workload"
    with pytest.raises(ConfigError) as bad:
        with_args(site_spec(), {"epochs": 1})
    assert bad.value.message == "workload 'sweep' has no argument 'epochs'"


def test_the_schema_offers_the_given_catalogs_workloads():
    workload = cluster_schema(SITE)["$defs"]["workload"]
    assert workload["properties"]["name"]["enum"] == ["sweep"]
    assert cluster_schema()["$defs"]["workload"]["properties"]["name"]["enum"] == \
        list(builtin())


def test_a_spec_keeps_its_catalog_through_a_replace_and_compares_without_it():
    spec = site_spec()
    assert dataclasses.replace(spec, name="x").catalog is SITE
    assert spec == dataclasses.replace(spec, catalog=builtin())
