"""The catalog and argparse side of the workloads: no torch, no processes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from wl_support import ROOT, workload_env
from orchestrator.plan.build import args_to_argv
from workloads.catalog import CATALOG, build_parser

WORKLOADS = ("noop", "linear", "toy", "mlp", "mnist", "resnet")


def test_catalog_lists_every_workload_with_a_module():
    assert set(WORKLOADS) <= set(CATALOG)
    for name in WORKLOADS:
        info = CATALOG[name]
        assert info.module == f"workloads.{name}"
        assert importlib.util.find_spec(info.module) is not None


@pytest.mark.parametrize("name", WORKLOADS)
def test_parser_defaults_match_the_catalog(name):
    args = vars(build_parser(name).parse_args([]))
    for spec in CATALOG[name].args:
        assert args[spec.name] == spec.default
    assert args["result_file"] is None


@pytest.mark.parametrize("name", WORKLOADS[1:])
def test_training_workloads_share_the_common_arguments(name):
    names = {a.name for a in CATALOG[name].args}
    assert {"epochs", "global_batch_size", "lr", "lr_scaling", "seed", "max_steps",
            "log_every", "shuffle", "num_workers", "device"} <= names


def test_seed_defaults_are_the_tutorials():
    linear = build_parser("linear").parse_args([])
    assert (linear.epochs, linear.global_batch_size, linear.lr) == (10, 32, 0.01)
    toy = build_parser("toy").parse_args([])
    assert toy.lr == 0.5 and toy.dataset == "seed"
    resnet = build_parser("resnet").parse_args([])
    assert (resnet.image_size, resnet.momentum) == (224, 0.9)


@pytest.mark.parametrize("name", WORKLOADS[1:])
def test_no_workload_scales_its_learning_rate_by_default(name):
    """The global batch is the same on any world size, so a learning rate
    multiplied by it (seed 001's rule) would make a 1-process run and a DDP
    run two learning problems; resnet used to, and compare then misled."""
    assert build_parser(name).parse_args([]).lr_scaling == "none"


def test_args_round_trip_through_args_to_argv():
    parser = build_parser("mnist")
    wanted = {"epochs": 2, "sync_bn": False, "resume": True, "amp": "bf16",
              "checkpoint": "ck.pt", "lr": 0.05, "data": "synthetic"}
    args = vars(parser.parse_args(list(args_to_argv(wanted))))
    for key, value in wanted.items():
        assert args[key] == value


@pytest.mark.parametrize("argv", [["--amp", "fp8"], ["--device", "tpu"],
                                  ["--lr-scaling", "sqrt"], ["--mode", "x"]])
def test_parser_rejects_bad_choices(argv):
    name = "mlp" if argv[0] == "--mode" else "mnist"
    with pytest.raises(SystemExit):
        build_parser(name).parse_args(argv)


def test_controller_side_modules_never_import_torch():
    code = ("import sys, workloads, workloads.catalog, workloads.contract, "
            "workloads.make_tiny_datasets; "
            "bad = [m for m in ('torch', 'torchvision') if m in sys.modules]; "
            "assert not bad, bad")
    proc = subprocess.run([sys.executable, "-c", code], env=workload_env(None), cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
