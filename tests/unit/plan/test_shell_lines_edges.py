"""``plan/shell.py``'s words and node lines, value by value: the shell text
is written out by hand here (``scripts/mutation`` found it unpinned)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from conftest import ROOT
from orchestrator.agent.wire.owner import Holder, Owner
from orchestrator.plan.dryrun import NodeLaunch
from orchestrator.plan.model import NodePlan
from orchestrator.plan.render import dryrun_from_dict, render
from orchestrator.plan.shell import _torchrun_words, node_shell_line, shell_word

SHIM = "ddp_orch_shim"
PORT = '"${MASTER_PORT:-29500}"'


@pytest.mark.parametrize("word,expected", [
    ("~", '"$HOME"'),
    ("~/", '"$HOME"'),
    ("~/x y", '"$HOME"/\'x y\''),
    ("~x", "'~x'"),
    ("A=~/x", 'A="$HOME"/x'),
    ("A=~/x=y", 'A="$HOME"/x=y'),
    ("a_1=~/x", 'a_1="$HOME"/x'),
    ("1A=~/x", "'1A=~/x'"),
    ("a.b=~/x", "'a.b=~/x'"),
    ("=~/x", "'=~/x'"),
    ("A=x y", "'A=x y'"),
    ("plain", "plain"),
])
def test_shell_word(word, expected):
    assert shell_word(word) == expected


def test_the_master_words_before_the_shim_are_replaced_and_the_program_s_are_not():
    argv = ("torchrun", "--master-addr", "h", "--master-port", "29500", "-m", SHIM,
            "--master-addr", "mine", "--master-port", "1")
    assert _torchrun_words(argv, '"$MASTER_ADDR"', PORT) == (
        'torchrun --master-addr "$MASTER_ADDR" --master-port ' + PORT + " -m " + SHIM
        + " --master-addr mine --master-port 1")
    assert _torchrun_words(argv, None, None) == " ".join(argv)
    # without the shim every word is torchrun's
    assert _torchrun_words(("t", "--master-port", "1"), None, PORT) == "t --master-port " + PORT
    # a flag right before the shim has no value of its own to replace
    assert _torchrun_words(("t", "--master-port", SHIM, "x"), None, PORT) == f"t --master-port {SHIM} x"
    assert _torchrun_words(("--master-addr", "h", SHIM), "A", None) == f"--master-addr A {SHIM}"


def launch(env: dict, *, python="/opt/venv/bin/python", setup=(("pip", "install", "x y"),)):
    node = NodePlan(node_rank=1, host="gpu2", python=python, gpus=(0,), first_rank=1, nproc=1,
                    run_dir="/w/r/node-1", env=env, unset_env=("X_U",))
    argv = (python, "-m", "torch.distributed.run", "--master-addr", "gpu1", "--master-port",
            "auto", "-m", SHIM, "t.py")
    return NodeLaunch(node=node, where="ssh gpu2", env=env, unset_env=("X_U",), argv=argv,
                      setup=setup)


WORDS = "env -u X_U 'A=1 2' HF_TOKEN=\"${HF_TOKEN:?export HF_TOKEN on this node first}\""


def test_a_node_line_with_setup_a_secret_and_an_auto_interface():
    env = {"A": "1 2", "HF_TOKEN": "hf_abcdefgh", "GLOO_SOCKET_IFNAME": "auto"}
    line = node_shell_line(launch(env), "gpu1", True)
    assert line.startswith("cd /w/r/node-1/code && " + WORDS + ' PATH=/opt/venv/bin:"$PATH" '
                           "pip install 'x y' && ifname=\"$(ip -o addr show to ")
    assert "ip -o route get \"$(getent ahosts gpu1 | awk '{print $1; exit}')\" |" in line
    assert line.endswith(" && " + WORDS + ' GLOO_SOCKET_IFNAME="$ifname" /opt/venv/bin/python -m '
                         "torch.distributed.run --master-addr gpu1 --master-port " + PORT
                         + f" -m {SHIM} t.py")


def test_a_node_line_to_an_address_with_nccl_auto_and_the_port_as_planned():
    env = {"NCCL_SOCKET_IFNAME": "auto", "GLOO_SOCKET_IFNAME": "eth0"}
    line = node_shell_line(launch(env, python="python3", setup=()), "10.0.0.1")
    assert "ip -o route get 10.0.0.1 |" in line and "getent" not in line
    assert line.startswith("cd /w/r/node-1/code && ifname=")
    assert line.endswith(" && env -u X_U GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME=\"=$ifname\" "
                         f"python3 -m torch.distributed.run --master-addr gpu1 --master-port auto -m {SHIM} t.py")


def test_a_node_line_without_auto_or_setup_and_a_master_known_once_the_job_runs():
    line = node_shell_line(launch({"A": "1"}, python="python3", setup=(("make",),)), '"$MASTER_ADDR"')
    assert line == ('cd /w/r/node-1/code && env -u X_U A=1 make && env -u X_U A=1 python3 -m '
                    f'torch.distributed.run --master-addr "$MASTER_ADDR" --master-port auto -m {SHIM} t.py')


def example():
    with open(os.path.join(ROOT, "tests", "golden", "example.json.txt"), encoding="utf-8") as fh:
        return dryrun_from_dict(json.loads(fh.read()))


def test_a_kept_run_by_hand_is_said_to_be_kept_by_nothing():
    note = "# By hand nothing keeps the run: no --detach, no gang restarts."
    assert note not in render(example(), "shell").splitlines()
    assert note in render(dataclasses.replace(example(), owner=Owner(Holder.KEEPERS, detached=True)),
                         "shell").splitlines()
    assert note in render(dataclasses.replace(example(), max_restarts=2), "shell").splitlines()


def test_the_secret_names_a_shell_dry_run_takes_from_the_nodes_are_listed():
    info = example()
    node = info.nodes[1]
    node = dataclasses.replace(node, env={**node.env, "B_TOKEN": "abcdefghij", "A_KEY": "zyxwvuts1"})
    text = render(dataclasses.replace(info, nodes=(info.nodes[0], node)), "shell")
    assert ("# Secret values are not printed: the lines take A_KEY, B_TOKEN from the node's "
            "environment.") in text.splitlines()
