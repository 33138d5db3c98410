"""The cluster file's JSON Schema (for editors) agrees with the loader.

The loader is the authority; the schema must accept what it accepts and
reject, on its own, every bad input whose fault is one value or one mapping
(unknown keys, types, ranges, patterns, choices, required and exclusive
keys), each built-in workload's arguments, and the rules between fields
that JSON Schema can say. What it leaves to the loader is
``schema.LEFT_TO_THE_LOADER``, each entry with an example below.
"""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
import textwrap

import jsonschema
import pytest
import yaml

from conftest import ROOT
from orchestrator.config import loader
from orchestrator.config.loader import load_cluster_text
from orchestrator.config.schema import (GPU_DUPLICATE_PATTERN, GPU_ITEM_PATTERN,
                                        GPU_STRING_PATTERN, LEFT_TO_THE_LOADER, MASTER_KEYS,
                                        WORKLOAD_KEYS, cluster_schema, index_regex)
from orchestrator.config.spec import BACKENDS
from orchestrator.errors import ConfigError
from workloads.catalog import CATALOG

SCHEMA_FILE = os.path.join(ROOT, "schema", "cluster.schema.json")
EXAMPLE = os.path.join(ROOT, "cluster.yaml.example")
CORPUS_DIR = os.path.join(ROOT, "tests", "bad_inputs")
CORPUS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(CORPUS_DIR, "*.yaml")))
VALIDATOR = jsonschema.Draft202012Validator(cluster_schema())

# Bad inputs that yaml.safe_load cannot turn into data at all, so there is
# nothing for a schema to check (an editor reports these as YAML errors).
UNLOADABLE = {
    "01-yaml-unclosed-flow-list.yaml": "YAML syntax error",
    "02-yaml-tab-indent.yaml": "YAML syntax error (tab)",
    "03-yaml-bad-indent.yaml": "YAML syntax error (indentation)",
    "11-non-string-key.yaml": "a list as a mapping key is unhashable",
    "29-procs-5000-digits.yaml": "past Python's 4300-digit int conversion limit",
    "54-name-impossible-date.yaml": "YAML reads a date that does not exist",
    "55-unknown-tag.yaml": "unknown YAML tag",
    "65-alias-undefined.yaml": "undefined YAML alias",
    "67-alias-duplicate-anchor.yaml": "duplicate YAML anchor",
    "69-two-documents.yaml": "two YAML documents",
}

# Bad inputs that load and are valid as far as the schema can tell: their
# fault relates two fields, depends on the disk, or is in the YAML itself.
# The loader alone rejects them (tests/unit/cli/test_bad_inputs.py).
SEMANTIC_ONLY = {
    "10-duplicate-key.yaml": "YAML: safe_load keeps the last of two equal keys",
    "26-gpus-overlap.yaml": "two nodes on one host share a GPU",
    "40-identity-file-unreadable.yaml": "the key file is not readable (a directory)",
    "61-workload-script-not-found.yaml": "the script file does not exist",
    "66-alias-merge-key.yaml": "YAML: safe_load applies the << merge key the loader refuses",
    "83-workload-code-not-found.yaml": "the code directory does not exist",
    "84-workload-code-is-a-file.yaml": "the code directory is a file",
    "85-workload-code-root.yaml": "the code directory is the filesystem root (on this machine)",
}
SCHEMA_CHECKED = [name for name in CORPUS if name not in UNLOADABLE and name not in SEMANTIC_ONLY]

REGENERATE = ".venv/bin/python -m orchestrator schema > schema/cluster.schema.json"


def errors(doc) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message[:200]}"
            for e in VALIDATOR.iter_errors(doc)]


def load_text(text: str) -> None:
    """The loader's verdict on ``text`` (raises ConfigError)."""
    load_cluster_text(text, source="t.yaml", base_dir=ROOT)


# the schema itself ----------------------------------------------------------


def test_ddp_orch_schema_prints_the_checked_in_file_byte_for_byte():
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-m", "orchestrator", "schema"], cwd=ROOT, env=env,
                            capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode(errors="replace")
    with open(SCHEMA_FILE, "rb") as fh:
        checked_in = fh.read()
    assert result.stdout == checked_in, (
        f"schema/cluster.schema.json is out of date; regenerate it with `{REGENERATE}`")
    assert checked_in == (json.dumps(cluster_schema(), indent=2) + "\n").encode()


def test_the_schema_is_valid_draft_2020_12():
    schema = cluster_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["title"]
    jsonschema.Draft202012Validator.check_schema(schema)


def test_the_example_names_the_schema_on_its_first_line():
    with open(EXAMPLE, encoding="utf-8") as fh:
        first = fh.readline()
    assert first == "# yaml-language-server: $schema=./schema/cluster.schema.json\n"
    assert os.path.isfile(os.path.join(ROOT, "schema", "cluster.schema.json"))


def _levels(schema: dict) -> dict[str, dict]:
    defs = schema["$defs"]
    return {"top": schema, "master": defs["master"], "ssh": defs["ssh"], "node": defs["node"],
            "workload": defs["workload"]}


def test_every_mapping_level_is_closed_and_every_property_described():
    schema = cluster_schema()
    for level, sub in _levels(schema).items():
        assert sub["type"] == "object" and sub["additionalProperties"] is False, level
        for key, prop in sub["properties"].items():
            target = prop
            if "$ref" in prop:
                target = schema["$defs"][prop["$ref"].rsplit("/", 1)[-1]]
            assert target.get("description"), f"{level}.{key} has no description"


def _loader_allowed_keys(text: str) -> list[str]:
    """The keys the loader allows at one level, read off its unknown-key hint."""
    with pytest.raises(ConfigError) as info:
        load_text(text)
    hint = info.value.hint
    assert "unknown key 'zzzzzzzz'" in str(info.value) and hint.startswith("allowed keys: "), hint
    return hint[len("allowed keys: "):].split(", ")


NODE = "nodes:\n  - host: a\n    gpus: 0\n"
WORKLOAD = "workload: {name: linear}\n"


def test_property_names_per_level_equal_the_loaders_keys():
    levels = {level: list(sub["properties"]) for level, sub in _levels(cluster_schema()).items()}
    assert levels["top"] == list(loader.TOP_KEYS)
    assert levels["node"] == list(loader.NODE_KEYS)
    assert levels["ssh"] == list(loader.SSH_KEYS)
    assert levels["master"] == list(MASTER_KEYS)
    assert levels["workload"] == list(WORKLOAD_KEYS)
    # the loader's own lists, as its error hints give them (master and workload
    # have no constants; ssh also reads `password`, only to refuse it)
    seen = {
        "top": _loader_allowed_keys("zzzzzzzz: 1\n" + NODE + WORKLOAD),
        "master": _loader_allowed_keys("master: {zzzzzzzz: 1}\n" + NODE + WORKLOAD),
        "ssh": _loader_allowed_keys("ssh: {zzzzzzzz: 1}\n" + NODE + WORKLOAD),
        "node": _loader_allowed_keys("nodes:\n  - {host: a, gpus: 0, zzzzzzzz: 1}\n" + WORKLOAD),
        "workload": _loader_allowed_keys(NODE + "workload: {name: linear, zzzzzzzz: 1}\n"),
    }
    assert seen.pop("ssh") == levels.pop("ssh") + ["password"]
    assert seen == levels


def test_enums_come_from_spec_catalog_and_the_loader():
    schema = cluster_schema()
    top = schema["properties"]
    assert top["backend"]["enum"] == list(BACKENDS)
    assert schema["$defs"]["workload"]["properties"]["name"]["enum"] == list(CATALOG)
    for field, enum in (("device", top["device"]["enum"]), ("backend", top["backend"]["enum"])):
        with pytest.raises(ConfigError) as info:
            load_text(f"{field}: zzzzzzzz\n" + NODE + WORKLOAD)
        assert str(info.value).endswith("'zzzzzzzz' is not one of " + ", ".join(enum)), info.value


def test_the_gpu_index_regex_is_exactly_0_to_max():
    for top in (0, 1, 7, 9, 10, 19, 99, 100, 1010, loader.MAX_GPU_INDEX):
        rx = re.compile(index_regex(top))
        assert [n for n in range(top * 2 + 20) if rx.fullmatch(str(n))] == list(range(top + 1))
        assert rx.fullmatch("00" + str(top)) and not rx.fullmatch("")
    assert re.search(GPU_STRING_PATTERN, " 3, 4 ,5 ") and re.search(GPU_ITEM_PATTERN, "007")
    for bad in ("", "3,,4", "1024", "-1", "a", "²", "1.5", "3,"):
        assert not re.search(GPU_STRING_PATTERN, bad), bad


# good files -------------------------------------------------------------------

GOOD = {
    "procs-nodes": """
        nodes:
          - {host: localhost, procs: 2}
          - {host: localhost, procs: 1024}
        workload: {name: noop}
        """,
    "gpus-list-and-string": """
        nodes:
          - host: 192.168.1.100
            gpus: [0, 1, 1023]
          - host: gpu-box
            gpus: " 3, 4,5"
          - host: "::1"
            gpus: 7
          - host: other-box
            gpus: ["0", "02"]
        workload: {name: linear}
        """,
    "script-workload-with-args": """
        name: my.run_1
        nodes:
          - {host: localhost, procs: 1}
        workload:
          script: tests/conftest.py
          args: {epochs: 2, lr: 0.5, amp: true, note: hi, layers: [1, 2], dry: null}
        """,
    "backend-local": """
        backend: local
        device: cpu
        nodes:
          - {host: localhost, gpus: "0,1"}
        workload: {name: toy, args: {dataset: blobs}}
        """,
    "backend-ssh-per-node-ssh-and-env": """
        name: 2024
        backend: ssh
        python: /opt/conda/bin/python
        workdir: /scratch/ddp
        ssh: {user: ubuntu, port: 2222, strict_host_keys: accept-new, connect_timeout: 600}
        env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: 4, NCCL_P2P_DISABLE: true, EMPTY: ""}
        nodes:
          - host: a
            gpus: 0
            ssh: {user: root, port: 22, strict_host_keys: yes,
                  identity_file: @ROOT@/pyproject.toml}
            env: {NCCL_DEBUG: INFO}
            python: python3
          - host: b
            procs: 1
        workload: {name: mnist, args: {epochs: 1, amp: bf16}}
        """,
    "master-port-auto": """
        master: {addr: 10.0.0.1, port: auto}
        workdir: "~"
        device: auto
        nodes:
          - {host: localhost, gpus: 0}
          - {host: b, gpus: 0}
        workload: {name: resnet}
        """,
    "master-port-number": """
        master: {port: 65535}
        nodes: [{host: a, gpus: 0}]
        workload: {name: mlp}
        """,
    "project-module-with-list-args": """
        nodes: [{host: a, procs: 2}]
        workload:
          code: tests/programs/project
          module: proj.train
          args: [50, 10, --config, configs/x.yaml, -v, -v, --lr=0.10, true, "a b"]
        """,
    "project-script-under-code": """
        nodes: [{host: a, procs: 2}]
        workload: {code: tests/programs/project, script: scripts/train.py, args: {x: 1}}
        """,
}


@pytest.mark.parametrize("name", sorted(GOOD))
def test_good_files_pass_schema_and_loader(name):
    text = textwrap.dedent(GOOD[name]).replace("@ROOT@", ROOT)  # a readable "key" file
    load_text(text)  # a good file is good for the loader first
    assert errors(yaml.safe_load(text)) == []


def test_the_example_passes_the_schema():
    with open(EXAMPLE, encoding="utf-8") as fh:
        assert errors(yaml.safe_load(fh)) == []


# boundaries: the schema and the loader agree value by value -------------------------

AGREEMENT = [
    # (one changed line or key, both accept?)
    ("nodes: [{host: a, procs: 1}]", True), ("nodes: [{host: a, procs: 0}]", False),
    ("nodes: [{host: a, procs: 1024}]", True), ("nodes: [{host: a, procs: 1025}]", False),
    ("nodes: [{host: a, procs: '2'}]", False), ("nodes: [{host: a, procs: true}]", False),
    ("nodes: [{host: a, gpus: 1023}]", True), ("nodes: [{host: a, gpus: 1024}]", False),
    ("nodes: [{host: a, gpus: '0,1023'}]", True), ("nodes: [{host: a, gpus: '0,1024'}]", False),
    ("nodes: [{host: a, gpus: [1024]}]", False), ("nodes: [{host: a, gpus: [' 1']}]", False),
    ("nodes: [{host: a, gpus: null}]", False), ("nodes: [{host: a}]", False),
    ("nodes: [{host: 'a b', gpus: 0}]", False), ("nodes: [{host: 5, gpus: 0}]", False),
    ("nodes: {host: a, gpus: 0}", False),
    ("master: {port: 1}", True), ("master: {port: 0}", False), ("master: {port: AUTO}", False),
    ("master: {addr: ''}", False), ("master: {addr: host.example}", True),
    ("ssh: {port: 65535}", True), ("ssh: {port: 65536}", False),
    ("ssh: {connect_timeout: 1}", True), ("ssh: {connect_timeout: 601}", False),
    ("ssh: {strict_host_keys: 'yes'}", True), ("ssh: {strict_host_keys: true}", True),
    ("ssh: {strict_host_keys: accept-new}", True), ("ssh: {strict_host_keys: 'no'}", False),
    ("ssh: {user: '  '}", False), ("ssh: {identity_file: ~}", False),
    ("ssh: {identity_file: ~/nonexistent-key}", False),  # unreadable: loader only
    ("python: ''", False), ("python: [a]", False),
    ("workdir: /", True), ("workdir: ~/x", True), ("workdir: ~x", False), ("workdir: x/", False),
    ("env: {A_1: 1.5}", True), ("env: {_X: false}", True), ("env: {1X: a}", False),
    ("env: {X: null}", False), ("env: {X: [1]}", False), ("env: {WORLD_SIZE: '2'}", False),
    ("env: {DDP_ORCH_: a}", False), ("env: {DDP_ORCHESTRA: a}", True),
    ("name: a" + "b" * 63, True), ("name: a" + "b" * 64, False), ("name: -x", False),
    ("name: 7", True), ("name: true", False), ("name: x y", False),
    ("device: cuda", True), ("device: CPU", False), ("backend: slurm", True),
    ("backend: pbs", False), ("slurm: {partition: gpu, time: '04:00:00', extra: ['--exclusive']}", True),
    ("slurm: {extra: [exclusive]}", False), ("slurm: {extra: ['--nodes=3']}", False),
    ("slurm: {extra: ['--mem=0 --x']}", False), ("slurm: {partiton: gpu}", False),
    ("slurm: {time: 90}", True), ("slurm: {time: four hours}", False),
    ("nodes: {count: 2, procs: 1}", True), ("nodes: {count: 0, procs: 1}", False),
    ("nodes: {count: 2}", False), ("nodes: {count: 2, gpus: 8}", True),
    ("workload: {name: linear, args: {epochs: 3}}", True),
    ("workload: {script: tests/conftest.py, args: {x: {y: 1}}}", False),
    ("workload: {script: tests/conftest.py, args: {x: [[1]]}}", False),
    ("workload: {script: ' '}", False), ("workload: {name: 3}", False),
    ("workload: {}", False), ("workload: linear", False),
    ("workload: {module: tests.conftest, args: []}", True),
    ("workload: {module: tests.conftest, args: [a, 1, 0.5, false]}", True),
    ("workload: {module: tests.conftest, args: [a, null]}", False),
    ("workload: {module: tests.conftest, args: [[a]]}", False),
    ("workload: {module: tests.conftest, args: '--x'}", False),
    ("workload: {module: tests/conftest.py}", False), ("workload: {module: 'a..b'}", False),
    ("workload: {module: 1x}", False), ("workload: {module: _x.y_1}", True),
    ("workload: {module: tests.conftest, code: tests}", True),
    ("workload: {module: tests.conftest, code: ' '}", False),
    ("workload: {module: tests.conftest, script: tests/conftest.py}", False),
    ("workload: {name: linear, code: tests}", False),
    ("workload: {name: linear, args: [--epochs, 2]}", False),
    ("workload: {name: linear, args: []}", False),
]


def _agreement_doc(line: str) -> str:
    key = line.split(":", 1)[0]
    base = {"nodes": "nodes: [{host: a, gpus: 0}]", "workload": "workload: {name: linear}"}
    base[key] = line
    return "\n".join(base.values()) + "\n"


def assert_schema_agrees_with_the_loader(text: str, ok: bool, what: str,
                                         on_disk: bool = False) -> None:
    """Both accept ``text``, or both refuse it; what the loader refuses for
    what is on disk (``on_disk``) the schema cannot know."""
    found = errors(yaml.safe_load(text))
    if ok:
        load_text(text)
        assert found == []
    else:
        with pytest.raises(ConfigError):
            load_text(text)
        assert found or on_disk, f"the schema accepts {what}; the loader does not"


@pytest.mark.parametrize("line, ok", AGREEMENT, ids=[line for line, _ in AGREEMENT])
def test_schema_and_loader_agree_at_the_edges(line, ok):
    assert_schema_agrees_with_the_loader(_agreement_doc(line), ok, repr(line),
                                         on_disk="nonexistent-key" in line)


# the bad-input corpus ------------------------------------------------------------


def test_the_classified_corpus_files_exist():
    assert len(CORPUS) >= 69
    listed = set(UNLOADABLE) | set(SEMANTIC_ONLY)
    assert not set(UNLOADABLE) & set(SEMANTIC_ONLY)
    missing = sorted(listed - set(CORPUS))
    assert not missing, f"listed in test_schema.py but not in tests/bad_inputs: {missing}"
    assert len(SCHEMA_CHECKED) >= 45


@pytest.mark.parametrize("name", sorted(UNLOADABLE))
def test_unloadable_corpus_files_do_not_load(name):
    with open(os.path.join(CORPUS_DIR, name), encoding="utf-8") as fh:
        with pytest.raises((yaml.YAMLError, ValueError)):
            yaml.safe_load(fh)


@pytest.mark.parametrize("name", sorted(SEMANTIC_ONLY))
def test_semantic_only_corpus_files_pass_the_schema(name):
    # if one starts failing, the schema learnt to catch it: move it to SCHEMA_CHECKED
    with open(os.path.join(CORPUS_DIR, name), encoding="utf-8") as fh:
        assert errors(yaml.safe_load(fh)) == [], f"{name}: {SEMANTIC_ONLY[name]}"


def _loader_path(name: str) -> list:
    """The file's ``# expect-path:`` as JSON path parts: nodes[1].gpus → [nodes, 1, gpus]."""
    with open(os.path.join(CORPUS_DIR, name), encoding="utf-8") as fh:
        path = next(line for line in fh if line.startswith("# expect-path:")).split(":", 1)[1]
    path = path.strip()
    if path == "(none)":
        return []
    return [int(part[1:-1]) if part.startswith("[") else part
            for part in re.findall(r"\[\d+\]|[^.\[\]]+", path)]


@pytest.mark.parametrize("name", SCHEMA_CHECKED)
def test_schema_rejects_the_bad_input_where_the_loader_does(name):
    with open(os.path.join(CORPUS_DIR, name), encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    found = list(VALIDATOR.iter_errors(doc))
    assert found, f"{name} passes the schema but the loader rejects it"
    # at the loader's field, or at the mapping holding it (an unknown key, a
    # missing one, a reserved env name is the mapping's error in a schema)
    want = _loader_path(name)
    paths = [list(error.absolute_path) for error in found]
    assert any(want[:len(path)] == path for path in paths), (want, errors(doc))


# rules the schema learnt: each is in it, and agrees with the loader ------------------

CROSS = [  # (file, both accept?)
    ("device: cuda\nnodes: [{host: a, procs: 2}]", False),
    ("device: cuda\nnodes: [{host: a, gpus: 0}, {host: b, procs: 1}]", False),
    ("device: cuda\nnodes: {count: 2, procs: 1}", False),
    ("device: cuda\nnodes: [{host: a, gpus: 0}]", True),
    ("device: cpu\nnodes: [{host: a, procs: 2}]", True),
    ("backend: local\nnodes: [{host: localhost, procs: 1}, {host: b, procs: 1}]\n"
     "master: {addr: 10.0.0.1}", False),
    ("backend: local\nnodes: [{host: localhost, procs: 1}]", True),
    ("backend: ssh\nnodes: {count: 2, procs: 1}", False),
    ("backend: ssh\nslurm: {partition: gpu}\nnodes: [{host: a, procs: 1}]", False),
    ("backend: slurm\nnodes: [{host: localhost, procs: 1}]", False),
    ("backend: slurm\nnodes: [{host: a, procs: 1, python: /x/python}]", False),
    ("backend: slurm\nnodes: [{host: a, procs: 1, ssh: {port: 22}}]", False),
    ("slurm: {partition: gpu}\nssh: {port: 22}\nnodes: [{host: a, procs: 1}]", False),
    ("nodes: {count: 2, procs: 1}\nssh: {port: 22}", False),
    ("backend: slurm\nnodes: [{host: a, procs: 1}, {host: b, gpus: 0}]", True),
    ("slurm: {partition: gpu}\nnodes: {count: 2, gpus: 8}", True),
    ("workdir: /x\nnodes: [{host: localhost, procs: 1}]", False),
    ("workdir: /x\nbackend: ssh\nnodes: [{host: localhost, procs: 1}, {host: localhost, "
     "procs: 1}]", False),
    ("workdir: /x\nnodes: {count: 2, procs: 1}", False),
    ("workdir: /x\nnodes: [{host: a, procs: 1}]", True),
    ("workdir: /x\nmaster: {addr: 10.0.0.1}\nnodes: [{host: localhost, procs: 1}, "
     "{host: b, procs: 1}]", True),
    ("nodes: [{host: localhost, procs: 1}, {host: b, procs: 1}]", False),
    ("master: {port: 29500}\nnodes: [{host: localhost, procs: 1}, {host: b, procs: 1}]", False),
    ("master: {addr: 10.0.0.1}\nnodes: [{host: localhost, procs: 1}, {host: b, procs: 1}]",
     True),
    ("nodes: [{host: b, procs: 1}, {host: localhost, procs: 1}]", True),
    ("nodes: [{host: a, gpus: '0, 1, 1'}]", False),
    ("nodes: [{host: a, gpus: '1,01'}]", False),
    ("nodes: [{host: a, gpus: '1,10,100'}]", True),
]


@pytest.mark.parametrize("text, ok", CROSS, ids=[text for text, _ in CROSS])
def test_rules_between_fields_are_in_the_schema(text, ok):
    text += "\nworkload: {name: linear}\n"
    assert_schema_agrees_with_the_loader(text, ok, repr(text))


def _gpu_strings():
    """GPU strings of 1-3 entries from indices with and without leading zeros."""
    entries = ["0", "1", "01", "10", "00", "100", "010", "2"]
    for a in entries:
        yield a
        for b in entries:
            yield f"{a},{b}"
            yield f" {a} , {b} "
            for c in entries:
                yield f"{a},{b},{c}"


def test_the_duplicate_gpu_pattern_is_exactly_the_loaders_duplicate():
    seen = {True: 0, False: 0}
    for text in _gpu_strings():
        try:
            loader.parse_gpus(text)
            duplicate = False
        except ValueError as exc:
            assert "duplicate GPU" in exc.args[0], text
            duplicate = True
        assert bool(re.search(GPU_DUPLICATE_PATTERN, text)) is duplicate, text
        seen[duplicate] += 1
    assert seen[True] > 100 and seen[False] > 100, seen


def _arg_cases():
    """(workload, args line, both accept?) for every argument of every built-in."""
    wrong = {bool: "'yes'", int: "2.5", float: "fast", str: "true"}
    for name, info in CATALOG.items():
        for arg in info.args:
            good = arg.choices[-1] if arg.choices else \
                {bool: "false", int: "3", float: "0.5", str: "x"}[arg.type]
            yield name, f"{arg.name}: {good}", True
            yield name, f"{arg.name.replace('_', '-')}: {good}", True
            yield name, f"{arg.name}: {wrong[arg.type]}", False
            yield name, f"{arg.name}: null", False
            if arg.choices:
                yield name, f"{arg.name}: not-a-choice", False
            if arg.minimum is not None:
                yield name, f"{arg.name}: {arg.minimum - 1}", False
        yield name, "no_such_argument: 1", False


ARG_CASES = list(_arg_cases())


@pytest.mark.parametrize("name, line, ok", ARG_CASES,
                         ids=[f"{n}-{line}" for n, line, _ in ARG_CASES])
def test_each_builtin_argument_is_in_the_schema(name, line, ok):
    text = f"nodes: [{{host: a, gpus: 0}}]\nworkload: {{name: {name}, args: {{{line}}}}}\n"
    assert_schema_agrees_with_the_loader(text, ok, f"{line!r} for {name}")


# LEFT_TO_THE_LOADER, in its order: a file for each that the loader refuses
# and the schema passes (docs/cluster-file.md lists them).
LEFT_EXAMPLES = [
    "nodes: [{host: a, procs: 1}]\nnodes: [{host: b, procs: 1}]\nworkload: {name: linear}\n",
    "nodes: [{host: a, procs: 2.0}]\nworkload: {name: linear, args: {epochs: 2.0}}\n",
    "slurm: {time: 12:00:00}\nnodes: {count: 1, procs: 1}\nworkload: {name: linear}\n",
    "nodes: [{host: a, gpus: [1, '01']}]\nworkload: {name: linear}\n",
    "nodes: [{host: a, gpus: 0}, {host: a, gpus: '0,1'}]\nworkload: {name: linear}\n",
    "backend: slurm\nnodes: [{host: a, procs: 1}, {host: a, procs: 1}]\n"
    "workload: {name: linear}\n",
    "nodes: [{host: a, gpus: 0}, {host: a, gpus: 'free:2'}]\nworkload: {name: linear}\n",
    "gpu_policy: {exclude: ['b:1']}\nnodes: [{host: a, gpus: 0}]\nworkload: {name: linear}\n",
    "nodes: [{host: a, procs: 1}]\nworkload: {script: no-such-script.py}\n",
]


def test_what_the_schema_leaves_to_the_loader_is_listed_with_an_example():
    assert len(LEFT_EXAMPLES) == len(LEFT_TO_THE_LOADER)
    for text in LEFT_EXAMPLES:
        with pytest.raises(ConfigError):
            load_text(text)
        assert errors(yaml.safe_load(text)) == [], text
