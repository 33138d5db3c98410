"""Cluster-file validation: every error names the field path and the line."""

from __future__ import annotations

import textwrap

import pytest

from orchestrator.errors import ConfigError
from orchestrator.config.loader import load_cluster_file, load_cluster_text

BASE = """\
nodes:
  - host: a
    gpus: 0,1
workload:
  name: linear
"""


def load(text: str, base_dir: str = "."):
    return load_cluster_text(textwrap.dedent(text), source="c.yaml", base_dir=base_dir)


def error_of(text: str, base_dir: str = ".") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text, base_dir)
    return info.value


def test_example_file_loads():
    spec = load_cluster_file("cluster.yaml.example")
    assert [n.gpus for n in spec.nodes] == [(3, 4, 5), (0, 1, 2, 3)]
    assert spec.world_size == 7
    assert spec.master_addr == "192.168.1.100" and spec.master_port == 29500
    assert spec.nodes[0].ssh.user == "ubuntu" and spec.nodes[0].env == {"NCCL_DEBUG": "WARN"}
    assert spec.workload.name == "linear" and spec.workload.args == {"epochs": 10}


def test_defaults():
    spec = load(BASE)
    assert spec.master_addr is None and spec.master_port == "auto"
    assert spec.device == "auto" and spec.workdir == "~/.ddp-orch"
    assert spec.nodes[0].python == "python3" and spec.name == "linear"


def test_gpu_forms_keep_user_order():
    spec = load("""\
        nodes:
          - {host: a, gpus: "5, 3,4"}
          - {host: b, gpus: [2, 0]}
          - {host: c, gpus: 7}
        workload: {name: linear}
        """)
    assert [n.gpus for n in spec.nodes] == [(5, 3, 4), (2, 0), (7,)]


def test_per_node_overrides_merge():
    spec = load("""\
        ssh: {user: u, port: 2222}
        env: {A: "1", B: x}
        python: /usr/bin/python3
        nodes:
          - host: a
            procs: 2
            ssh: {port: 22}
            env: {B: y, C: 3}
            python: /opt/py
          - host: b
            procs: 1
        workload: {name: linear}
        device: cpu
        """)
    a, b = spec.nodes
    assert (a.ssh.user, a.ssh.port, b.ssh.port) == ("u", 22, 2222)
    assert a.env == {"A": "1", "B": "y", "C": "3"} and b.env == {"A": "1", "B": "x"}
    assert (a.python, b.python) == ("/opt/py", "/usr/bin/python3")


@pytest.mark.parametrize("text, line, path, words", [
    ("nodes:\n  - host: a\n    gpus: 2,2\nworkload: {name: linear}\n", 3, "nodes[0].gpus",
     'duplicate GPU 2 in "2,2"'.replace('"', "'")),
    ("nodes:\n  - host: a\n    gpus: 3,,4\nworkload: {name: linear}\n", 3, "nodes[0].gpus",
     "an empty entry"),
    ("nodes:\n  - host: a\n    gpus: [-1]\nworkload: {name: linear}\n", 3, "nodes[0].gpus",
     "out of range"),
    ("nodes:\n  - host: a\n    gpus: a\nworkload: {name: linear}\n", 3, "nodes[0].gpus",
     "'a' in 'a' is not a GPU index"),
    ("nodes:\n  - host: a\n    gpu: 0\nworkload: {name: linear}\n", 3, "nodes[0].gpu",
     "did you mean 'gpus'?"),
    ("nodes:\n  - host: a\n    gpus: 0\n    procs: 2\nworkload: {name: linear}\n", 2, "nodes[0]",
     "exactly one of 'gpus' or 'procs'"),
    ("nodes:\n  - host: a\nworkload: {name: linear}\n", 2, "nodes[0]",
     "exactly one of 'gpus' or 'procs'"),
    ("nodes: []\nworkload: {name: linear}\n", 1, "nodes", "no nodes"),
    ("master: {port: 70000}\n" + BASE, 1, "master.port", "out of range 1-65535"),
    ("master: {port: 0}\n" + BASE, 1, "master.port", "out of range"),
    ("ssh: {port: x}\n" + BASE, 1, "ssh.port", "expected a whole number"),
    ("nodes:\n  - {host: a, gpus: '0,1'}\n  - {host: a, gpus: [1, 2]}\nworkload: {name: linear}\n",
     3, "nodes[1].gpus", "GPU 1 of a is already used by nodes[0]"),
    ("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linaer}\n", 3, "workload.name",
     "did you mean 'linear'?"),
    ("nodes:\n  - {host: a, gpus: 0}\nworkload: {script: nope.py}\n", 3, "workload.script",
     "not found"),
    ("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear, args: {epoch: 2}}\n", 3,
     "workload.args.epoch", "did you mean 'epochs'?"),
    ("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear, args: {epochs: many}}\n", 3,
     "workload.args.epochs", "expected int"),
    ("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: mnist, args: {amp: on}}\n", 3,
     "workload.args.amp", "quote the word"),
    ("nodes:\n  - {host: a, gpus: 0}\n", 1, "", "missing 'workload'"),
    ("devcie: cpu\n" + BASE, 1, "devcie", "did you mean 'device'?"),
    ("device: gpu\n" + BASE, 1, "device", "'gpu' is not one of auto, cuda, cpu"),
    ("env: {CUDA_VISIBLE_DEVICES: '0'}\n" + BASE, 1, "env.CUDA_VISIBLE_DEVICES", "gpus"),
    ("workdir: runs\n" + BASE, 1, "workdir", "relative path"),
    ("nodes:\n  - host: a\n    gpus: [0\n", 4, "", "YAML syntax error"),
    ("nodes:\n  - {host: a, gpus: 99999999999999999999}\nworkload: {name: linear}\n", 2,
     "nodes[0].gpus", "out of range"),
    ("nodes:\n  - {host: a, procs: 0}\nworkload: {name: linear}\n", 2, "nodes[0].procs",
     "out of range 1-1024"),
    ("ssh: {strict_host_keys: no}\n" + BASE, 1, "ssh.strict_host_keys", "accept-new"),
    ("ssh: {identity_file: /nonexistent/key}\n" + BASE, 1, "ssh.identity_file", "cannot read"),
    ("ssh: {password: hunter2}\n" + BASE, 1, "ssh.password", "passwords are not accepted"),
    ("device: cuda\nnodes:\n  - {host: a, procs: 2}\nworkload: {name: linear}\n", 1, "device",
     "cannot join a CUDA job"),
    ("master: {port: 29500}\nnodes:\n  - {host: localhost, procs: 1}\n  - {host: b, procs: 1}\n"
     "workload: {name: linear}\n", 3, "nodes", "set master.addr"),
])
def test_rejections_name_field_and_line(text, line, path, words):
    err = error_of(text)
    assert err.line == line, str(err)
    assert err.path == path, str(err)
    assert words in str(err)
    assert str(err).startswith(f"c.yaml:{line}: ")


def test_empty_file():
    err = error_of("")
    assert "empty" in str(err) and err.line == 1


def test_message_format_matches_the_issue():
    err = error_of("nodes:\n  - host: a\n    gpus: 0\n  - host: b\n    gpus: 2,2\n"
                   "workload: {name: linear}\n")
    assert str(err) == "c.yaml:5: nodes[1].gpus: duplicate GPU 2 in '2,2'"


@pytest.mark.parametrize("node, meant, keys", [
    ("{host: localhost, gpus: 0,1}", "0,1", "a key '1'"),
    ("{host: b, gpus: 2,3,4, python: python3}", "2,3,4", "a key '3' and a key '4'"),
])
def test_a_gpu_list_split_by_a_flow_mapping_says_to_quote_it(node, meant, keys):
    err = error_of(f"nodes:\n  - {{host: a, gpus: 5}}\n  - {node}\nworkload: {{name: linear}}\n")
    assert str(err) == (
        f"c.yaml:3: nodes[1].gpus: 'gpus: {meant}' was split at its commas: inside {{...}} "
        f"a comma ends the value, so YAML read gpus: {meant.split(',')[0]} and {keys}\n"
        f'  hint: quote the list: gpus: "{meant}"')


def test_an_unknown_digit_key_with_a_value_is_only_an_unknown_key():
    err = error_of("nodes:\n  - {host: a, gpus: 0, 1: x}\nworkload: {name: linear}\n")
    assert err.path == "nodes[0].1" and "unknown key '1'" in str(err)


def test_script_path_is_relative_to_the_file(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = load("nodes:\n  - {host: a, gpus: 0}\nworkload: {script: train.py}\n",
                base_dir=str(tmp_path))
    assert spec.workload.script == str(tmp_path / "train.py")
    assert spec.name == "train"


def test_missing_file_is_a_config_error():
    with pytest.raises(ConfigError, match="no such file"):
        load_cluster_file("/nonexistent/cluster.yaml")


@pytest.mark.parametrize("word", ["off", "Off", "OFF", "'off'"])
def test_a_choice_yaml_reads_as_a_boolean_is_the_word_written(word):
    """``amp: off`` is false to YAML 1.1; mnist's ``--amp`` takes the word off."""
    spec = load(f"nodes:\n  - {{host: a, gpus: 0}}\nworkload: {{name: mnist, args: {{amp: {word}}}}}\n")
    assert spec.workload.args == {"amp": "off"}


# --- your own project: workload.code, module, list args ----------------------------

NODES = "nodes:\n  - {host: a, procs: 2}\n"


def test_code_module_and_a_list_of_arguments_verbatim(project):
    spec = load(NODES + "workload:\n  code: .\n  module: proj.train\n"
                "  args: [configs/x.yaml, --lr=0.1, -v, -v, 50, 0.10, 1e3, yes, '', \"a b\"]\n",
                base_dir=str(project))
    workload = spec.workload
    assert (workload.name, workload.script, workload.module) == (None, None, "proj.train")
    assert workload.code == str(project) and spec.base_dir == str(project)
    # each item as written: YAML's numbers and booleans are not re-spelt
    assert workload.args == ("configs/x.yaml", "--lr=0.1", "-v", "-v", "50", "0.10", "1e3",
                             "yes", "", "a b")
    assert spec.name == "proj.train"


def test_the_code_defaults_to_the_scripts_directory_else_the_files(project):
    spec = load(NODES + "workload: {script: scripts/train.py}\n", base_dir=str(project))
    assert spec.workload.code == str(project / "scripts")
    spec = load(NODES + "workload: {module: proj.train}\n", base_dir=str(project))
    assert spec.workload.code == str(project)
    spec = load(NODES + "workload: {code: scripts/.., script: scripts/train.py}\n",
                base_dir=str(project))
    assert spec.workload.code == str(project)
    assert spec.workload.script == str(project / "scripts" / "train.py")


@pytest.mark.parametrize("workload, path, words, hint", [
    ("{script: scripts/train.py, module: proj.train}", "workload",
     "'script' and 'module' are both given", "python -m pkg.train"),
    ("{name: linear, module: proj.train}", "workload", "'name' and 'module' are both given",
     "built-in workloads"),
    ("{name: linear, script: scripts/train.py}", "workload", "'name' and 'script' are both",
     "built-in workloads"),
    ("{code: .}", "workload", "give exactly one of 'name'", "built-in workloads"),
    ("{name: linear, code: .}", "workload.code", "'code' goes with 'script' or 'module'",
     "remove code:"),
    ("{name: linear, args: [--epochs, 2]}", "workload.args",
     "a built-in workload takes its args as a mapping", "args: {epochs: 10}"),
    ("{code: nowhere, module: proj.train}", "workload.code",
     "code directory 'nowhere' not found", "relative to the cluster file"),
    ("{code: configs/x.yaml, module: proj.train}", "workload.code", "is not a directory", ""),
    ("{code: /, module: proj.train}", "workload.code", "is the filesystem root",
     "your project's own directory"),
    ("{code: ., script: train.py}", "workload.script", "script 'train.py' not found",
     "relative to the code directory"),
    ("{code: proj, script: ../scripts/train.py}", "workload.script",
     "is outside the code directory", "put the script in it"),
    ("{module: proj/train.py}", "workload.module", "'proj/train.py' is not a module name",
     "pkg.train for pkg/train.py"),
    ("{module: 'proj.'}", "workload.module", "is not a module name", ""),
    ("{module: proj.train, args: [a, {b: c}]}", "workload.args[1]",
     "expected one argument (a string), got a mapping", "each item is one argument"),
    ("{module: proj.train, args: [a, [b]]}", "workload.args[1]", "got a list", ""),
    ("{module: proj.train, args: [a, null]}", "workload.args[1]", "got nothing (null)",
     'quote one'),
    ("{module: proj.train, args: '--lr 0.1'}", "workload.args",
     "expected a mapping or a list, got str", "args: [configs/x.yaml"),
])
def test_project_workloads_refused_with_field_and_hint(project, workload, path, words, hint):
    err = error_of(NODES + f"workload: {workload}\n", base_dir=str(project))
    assert err.path == path, str(err)
    assert words in err.message, str(err)
    assert hint in err.hint, str(err)
    assert err.line == 3 or path.startswith("workload.args["), str(err)


@pytest.mark.parametrize("code, base, words", [
    ("'~'", "", "is your home directory"),
    ("..", "home/me/proj", "is your home directory"),
    ("home", "", "contains your home directory"),
])
def test_a_code_directory_that_is_or_holds_home_is_refused(tmp_path, monkeypatch, code, base,
                                                           words):
    home = tmp_path / "home" / "me"
    (home / "proj").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    err = error_of(NODES + f"workload: {{code: {code}, module: proj.train}}\n",
                   base_dir=str(tmp_path / base))
    assert err.path == "workload.code" and err.line == 3
    assert words in err.message and "uploaded to every node" in err.message


def test_a_default_code_directory_that_is_home_is_refused_at_its_field(tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text("")
    monkeypatch.setenv("HOME", str(tmp_path))
    err = error_of(NODES + "workload:\n  script: train.py\n", base_dir=str(tmp_path))
    assert err.path == "workload.script" and err.line == 4
    assert "by default the script's directory" in err.message
    assert "is your home directory" in err.message and "workload.code" in err.hint


@pytest.mark.parametrize("hosts, gpus, line, path, words", [
    # nodes 0 and 2 share host a and GPU 1; node 1 (host b) lies between them
    (("a", "b", "a"), ("'0,1'", "'1,2'", "[1, 3]"), 4, "nodes[2].gpus",
     "GPU 1 of a is already used by nodes[0]"),
    # every node on host a: node 2 clashes with node 0 only (GPU 0), not with node 1
    (("a", "a", "a"), ("'0,1'", "'2,3'", "'4,0'"), 4, "nodes[2].gpus",
     "GPU 0 of a is already used by nodes[0]"),
    # node 3 clashes with node 1, two entries back
    (("a", "b", "c", "b"), ("0", "'5,6'", "0", "[7, 6]"), 5, "nodes[3].gpus",
     "GPU 6 of b is already used by nodes[1]"),
])
def test_a_gpu_shared_by_any_two_nodes_of_one_host_is_refused(hosts, gpus, line, path, words):
    nodes = "".join(f"  - {{host: {h}, gpus: {g}}}\n" for h, g in zip(hosts, gpus))
    err = error_of(f"nodes:\n{nodes}workload: {{name: linear}}\n")
    assert (err.line, err.path) == (line, path), str(err)
    assert words in str(err)


def test_one_host_listed_three_times_with_disjoint_gpus_loads():
    spec = load("""\
        nodes:
          - {host: a, gpus: '0,1'}
          - {host: b, gpus: '0,1'}
          - {host: a, gpus: '3,2'}
          - {host: a, gpus: 4}
        workload: {name: linear}
        """)
    assert [(n.host, n.gpus) for n in spec.nodes] == [
        ("a", (0, 1)), ("b", (0, 1)), ("a", (3, 2)), ("a", (4,))]
    assert spec.world_size == 7
