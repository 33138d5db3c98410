"""The backends' own cluster-file blocks (``config/blocks``): each declares
its key, spec, loader, schema fragment and rules, and the loader and the
schema only iterate the registry."""

import ast
import os

import pytest

from conftest import ROOT
from orchestrator.config import loader
from orchestrator.config.blocks import BLOCK_MODULES, blocks
from orchestrator.config.loader import load_cluster_text
from orchestrator.config.schema import cluster_schema
from orchestrator.config.spec import BACKENDS

CONTRACT = ("KEY", "AFTER", "BACKEND", "PLACES_NODES", "PLACED_WORDS", "WORKDIR_UNUSED", "Spec",
            "load", "check_layout", "schema", "schema_rules")


@pytest.mark.parametrize("block", blocks(), ids=BLOCK_MODULES)
def test_every_block_declares_the_contract_and_reaches_the_keys_and_the_schema(block):
    assert [name for name in CONTRACT if not hasattr(block, name)] == []
    assert block.BACKEND in BACKENDS
    keys = list(loader.TOP_KEYS)
    assert keys[keys.index(block.AFTER) + 1] == block.KEY
    schema = cluster_schema()
    assert schema["properties"][block.KEY] == {"$ref": f"#/$defs/{block.KEY}"}
    assert schema["$defs"][block.KEY]["type"] == "object"


def test_a_block_reaches_the_spec_under_its_key_and_the_backend_it_names():
    given = load_cluster_text("slurm: {partition: gpu}\nnodes: [{host: n1, gpus: 0}]\n"
                              "workload: {name: linear}\n")
    assert given.backend == "slurm" and given.block("slurm").partition == "gpu"
    chosen = load_cluster_text("backend: slurm\nnodes: [{host: n1, gpus: 0}]\n"
                               "workload: {name: linear}\n")
    assert chosen.block("slurm").partition is None  # the backend's block, defaults
    other = load_cluster_text("nodes: [{host: n1, gpus: 0}]\nworkload: {name: linear}\n")
    assert other.backend == "ssh" and other.block("slurm") is None


@pytest.mark.parametrize("module", ["loader.py", "schema.py", "yamlsrc.py"])
def test_the_config_layer_names_no_backend_block(module):
    path = os.path.join(ROOT, "orchestrator", "config", module)
    tree = ast.parse(open(path, encoding="utf-8").read())
    keys = {block.KEY for block in blocks()}
    found = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and node.value in keys]
    assert found == [], f"{module} names a backend block: its module in config/blocks does"
