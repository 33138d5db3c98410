"""Property: masking a cluster file that loads yields one that loads to the
same spec, with the secrets replaced.

The stored ``cluster.yaml`` (and the copy in a bundle) is the masked text,
and it must stay a cluster file: an anchor dropped with its secret
(``HF_TOKEN: &t s3cr3t`` ... ``*t``) or a mask landing bare where YAML
reads ``*`` as an alias (``args: [s3cr3t]`` -> ``[********]``) made it
unparseable. The generator writes cluster files by hand, so that the YAML
spells each value in every way it can (plain, quoted, escaped, tagged, block
scalars), with anchors and aliases across the top-level env, the nodes' envs
and the workload's args, and secrets in comments and inside other values.
"""

from __future__ import annotations

import dataclasses
import json
import string

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.config.loader import load_cluster_text
from orchestrator.plan.secrets import stored_cluster_file

# Each name the generator writes, with the secret-name pattern it holds
# (docs/secrets.md: *TOKEN*, *SECRET*, *PASSWORD*, *PASSWD*, *KEY*,
# *CREDENTIAL*, any case), or None: the oracle's half of the rule, written
# out by hand rather than asked of ``is_secret``.
NAMES = {"HF_TOKEN": "TOKEN", "hub_token": "TOKEN", "TOKENIZERS_PARALLELISM": "TOKEN",
         "MY_SECRET": "SECRET", "Db_Password": "PASSWORD", "DB_PASSWORD": "PASSWORD",
         "PGPASSWD": "PASSWD", "mysql_passwd": "PASSWD", "WANDB_API_KEY": "KEY",
         "AWS_CREDENTIALS": "CREDENTIAL", "PROJECT": None, "NCCL_DEBUG": None,
         "OMP_NUM_THREADS": None, "MODE": None,
         # names of the examples below
         "OTHER_TOKEN": "TOKEN", "B": None}
PATTERNS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "CREDENTIAL")
GENERATED_NAMES = sorted(set(NAMES) - {"OTHER_TOKEN", "B"})
MASK = "********"
SETTINGS = ["false", "true", "disabled", "auto", "none"]

# A credential: a letter and a digit first, so that it is never a word of the
# file's own (a key, a host) nor a number; then what tokens hold.
credentials = st.builds(lambda head, tail: head + tail,
                        st.from_regex(r"[a-z]{2}[0-9]", fullmatch=True),
                        st.text(string.ascii_letters + string.digits + "-_.+/=~", min_size=5,
                                max_size=16))


@st.composite
def scalar_text(draw, value: str, block_ok: bool, indent: int) -> str:
    """``value`` (a string) as YAML scalar text, in a style drawn at random."""
    plain_ok = (value[:1].isalnum() and all(c.isalnum() or c in "-_./+=~" for c in value)
                and yaml.safe_load(value) == value)
    styles = ["single", "double", "escaped", "tagged"] + ["plain"] * plain_ok
    if block_ok and "\n" not in value:
        styles += ["literal", "folded"]
    style = draw(st.sampled_from(styles))
    if style == "plain":
        return value
    if style == "single":
        return "'" + value.replace("'", "''") + "'"
    if style == "double":
        return json.dumps(value)
    if style == "escaped":  # some characters as \uXXXX: the text differs from the value
        picks = draw(st.lists(st.booleans(), min_size=len(value), max_size=len(value)))
        return '"' + "".join(f"\\u{ord(c):04x}" if pick else json.dumps(c)[1:-1]
                             for c, pick in zip(value, picks)) + '"'
    if style == "tagged":
        return "!!str " + json.dumps(value)
    pad = " " * (indent + 2)
    return ("|-" if style == "literal" else ">-") + "\n" + pad + value  # chomped: the same value


@st.composite
def cluster_files(draw) -> str:
    """A cluster file that loads, as text."""
    secrets: list[str] = draw(st.lists(credentials, min_size=1, max_size=3, unique=True))
    anchors: list[str] = []  # anchors defined so far, in text order

    def value_for(name: str) -> str:
        kind = draw(st.sampled_from(["secret", "secret", "setting", "number", "short", "around"]))
        if kind == "secret":
            return draw(st.sampled_from(secrets))
        if kind == "setting":
            return draw(st.sampled_from(SETTINGS))
        if kind == "number":
            return str(draw(st.integers(min_value=0, max_value=10 ** 12)))
        if kind == "short":
            return draw(st.text(string.ascii_lowercase, min_size=1, max_size=7))
        return "at-" + draw(st.sampled_from(secrets)) + "-end"  # a secret inside a value

    def item(value: str, block_ok: bool, indent: int) -> str:
        """A value's text: an alias of an earlier anchor, or the value, maybe anchored."""
        if anchors and draw(st.integers(min_value=0, max_value=3)) == 0:
            return "*" + draw(st.sampled_from(anchors))
        text = draw(scalar_text(value, block_ok, indent))
        if draw(st.integers(min_value=0, max_value=2)) == 0:
            anchors.append(f"a{len(anchors)}")
            return f"&{anchors[-1]} {text}"
        return text

    def comment() -> str:
        return draw(st.sampled_from(["", "", f"  # was {draw(st.sampled_from(secrets))}"]))

    def env_text(indent: int) -> str:
        names = draw(st.lists(st.sampled_from(GENERATED_NAMES), min_size=1,
                              max_size=4, unique=True))
        pad = " " * indent
        if draw(st.booleans()):  # flow
            return " {" + ", ".join(f"{n}: {item(value_for(n), False, indent)}"
                                    for n in names) + "}" + comment()
        lines = [f"{n}: {item(value_for(n), True, indent)}" for n in names]
        # a comment after a block scalar's line would be part of its text
        return "".join(f"\n{pad}{line}" + ("" if "\n" in line else comment())
                       for line in lines)

    lines = []
    if draw(st.booleans()):
        lines.append("env:" + env_text(2))
    lines.append("nodes:")
    for k in range(draw(st.integers(min_value=1, max_value=3))):
        lines.append(f"  - host: n{k}\n    procs: 1")
        if draw(st.booleans()):
            lines.append("    env:" + env_text(6))
    args = [item(draw(st.sampled_from(secrets + ["--token", "x", "50"])), False, 0)
            for _ in range(draw(st.integers(min_value=0, max_value=3)))]
    lines.append(f"workload: {{script: train.py, args: [{', '.join(args)}]}}{comment()}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("masking")
    (base / "train.py").write_text("")
    return str(base)


def credential(value: str) -> bool:
    """The oracle's other half, for the values the generator writes: a
    credential (8 characters or more, a letter first) is one; a number (all
    digits), a settings word or a short word is not."""
    return len(value) >= 8 and not value.isdigit() and value not in SETTINGS


def secret(name: str, value: str) -> bool:
    return NAMES[name] is not None and credential(value)


def secrets_of(spec) -> list[str]:
    """The values that must not survive anywhere: every secret entry's, in
    the top-level env and each node's (a secret every node overrides too)."""
    return sorted({value for env in (spec.env, *(node.env for node in spec.nodes))
                   for name, value in env.items() if secret(name, value)}, key=len, reverse=True)


def check(text: str, base_dir: str) -> None:
    spec = load_cluster_text(text, source="c.yaml", base_dir=base_dir)
    secrets = secrets_of(spec)
    masked = stored_cluster_file(spec)  # as the run directory and the bundle keep it
    back = load_cluster_text(masked, source="c.yaml", base_dir=base_dir)

    def hidden(value: str) -> str:  # every secret replaced where it appears, longest first
        for secret_value in secrets:
            value = value.replace(secret_value, MASK)
        return value

    def masked_env(env):
        return {name: MASK if secret(name, value) else hidden(value)
                for name, value in env.items()}

    want_nodes = tuple(dataclasses.replace(node, line=None, env=masked_env(node.env))
                       for node in spec.nodes)
    args = spec.workload.args
    want = dataclasses.replace(
        spec, text=masked, nodes=want_nodes, env=masked_env(spec.env),
        workload=dataclasses.replace(spec.workload, args=tuple(map(hidden, args))
                                     if isinstance(args, tuple) else args))
    got = dataclasses.replace(back, nodes=tuple(dataclasses.replace(node, line=None)
                                                for node in back.nodes))
    assert got == want, masked
    for secret_value in secrets:
        assert secret_value not in masked, masked


ANCHORED = ("env:\n  HF_TOKEN: &t s3cr3tvalue\nnodes:\n  - host: a\n    procs: 1\n"
            "    env: {OTHER_TOKEN: *t}\nworkload: {script: train.py}\n")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=cluster_files())
@example(text=ANCHORED)  # the anchor went with the secret; *t then named nothing
@example(text="env: {HF_TOKEN: s3cr3tvalue}\nnodes: [{host: a, procs: 1}]\n"
              "workload: {script: train.py, args: [s3cr3tvalue]}\n")  # bare ******** : an alias
@example(text="env:\n  HF_TOKEN: &t !!str |-\n    s3cr3tvalue\n  # s3cr3tvalue\n"
              "nodes: [{host: a, procs: 1, env: {B: *t}}]\nworkload: {script: train.py}\n")
@example(text="env: {PROJECT: &a ab000000, HF_TOKEN: *a}\n"  # a secret every node overrides
              "nodes: [{host: a, procs: 1, env: {HF_TOKEN: aa000000}}]\n"
              "workload: {script: train.py, args: [ab000000]}\n")
@example(text="env: {PGPASSWD: pa55w0rdpg, mysql_passwd: my5qlpass}\n"
              "nodes: [{host: a, procs: 1}]\nworkload: {script: train.py, args: [pa55w0rdpg]}\n")
def test_a_masked_cluster_file_loads_to_the_same_spec_with_the_secrets_replaced(text, base_dir):
    check(text, base_dir)


def test_the_generator_reaches_anchors_aliases_secrets_outside_env_and_every_name(base_dir):
    """Guard against a generator that never writes what broke the masking,
    nor a secret under each name pattern the rule promises (one without
    PASSWD names let PASSWD drop out of the rule unnoticed)."""
    seen = {"alias of an anchored secret": 0, "secret in args": 0, "secret in a comment": 0,
            **{f"a secret *{pattern}*": 0 for pattern in PATTERNS},
            "a credential under a plain name": 0, "a setting under a secret name": 0}

    @settings(max_examples=200, deadline=None, database=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(text=cluster_files())
    def run(text):
        spec = load_cluster_text(text, source="c.yaml", base_dir=base_dir)
        values = secrets_of(spec)
        entries = [(n, v) for env in (spec.env, *(node.env for node in spec.nodes))
                   for n, v in env.items()]
        events = list(yaml.parse(text))
        anchored = {e.anchor for e in events if isinstance(e, yaml.ScalarEvent)
                    and e.anchor and e.value in values}
        seen["alias of an anchored secret"] += any(
            isinstance(e, yaml.AliasEvent) and e.anchor in anchored for e in events)
        seen["secret in args"] += any(v in str(spec.workload.args) for v in values)
        seen["secret in a comment"] += any(f"# was {v}" in text for v in values)
        for pattern in PATTERNS:
            seen[f"a secret *{pattern}*"] += any(NAMES[n] == pattern and credential(v)
                                                 for n, v in entries)
        seen["a credential under a plain name"] += any(NAMES[n] is None and credential(v)
                                                       for n, v in entries)
        seen["a setting under a secret name"] += any(NAMES[n] and v in SETTINGS
                                                     for n, v in entries)

    run()
    assert all(count >= 10 for count in seen.values()), seen
