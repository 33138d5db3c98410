"""``config/loader.py`` field by field: the cases ``scripts/mutation``
found no test pinned (expected values and error places by hand)."""

from __future__ import annotations

import os
import textwrap

import pytest

from orchestrator.config.loader import load_cluster_file, load_cluster_text
from orchestrator.errors import ConfigError

BASE = "nodes:\n  - host: a\n    gpus: 0\nworkload: {name: linear}\n"


def load(text: str):
    return load_cluster_text(textwrap.dedent(text), source="c.yaml")


def error_of(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value


def test_a_file_is_read_with_its_own_directory_as_the_base(tmp_path):
    (tmp_path / "train.py").write_text("")
    path = tmp_path / "c.yaml"
    path.write_text("nodes: [{host: a, gpus: 0}]\nworkload: {script: train.py}\n")
    spec = load_cluster_file(str(path))
    assert spec.workload.script == str(tmp_path / "train.py")
    assert spec.workload.code == str(tmp_path)


def test_a_missing_file_and_a_directory_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        load_cluster_file(str(tmp_path / "none.yaml"))
    with pytest.raises(ConfigError) as info:
        load_cluster_file(str(tmp_path))
    assert "cannot read" in info.value.message


def test_a_byte_that_is_not_utf8_is_placed_at_its_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes("# é\nnodes:\n  - host: a\xe9b\n".encode("utf-8").replace("\xe9b".encode(), b"\xe9b"))
    with pytest.raises(ConfigError) as info:
        load_cluster_file(str(path))
    assert (info.value.source, info.value.line) == (str(path), 3)
    assert "0xe9" in info.value.message


def test_utf8_text_loads():
    assert load("# é ü\n" + BASE).nodes[0].host == "a"


@pytest.mark.parametrize("network,interface", [
    ("", "auto"), ("network: {}\n", "auto"), ("network: {interface: off}\n", "off"),
    ("network: {interface: auto}\n", "auto"), ("network: {interface: eth0.100}\n", "eth0.100"),
    ("network: {interface: 'br-1@x'}\n", "br-1@x"),
])
def test_the_network_interface(network, interface):
    assert load(BASE + network).interface == interface


@pytest.mark.parametrize("value", ["'eth 0'", "abcdefghijklmnop", "''"])
def test_a_bad_interface_name_is_refused_at_its_field(value):
    err = error_of(BASE + f"network: {{interface: {value}}}\n")
    assert (err.path, err.line) == ("network.interface", 5)


@pytest.mark.parametrize("value,expected", [("yes", "yes"), ("true", "yes"), ("accept-new", "accept-new")])
def test_strict_host_keys(value, expected):
    spec = load(BASE + f"ssh: {{strict_host_keys: {value}}}\n")
    assert spec.nodes[0].ssh.strict_host_keys == expected


@pytest.mark.parametrize("value", ["no", "false", "'Yes'", "1"])
def test_strict_host_keys_are_never_off(value):
    err = error_of(BASE + f"ssh: {{strict_host_keys: {value}}}\n")
    assert (err.path, err.line) == ("ssh.strict_host_keys", 5)


def test_the_identity_file_is_absolute_and_readable(tmp_path):
    key = tmp_path / "id"
    key.write_text("k")
    spec = load(BASE + f"ssh: {{identity_file: {key}}}\n")
    assert spec.nodes[0].ssh.identity_file == str(key)
    assert error_of(BASE + "ssh: {identity_file: id_ed25519}\n").path == "ssh.identity_file"
    assert error_of(BASE + f"ssh: {{identity_file: {tmp_path}/none}}\n").path == "ssh.identity_file"
    assert error_of(BASE + f"ssh: {{identity_file: {tmp_path}}}\n").path == "ssh.identity_file"


def test_an_identity_file_under_home_is_expanded(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "k").write_text("k")
    assert load(BASE + "ssh: {identity_file: ~/k}\n").nodes[0].ssh.identity_file == str(tmp_path / "k")


@pytest.mark.parametrize("host,expected", [
    ("fd77::10", "fd77::10"), ("'[fd77::10]'", "fd77::10"), ("'fe80::1%eth0'", "fe80::1%eth0"),
    ("'fe80::1%abcdefghijklmno'", "fe80::1%abcdefghijklmno"), ("10.0.0.1", "10.0.0.1"),
])
def test_ipv6_hosts(host, expected):
    assert load(f"nodes: [{{host: {host}, gpus: 0}}]\nworkload: {{name: linear}}\n").nodes[0].host == expected


@pytest.mark.parametrize("host", ["'[fd77::10'", "'10.0.0.1:22'", "'fe80::1%abcdefghijklmnop'",
                                  "'fe80::1%e th'", "'fe80::1%'", "'[fd77::10]x'"])
def test_a_host_that_is_not_an_address_is_refused(host):
    err = error_of(f"nodes: [{{host: {host}, gpus: 0}}]\nworkload: {{name: linear}}\n")
    assert err.path == "nodes[0].host"


SLURM = "backend: slurm\n"


@pytest.mark.parametrize("text,path", [
    (BASE + "master: {addr: a, bogus: 1}\n", "master.bogus"),
    (BASE + "network: {interface: eth0, bogus: 1}\n", "network.bogus"),
    (BASE + "ssh: {user: u, bogus: 1}\n", "ssh.bogus"),
    (SLURM + "nodes: {count: 1, gpus: 1, bogus: 1}\nworkload: {name: linear}\n", "nodes.bogus"),
])
def test_an_unknown_key_is_refused_where_it_is(text, path):
    assert error_of(text).path == path


@pytest.mark.parametrize("master,addr,port", [
    ("master: {addr: m}\n", "m", "auto"), ("master: {port: auto}\n", None, "auto"),
    ("master: {port: 29501}\n", None, 29501),
])
def test_the_master(master, addr, port):
    spec = load(BASE + master)
    assert (spec.master_addr, spec.master_port) == (addr, port)


@pytest.mark.parametrize("value", ["GPU", "gpus", "Nvidia", "cuda:0"])
def test_a_gpu_word_for_the_device_is_steered_to_cuda(value):
    err = error_of(BASE + f"device: '{value}'\n")
    assert err.path == "device" and "did you mean 'cuda'" in err.hint


@pytest.mark.parametrize("workdir,expected", [("'~'", "~"), ("/a/b/", "/a/b"), ("/", "/"),
                                              ("~/w", "~/w")])
def test_the_workdir(workdir, expected):
    assert load(BASE + f"workdir: {workdir}\n").workdir == expected


@pytest.mark.parametrize("name,expected", [("'12'", "12"), ("12", "12"), ("a.b-c_d", "a.b-c_d")])
def test_the_run_name(name, expected):
    assert load(BASE + f"name: {name}\n").name == expected


@pytest.mark.parametrize("name", ["true", "~", "'a b'"])
def test_a_run_name_that_is_not_one(name):
    assert error_of(BASE + f"name: {name}\n").path == "name"


def test_slurm_placed_nodes():
    spec = load(SLURM + "python: /opt/py\nenv: {A: '1'}\nnodes: {count: 2, gpus: 1024}\n"
                "workload: {name: linear}\n")
    assert [n.host for n in spec.nodes] == ["<slurm node 0>", "<slurm node 1>"]
    assert [(n.gpu_count, n.gpus, n.procs, n.python, n.line) for n in spec.nodes] == [
        (1024, None, None, "/opt/py", 4)] * 2
    assert spec.nodes[0].env["A"] == "1" and spec.nodes[0].ssh.user is None
    cpu = load(SLURM + "nodes: {count: 1, procs: 3}\nworkload: {name: linear}\n").nodes[0]
    assert (cpu.python, cpu.procs, cpu.gpu_count) == ("python3", 3, None)
    assert error_of(SLURM + "nodes: {count: 1, gpus: 1025}\nworkload: {name: linear}\n").path == "nodes.gpus"


def test_at_most_100_setup_commands_and_100_outputs():
    assert len(load(BASE + "setup: [" + ", ".join(["x"] * 100) + "]\n").setup) == 100
    assert error_of(BASE + "setup: [" + ", ".join(["x"] * 101) + "]\n").path == "setup"
    assert len(load(BASE + "outputs: [" + ", ".join(["o"] * 100) + "]\n").outputs) == 100
    assert error_of(BASE + "outputs: [" + ", ".join(["o"] * 101) + "]\n").path == "outputs"


def test_a_setup_argv_needs_a_first_word_and_no_nul():
    assert load(BASE + "setup: [[a, '']]\n").setup == (("a", ""),)
    assert error_of(BASE + "setup: [['', a]]\n").path == "setup[0]"
    assert error_of(BASE + 'setup: [[a, "b\\0"]]\n').path == "setup[0]"
    assert error_of(BASE + 'setup: ["a\\0"]\n').path == "setup[0]"
    assert error_of("nodes: [{host: a, gpus: 0}]\nworkload: {script: t.py, args: [\"a\\0\"]}\n"
                    ).path == "workload.args[0]"


def test_the_ssh_connect_timeout():
    assert load(BASE + "ssh: {connect_timeout: 5}\n").nodes[0].ssh.connect_timeout == 5.0


def test_an_ipv6_scope_may_be_upper_case():
    assert load("nodes: [{host: 'fe80::1%ETH0', gpus: 0}]\nworkload: {name: linear}\n"
                ).nodes[0].host == "fe80::1%ETH0"


def test_every_top_level_field_reaches_the_spec(tmp_path):
    text = ("name: exp1\nbackend: ssh\nmaster: {addr: m, port: 29600}\nworkdir: /w\n"
            "device: cpu\nenv: {A: '1'}\nhang_timeout: 60\nmax_restarts: 3\n"
            "network: {interface: eth1}\nsetup: [make]\nsetup_timeout: 90\noutputs: [out/]\n"
            "gpu_policy: {busy_memory_mib: 2048, wait: 30}\n"
            "nodes: [{host: a, procs: 2}]\nworkload: {name: linear}\n")
    spec = load_cluster_text(text, source="f.yaml", base_dir=str(tmp_path))
    assert (spec.name, spec.backend, spec.master_addr, spec.master_port, spec.workdir) == (
        "exp1", "ssh", "m", 29600, "/w")
    assert (spec.device, dict(spec.env), spec.hang_timeout, spec.max_restarts, spec.interface) == (
        "cpu", {"A": "1"}, 60.0, 3, "eth1")
    assert (spec.setup, spec.setup_timeout, spec.outputs) == (("make",), 90.0, ("out/",))
    assert (spec.gpu_busy_mib, spec.wait_gpus) == (2048, 30.0)
    assert (spec.source, spec.text, spec.base_dir, spec.placed) == ("f.yaml", text, str(tmp_path), False)
    assert spec.nodes[0].env == {"A": "1"}


def test_the_defaults_of_a_minimal_file():
    text = "nodes: [{host: a, gpus: 0}]\nworkload: {name: linear}\n"
    spec = load_cluster_text(text)
    assert (spec.name, spec.master_addr, spec.master_port, spec.workdir, spec.device) == (
        "linear", None, "auto", "~/.ddp-orch", "auto")
    assert (spec.hang_timeout, spec.max_restarts, spec.interface, spec.setup, spec.outputs) == (
        None, 0, "auto", (), ())
    assert (spec.setup_timeout, spec.wait_gpus, spec.source, spec.base_dir, spec.warnings) == (
        1800.0, 0.0, "<text>", os.path.abspath("."), ())


def test_slurm_settings_or_placed_nodes_choose_the_slurm_backend():
    placed = load("nodes: {count: 2, procs: 1}\nworkload: {name: linear}\n")
    assert (placed.backend, placed.placed) == ("slurm", True)
    given = load("slurm: {partition: p}\nnodes: [{host: a, procs: 1}]\nworkload: {name: linear}\n")
    assert given.backend == "slurm"


def test_the_default_run_name_from_the_workload():
    from dataclasses import replace

    from orchestrator.config.loader import default_name

    workload = load(BASE).workload
    assert default_name(workload) == "linear"
    assert default_name(replace(workload, name=None, module="Pkg.Train")) == "Pkg.Train"
    assert default_name(replace(workload, name=None, script="/p/my train!.py")) == "my-train-"
    assert default_name(replace(workload, name=None, script=None)) == "run"
    assert default_name(replace(workload, name=None, module="m" * 70)) == "m" * 64
    assert default_name(replace(workload, name=None, module="")) == "run"
