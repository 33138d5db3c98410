"""Unit tests of issue 29's cluster-file side: ``gpus:`` as a list or as a
request (``all``, ``free``, ``free:N``), the one-integer warning, a host
listed twice, ``gpu_policy:``, the reserved CUDA_DEVICE_ORDER, Slurm's
refusal, ``--local --gpus`` and the schema on the same inputs."""

from __future__ import annotations

import jsonschema
import pytest
import yaml

from orchestrator.config.loader import load_cluster_text, one_index_warning, parse_gpus
from orchestrator.config.localmode import local_spec
from orchestrator.config.schema import cluster_schema
from orchestrator.config.spec import requested_count
from orchestrator.errors import ConfigError
from orchestrator.plan.build import build_plan

LINEAR = "workload: {name: linear}\n"
FREE_N_HINT = "free:N asks for N free GPUs, N from 1 to 1024"


def known(spec) -> bool:
    """Does the plan of ``spec`` know its world size before the launch?"""
    return build_plan(spec, run_id="r", local_run_dir="/tmp/r").world_size_known


def load(text: str):
    return load_cluster_text(text + LINEAR, source="c.yaml")


def refusal(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load(text)
    return caught.value


def one_node(gpus: str):
    return load(f"nodes:\n  - host: a\n    gpus: {gpus}\n")


# parse_gpus ---------------------------------------------------------------------


@pytest.mark.parametrize("raw, want", [
    ("3,4,5", (3, 4, 5)),
    (" 5 , 3,4 ", (5, 3, 4)),  # the user's order, not sorted
    ([7, 2, 4], (7, 2, 4)),
    (["6", 1], (6, 1)),
    (3, (3,)),
    ("all", "all"), ("free", "free"),
    ("free:3", "free:3"), ("free:1", "free:1"), ("free:1024", "free:1024"),
])
def test_parse_gpus_keeps_the_users_order_and_the_request_words(raw, want):
    assert parse_gpus(raw) == want


@pytest.mark.parametrize("raw", ["free:0", "free:00", "free:03", "free:1025", "free:9999",
                                 "free:-1", "free:two", "free:", "free:2.0", "free: 2",
                                 "free:12345"])
def test_free_n_outside_1_to_1024_is_not_a_request(raw):
    with pytest.raises(ValueError) as caught:
        parse_gpus(raw)
    assert caught.value.args == (f"{raw!r} is not a GPU request", FREE_N_HINT)


def test_free_0_in_a_file_is_refused_at_its_line():
    error = refusal("nodes:\n  - host: a\n    gpus: free:0\n")
    assert (error.path, error.line) == ("nodes[0].gpus", 3)
    assert "'free:0' is not a GPU request" in str(error) and error.hint == FREE_N_HINT


# what the loader makes of a request ------------------------------------------------


def test_free_n_is_a_request_with_a_known_count():
    spec = load("nodes:\n  - {host: a, gpus: free:3}\n  - {host: b, gpus: '5,1'}\n")
    a, b = spec.nodes
    assert (a.gpus, a.gpu_request, a.nproc, a.on_gpus) == (None, "free:3", 3, True)
    assert (b.gpus, b.gpu_request, b.nproc) == ((5, 1), None, 2)
    assert known(spec) and spec.world_size == 5 and spec.uses_gpus
    assert spec.warnings == ()


@pytest.mark.parametrize("word", ["all", "free"])
def test_all_and_free_leave_the_world_size_to_the_launch(word):
    spec = load(f"nodes:\n  - {{host: a, gpus: {word}}}\n  - {{host: b, gpus: free:2}}\n")
    a, b = spec.nodes
    assert (a.gpus, a.gpu_request, a.nproc) == (None, word, 0)
    assert b.nproc == 2
    assert not known(spec)
    assert requested_count(word) is None and requested_count("free:7") == 7


# gpus: 4 -------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["4", "'4'", "\" 4 \""])
def test_one_integer_warns_that_it_is_an_index_and_how_to_ask_for_four(value):
    spec = load(f"nodes:\n  - {{host: b, gpus: '0,1'}}\n  - host: a\n    gpus: {value}\n")
    assert spec.nodes[1].gpus == (4,) and spec.nodes[1].nproc == 1
    assert spec.warnings == (
        "warning: c.yaml:4: nodes[1].gpus: 4 means GPU index 4, one process; for 4 GPUs "
        "write `gpus: free:4` (any 4 free ones) or list them, e.g. `gpus: 0,1,2,3`",)


@pytest.mark.parametrize("value", ["[4]", "'4,5'", "[4, 5]", "free:4", "all", "free",
                                   "'3, 4'"])
def test_a_list_or_a_request_does_not_warn(value):
    assert one_node(value).warnings == ()


def test_the_warnings_example_list_counts_up_to_the_number():
    assert one_index_warning(3, (3,), "w").endswith("e.g. `gpus: 0,1,2`")
    assert one_index_warning(8, (8,), "w").endswith("e.g. `gpus: 0,1,2,3,4,5,6,7`")


def suggested(warning: str) -> str:
    return warning.split("write `gpus: ", 1)[1].split("`", 1)[0]


@pytest.mark.parametrize("index", [2, 4, 16])
def test_what_the_warning_suggests_asks_for_that_many(index):
    warning, = one_node(str(index)).warnings
    assert one_node(suggested(warning)).nodes[0].nproc == index


@pytest.mark.parametrize("index", [0, 1])
def test_one_gpu_by_index_does_not_warn(index):
    assert one_node(str(index)).warnings == ()


# a host listed twice ------------------------------------------------------------------


@pytest.mark.parametrize("first, second, asked", [
    ("free:2", "'0'", "free:2"), ("'0'", "all", "all"), ("free", "free:1", "free:1")])
def test_a_host_listed_twice_with_a_request_is_refused_at_the_second_entry(first, second, asked):
    error = refusal(f"nodes:\n  - {{host: a, gpus: {first}}}\n  - {{host: b, gpus: 0}}\n"
                    f"  - {{host: a, gpus: {second}}}\n")
    assert (error.path, error.line, error.source) == ("nodes[2].gpus", 4, "c.yaml")
    assert f"a is listed twice, and one entry asks for {asked!r}" in str(error)
    assert error.hint == ("a host listed twice needs explicit, disjoint GPU lists; or list it "
                          "once with all its GPUs (`gpus: free:N` or `gpus: all`)")


def test_requests_on_different_hosts_and_disjoint_lists_on_one_host_load():
    spec = load("nodes:\n  - {host: a, gpus: free:2}\n  - {host: b, gpus: free:2}\n"
                "  - {host: c, gpus: '0,1'}\n  - {host: c, gpus: '2,3'}\n")
    assert [n.nproc for n in spec.nodes] == [2, 2, 2, 2]


# gpu_policy and CUDA_DEVICE_ORDER -------------------------------------------------------


def test_gpu_policy_sets_the_busy_threshold_and_the_wait():
    spec = load("gpu_policy: {busy_memory_mib: 4096, wait: 600}\nnodes: [{host: a, gpus: free}]\n")
    assert (spec.gpu_busy_mib, spec.wait_gpus) == (4096, 600.0)
    assert isinstance(spec.wait_gpus, float)
    only_wait = load("gpu_policy: {wait: 5}\nnodes: [{host: a, gpus: free}]\n")
    assert (only_wait.gpu_busy_mib, only_wait.wait_gpus) == (1024, 5.0)  # the README's default
    none = load("nodes: [{host: a, gpus: free}]\n")
    assert (none.gpu_busy_mib, none.wait_gpus) == (1024, 0.0)
    edges = load("gpu_policy: {busy_memory_mib: 0, wait: 604800}\nnodes: [{host: a, gpus: 0}]\n")
    assert (edges.gpu_busy_mib, edges.wait_gpus) == (0, 604800.0)


@pytest.mark.parametrize("policy, path, words", [
    ("{busy_memory_mib: 1048577}", "gpu_policy.busy_memory_mib", "out of range 0-1048576"),
    ("{wait: 604801}", "gpu_policy.wait", "604801 is out of range 0-604800"),
    ("{wait: 2.5}", "gpu_policy.wait", "expected a whole number, got float 2.5"),
    ("{wiat: 3}", "gpu_policy.wiat", "unknown key 'wiat'"),
])
def test_gpu_policy_out_of_range_or_misspelt_is_refused(policy, path, words):
    error = refusal(f"gpu_policy: {policy}\nnodes: [{{host: a, gpus: 0}}]\n")
    assert error.path == path and words in str(error) and error.line == 1


@pytest.mark.parametrize("where, path", [
    ("env: {CUDA_DEVICE_ORDER: FASTEST_FIRST}\nnodes: [{host: a, gpus: 0}]\n",
     "env.CUDA_DEVICE_ORDER"),
    ("nodes: [{host: a, gpus: 0, env: {CUDA_DEVICE_ORDER: PCI_BUS_ID}}]\n",
     "nodes[0].env.CUDA_DEVICE_ORDER"),
])
def test_cuda_device_order_is_reserved(where, path):
    error = refusal(where)
    assert error.path == path and "CUDA_DEVICE_ORDER cannot be set here" in str(error)
    assert error.hint == "ddp-orch and torchrun set it for every process"


# Slurm ----------------------------------------------------------------------------------


@pytest.mark.parametrize("request_, count", [("free:2", "2"), ("all", "G"), ("free", "G")])
def test_a_request_under_slurm_is_refused_with_the_count_form(request_, count):
    error = refusal(f"backend: slurm\nnodes:\n  - {{host: a, gpus: {request_}}}\n")
    assert (error.path, error.line) == ("nodes[0].gpus", 3)
    assert (f"under backend: slurm, Slurm chooses the GPUs: {request_!r} is not asked of the "
            "node") in str(error)
    assert f"`nodes: {{count: N, gpus: {count}}}`" in error.hint


def test_a_list_under_slurm_still_loads():
    assert load("backend: slurm\nnodes: [{host: a, gpus: '0,1'}]\n").nodes[0].nproc == 2


# up --local --gpus ----------------------------------------------------------------------


def local(gpus: str):
    return local_spec(None, workload="linear", gpus=gpus, procs=None, device=None, args={})


def test_local_gpus_free_n_is_a_request():
    spec = local("free:2")
    node, = spec.nodes
    assert (node.host, node.gpus, node.gpu_request, node.nproc) == ("localhost", None, "free:2", 2)
    assert spec.warnings == () and known(spec)
    assert local("all").nodes[0].gpu_request == "all" and not known(local("all"))
    assert local("4").warnings == ("warning: --gpus: 4 means GPU index 4, one process; for 4 "
                                   "GPUs write `gpus: free:4` (any 4 free ones) or list them, "
                                   "e.g. `gpus: 0,1,2,3`",)
    assert local("1").warnings == local("0,5").warnings == ()


def test_local_gpus_one_integer_warns_in_the_options_words():
    assert local("4").warnings == (
        "warning: --gpus: 4 means GPU index 4, one process; for 4 GPUs write `gpus: free:4` "
        "(any 4 free ones) or list them, e.g. `gpus: 0,1,2,3`",)
    assert local("2,0").nodes[0].gpus == (2, 0) and local("2,0").warnings == ()


def test_local_gpus_free_0_is_refused_as_an_option():
    with pytest.raises(ConfigError) as caught:
        local("free:0")
    assert (caught.value.path, caught.value.source) == ("--gpus", "command line")
    assert "'free:0' is not a GPU request" in str(caught.value)
    assert caught.value.hint == FREE_N_HINT


# the schema on the same values ---------------------------------------------------------

VALIDATOR = jsonschema.Draft202012Validator(cluster_schema())


def schema_ok(gpus: str) -> bool:
    doc = yaml.safe_load(f"nodes: [{{host: a, gpus: {gpus}}}]\n" + LINEAR)
    return not list(VALIDATOR.iter_errors(doc))


@pytest.mark.parametrize("gpus", ["all", "free", "free:1", "free:3", "free:1024", "'0,1'", "4"])
def test_the_schema_accepts_the_requests(gpus):
    assert schema_ok(gpus)
    one_node(gpus)  # and so does the loader


@pytest.mark.parametrize("gpus", ["free:two", "ALL", "'free: 2'"])
def test_the_schema_refuses_what_the_loader_refuses(gpus):
    assert not schema_ok(gpus)
    with pytest.raises(ConfigError):
        one_node(gpus)


@pytest.mark.parametrize("gpus", ["free:0", "free:1025", "free:9999", "free:01"])
def test_the_schema_refuses_free_n_out_of_range(gpus):
    with pytest.raises(ConfigError):
        one_node(gpus)
    assert not schema_ok(gpus)
