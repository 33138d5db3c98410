"""``plan/secrets.py``'s masking, edge by edge: the cases
``scripts/mutation`` found no test pinned. Every expected text is written
out by hand."""

from __future__ import annotations

from orchestrator.plan.secrets import mask_cluster_text, scrub, secret_values

S = "s3cr3tvalue"


def test_a_scalar_holding_a_secret_is_requoted_with_only_the_secret_masked():
    text = "workload: {script: t.py, args: [--token=s3cr3tvalue, --lr=1]}\n"
    assert mask_cluster_text(text, [S]) == (
        'workload: {script: t.py, args: ["--token=********", --lr=1]}\n')


def test_the_requoted_scalar_keeps_unicode_and_stays_on_one_line():
    long = "é" + "x" * 100 + S
    text = f"name: {long}\n"
    assert mask_cluster_text(text, [S]) == 'name: "é' + "x" * 100 + '********"\n'


def test_a_mapping_key_holding_a_secret_is_masked():
    assert mask_cluster_text("labels: {s3cr3tvalue-a: 1}\n", [S]) == 'labels: {"********-a": 1}\n'


def test_the_longest_secret_is_masked_first_even_when_it_sorts_first():
    # "as3cr3tvalue" holds "s3cr3tvalue" and sorts before it: only length order
    # masks it whole
    assert mask_cluster_text("# as3cr3tvalue\nname: x\n", [S, "a" + S]) == "# ********\nname: x\n"
    values = secret_values({"A_TOKEN": S, "B_TOKEN": "a" + S})
    assert values == (b"as3cr3tvalue", b"s3cr3tvalue")
    assert scrub(b"as3cr3tvalue", values) == b"********"


def test_a_recursive_alias_is_walked_once():
    assert mask_cluster_text("x: &a [*a, s3cr3tvalue]\n", [S]) == 'x: &a [*a, "********"]\n'


def test_a_node_masked_whole_does_not_stop_the_masking_of_later_ones():
    text = "env:\n  API_TOKEN: [abc s3cr3tvalue, x]\nnodes:\n  - {host: s3cr3tvalue.example}\n"
    assert mask_cluster_text(text, [S]) == (
        'env:\n  API_TOKEN: "********"\nnodes:\n  - {host: "********.example"}\n')


def test_text_that_is_not_yaml_is_masked_by_value():
    assert mask_cluster_text("a: [b\n# s3cr3tvalue\n", [S]) == "a: [b\n# ********\n"


def test_without_values_only_secret_env_entries_are_masked():
    text = "env: {HF_TOKEN: hf_abcdefgh, OTHER: s3cr3tvalue}  # s3cr3tvalue\n"
    assert mask_cluster_text(text) == (
        'env: {HF_TOKEN: "********", OTHER: s3cr3tvalue}  # s3cr3tvalue\n')


def test_a_long_requoted_scalar_with_spaces_is_not_folded():
    words = "word " * 30
    assert mask_cluster_text(f"name: {words}s3cr3tvalue end\n", [S]) == (
        f'name: "{words}******** end"\n')
