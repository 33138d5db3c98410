"""Property: whatever text it is given, the loader raises only ``ConfigError``.

Three generators feed ``load_cluster_text``: (a) arbitrary text, control
characters, tabs and non-ASCII included; (b) random YAML documents (nested
lists, mappings and scalars, huge numbers, nan, inf) dumped by PyYAML;
(c) documents built from the real cluster-file schema with random and
mutated values, so that the deep checks (GPU lists, ssh, env, workload
args) run too. Every outcome must be a ``ClusterSpec`` (which must then
plan and render for a dry-run) or a ``ConfigError`` with a message and a
line inside the text; anything else is a bug in the loader.
"""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ConfigError
from orchestrator.config.loader import (MAX_GPU_INDEX, NODE_KEYS, RESERVED_ENV, SSH_KEYS, TOP_KEYS,
                                 load_cluster_text)
from orchestrator.engine.options import LaunchOptions
from orchestrator.controller.session import prepare
from orchestrator.plan.render import render_json, render_text
from orchestrator.config.spec import ClusterSpec
from workloads.catalog import CATALOG

BASE = "@BASE@"  # replaced by the test's directory (a script and a key file live there)
FAST = settings(max_examples=300, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
VALID = ("nodes:\n  - {host: a, gpus: 0}\nworkload: {name: linear}\n")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory) -> str:
    base = tmp_path_factory.mktemp("fuzz")
    (base / "train.py").write_text("print('train')\n")
    (base / "id_key").write_text("not really a key\n")
    (base / "keys.d").mkdir()
    return str(base)


def check(text: str, base_dir: str) -> None:
    """The property itself, shared by every generator."""
    text = text.replace(BASE, base_dir)
    try:
        spec = load_cluster_text(text, source="fuzz.yaml", base_dir=base_dir)
    except ConfigError as err:
        assert err.message.strip(), repr(err)
        assert err.source == "fuzz.yaml"
        assert err.line is not None, f"no line in: {err}"
        assert 1 <= err.line <= len(text.splitlines()) + 1, f"line {err.line} in: {err}"
        assert str(err).startswith(f"fuzz.yaml:{err.line}: ")
        assert str(err).count("\n  hint: ") <= 1
        return
    # Any other exception escapes and fails the test. A spec that loads
    # must also survive what `up --dry-run` does with it: a plan, or a
    # refusal of what is knowable before launch (a workload's rule), which
    # is a ConfigError about the same file.
    assert isinstance(spec, ClusterSpec)
    try:
        _backend, info = prepare(spec, LaunchOptions(), run_id="fuzz-run",
                                 local_run_dir="/tmp/fuzz-run")
    except ConfigError as err:
        assert err.message.strip() and err.source == "fuzz.yaml", repr(err)
        assert err.path.startswith("workload.args."), repr(err)
        assert str(err).count("\n  hint: ") <= 1
        return
    render_text(info)
    json.loads(render_json(info))


def laughs(levels: int) -> str:
    """"Billion laughs": each anchored list holds nine aliases of the one before."""
    lists = ["&l0 [" + ", ".join(["0"] * 9) + "]"]
    lists += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return f"nodes:\n  - host: a\n    gpus: [{', '.join(lists)}]\nworkload: {{name: linear}}\n"


# (a) arbitrary text ---------------------------------------------------------

YAML_CHARS = list(":-[]{},#&*!|>'\"?%@`~\t\n\r ")
YAML_BITS = ["  ", "- ", ": ", "---\n", "\n  ", "0,1", "nodes", "gpus", "host"]
any_text = st.one_of(
    st.text(alphabet=st.one_of(st.characters(), st.sampled_from(YAML_CHARS)), max_size=200),
    st.lists(st.one_of(st.sampled_from(YAML_BITS), st.text(max_size=3)), max_size=40).map("".join))


@FAST
@given(text=st.one_of(any_text, st.lists(st.sampled_from([
    "nodes:", "  - host: a", "    gpus: 0,1", "\tgpus: 1", "workload:", "  name: linear",
    "  args: {epochs: 2}", "- x", "&a [*a]", "*a", "<<: *a", "---", "? [1]", ": 2", "!!int x",
    "name: 2020-13-45", "  procs: 2", "env: {A: 1}", "\x00", "\x0c", "\u2028", "!!int",
    "    gpus: !!str [1]", "    gpus: !!omap [a]", "    gpus: !!set {1}"]),
    max_size=12).map("\n".join)))
@example(text="")
@example(text="!!int")  # IndexError from PyYAML's int constructor on an empty scalar
@example(text="\x0c\n" + VALID)  # a control character: PyYAML's ReaderError escaped
@example(text="name: a\x01b\n" + VALID)
@example(text="[" * 1000 + "]" * 1000)  # RecursionError in PyYAML's composer
@example(text="nodes:\n  - host: a\n    gpus: " + "[" * 450 + "]" * 450
         + "\nworkload: {name: linear}\n")
@example(text=VALID + "---\n" + VALID)
@example(text="a: &x 1\nb: &x 2\n")
@example(text="a: *nope\n")
@example(text="nodes:\n\t- host: a\n")
def test_random_text_raises_only_config_errors(text, base_dir):
    check(text, base_dir)


# (b) random YAML documents --------------------------------------------------

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-10**40, max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(["0,1", "2,2", "3,,4", "-1", "auto", "localhost", "linear", "~/x", "yes",
                     "2020-13-45", "!!int x", "!foo x", "*a", "9" * 30]))
keys = st.one_of(st.sampled_from(TOP_KEYS + NODE_KEYS + SSH_KEYS + ("addr", "port", "name",
                                                                     "script", "args")),
                 st.text(max_size=10), st.integers(), st.booleans(), st.none())
documents = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(keys, kids, max_size=5),
    max_leaves=25)


@FAST
@given(doc=documents, flow=st.sampled_from([None, True, False]), unicode=st.booleans())
@example(doc={"nodes": [{"host": "a", "gpus": "9" * 5000}], "workload": {"name": "linear"}},
         flow=False, unicode=False)  # int("9" * 5000) refused by Python: ValueError escaped
@example(doc={"nodes": [{"host": "a", "gpus": "\u00b2"}], "workload": {"name": "linear"}},
         flow=False, unicode=True)  # "²".isdigit() but int("²") fails
def test_random_yaml_documents_raise_only_config_errors(doc, flow, unicode, base_dir):
    check(yaml.safe_dump(doc, default_flow_style=flow, allow_unicode=unicode, sort_keys=False),
          base_dir)


# (c) documents from the schema, with random and mutated values -------------
# A valid document is drawn first, then one to three fields are replaced by
# odd values, deleted or joined by an unknown key, so most examples get past
# the first checks and into the deep ones (GPU lists, ssh, env, args).

weird = st.one_of(scalars, st.lists(scalars, max_size=3),
                  st.dictionaries(keys, scalars, max_size=3))
gpu_ints = st.integers(min_value=-2, max_value=MAX_GPU_INDEX + 2)
ODD = {
    "name": st.sampled_from(["demo", "a/b", "-x", "x" * 70, "", "2020-13-45", "2020-01-01"]),
    "host": st.sampled_from(["localhost", "a", "b", "10.0.0.1", "[::1]", "a b", "", "-oX"]),
    "addr": st.sampled_from(["10.0.0.1", "a b", ""]),
    "port": st.one_of(st.integers(min_value=-1, max_value=70000), st.integers(),
                      st.sampled_from(["auto", "22", 22.0, 1.5])),
    "gpus": st.one_of(
        st.lists(gpu_ints, max_size=5), gpu_ints, st.just([]), st.just([True]),
        st.lists(st.sampled_from(["0", "1", "2", " ", "", "a", "-1", "10"]), max_size=5)
        .map(",".join),
        st.sampled_from(["0, 1, 1", "3,,4", "\u00b2", "1.5", "0x1", 1.5, "9" * 30])),
    "procs": st.one_of(st.integers(min_value=-2, max_value=1030), st.integers(),
                       st.sampled_from([99999999999999999999999, "2", 2.0])),
    "identity_file": st.sampled_from([f"{BASE}/id_key", f"{BASE}/keys.d", f"{BASE}/missing", "/",
                                      "relative/key", "~/.ssh/id_nope", "~", "", "a\x00b"]),
    "strict_host_keys": st.sampled_from([True, False, "yes", "no", "accept-new", None]),
    "connect_timeout": st.one_of(st.integers(min_value=-1, max_value=700), st.just(2.5)),
    "python": st.sampled_from(["python3", "/usr/bin/python3", "/opt/my python", ""]),
    "workdir": st.sampled_from(["~/.ddp-orch", "/srv/runs/", "runs", "~", "/", "~x", ""]),
    "device": st.sampled_from(["auto", "cuda", "cpu", "gpu", "CUDA"]),
    "script": st.sampled_from(["train.py", "nope.py", f"{BASE}/train.py", ".", "~", "keys.d"]),
    "workload.name": st.sampled_from(sorted(CATALOG) + ["linaer", "LINEAR", ""]),
}
ENV_NAMES = sorted(RESERVED_ENV) + ["DDP_ORCH_X", "A-B", "NCCL_DEBUG", "1X", "_Y", "a.b"]
ARG_NAMES = sorted({a.name for info in CATALOG.values() for a in info.args} | {"epoch", "x-y"})
FIELDS = [("name",), ("master",), ("master", "addr"), ("master", "port"), ("ssh",), ("python",),
          ("workdir",), ("env",), ("device",), ("nodes",), ("nodes", 0), ("nodes", 0, "host"),
          ("nodes", 0, "gpus"), ("nodes", 0, "procs"), ("nodes", 0, "ssh"), ("nodes", 0, "python"),
          ("nodes", 0, "env"), ("nodes", 1, "gpus"), ("nodes", 1, "host"), ("workload",),
          ("workload", "name"), ("workload", "script"), ("workload", "args")]
POINTS = [  # groups of field paths, drawn group first so that no group swamps the rest
    FIELDS,
    [("nodes", k, "gpus") for k in range(3)] + [("nodes", k, "procs") for k in range(3)],
    [(*where, key) for where in [("ssh",), ("nodes", 0, "ssh")]
     for key in SSH_KEYS + ("password",)],
    [(*where, name) for where in [("env",), ("nodes", 0, "env")] for name in ENV_NAMES],
    [("workload", "args", name) for name in ARG_NAMES],
    [(*where, "unknown") for where in [(), ("nodes", 0), ("ssh",), ("workload",), ("master",)]],
]
DELETE = object()


def arg_value(spec) -> st.SearchStrategy:
    """A value of the right kind for a catalog argument."""
    if spec.choices:
        return st.sampled_from(spec.choices)
    return {bool: st.booleans(), int: st.integers(min_value=0, max_value=100),
            float: st.floats(min_value=0, max_value=1)}.get(spec.type, st.text(max_size=5))


@st.composite
def valid_docs(draw):
    """A cluster file that loads (or, with two nodes on one host, may overlap)."""
    n = draw(st.integers(min_value=1, max_value=3))
    nodes = []
    for k in range(n):
        node = {"host": draw(st.sampled_from(["a", "b", "10.0.0.1", f"n{k}"]))}
        if draw(st.booleans()):
            node["gpus"] = draw(st.one_of(
                st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=4,
                         unique=True),
                st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=4,
                         unique=True).map(lambda g: ",".join(map(str, g)))))
        else:
            node["procs"] = draw(st.integers(min_value=1, max_value=4))
        nodes.append(node)
    name = draw(st.sampled_from(sorted(CATALOG)))
    specs = draw(st.lists(st.sampled_from(CATALOG[name].args), max_size=3, unique_by=id)) \
        if CATALOG[name].args else []
    workload = {"name": name, "args": {a.name: draw(arg_value(a)) for a in specs}}
    if draw(st.booleans()):
        workload = {"script": "train.py", "args": draw(st.dictionaries(
            st.from_regex(r"[a-z][a-z_-]{0,6}", fullmatch=True), scalars, max_size=3))}
    doc = {"nodes": nodes, "workload": workload}
    optional = {
        "name": st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True),
        "master": st.fixed_dictionaries({}, optional={
            "addr": st.just("10.0.0.1"),
            "port": st.one_of(st.just("auto"), st.integers(min_value=1, max_value=65535))}),
        "ssh": st.fixed_dictionaries({}, optional={
            "user": st.just("ubuntu"), "port": st.integers(min_value=1, max_value=65535),
            "identity_file": st.just(f"{BASE}/id_key"),
            "strict_host_keys": st.sampled_from(["yes", "accept-new"]),
            "connect_timeout": st.integers(min_value=1, max_value=600)}),
        "python": st.just("/usr/bin/python3"), "workdir": st.just("/srv/runs"),
        "env": st.dictionaries(st.from_regex(r"[A-Z][A-Z0-9_]{0,6}", fullmatch=True)
                               .filter(lambda k: k not in RESERVED_ENV and
                                       not k.startswith("DDP_ORCH_")),
                               st.one_of(st.text(max_size=5), st.integers(), st.booleans()),
                               max_size=3),
        "device": st.sampled_from(["auto", "cpu"]),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            doc[key] = draw(strategy)
    return doc


def set_at(doc, path, value) -> None:
    """``doc[path] = value`` where the containers exist (or can be made)."""
    target = doc
    for key in path[:-1]:
        if isinstance(target, dict):
            target = target.setdefault(key, {})
        elif isinstance(target, list) and isinstance(key, int) and key < len(target):
            target = target[key]
        else:
            return
    last = path[-1]
    if isinstance(target, dict) and value is DELETE:
        target.pop(last, None)
    elif isinstance(target, dict):
        target[last] = value
    elif isinstance(target, list) and isinstance(last, int) and last < len(target):
        target[last] = value if value is not DELETE else None


@st.composite
def schema_docs(draw):
    doc = draw(valid_docs())
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        path = draw(st.sampled_from(draw(st.sampled_from(POINTS))))
        key = "workload.name" if path == ("workload", "name") else path[-1]
        odd = ODD.get(key, weird) if isinstance(key, str) else weird
        set_at(doc, path, draw(st.one_of(odd, odd, weird, st.just(DELETE))))
    return doc


@st.composite
def mutated(draw, docs):
    """A schema document as YAML text, sometimes damaged line by line."""
    text = yaml.safe_dump(draw(docs), default_flow_style=draw(st.sampled_from([None, False])),
                          allow_unicode=True, sort_keys=False)
    lines = text.splitlines()
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 2]))):
        if not lines:
            break
        i = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        how = draw(st.sampled_from(["tab", "dup", "drop", "insert", "anchor", "alias", "unquote"]))
        if how == "unquote":  # the dumper quotes '2020-13-45'; a person might not
            lines[i] = lines[i].replace("'", "").replace('"', "")
        elif how == "tab":
            lines[i] = "\t" + lines[i].lstrip(" ")
        elif how == "dup":
            lines.insert(i, lines[i])
        elif how == "drop":
            del lines[i]
        elif how == "insert":
            lines.insert(i, draw(st.text(max_size=15)))
        elif how == "anchor" and ": " in lines[i]:
            lines[i] = lines[i].replace(": ", ": &a ", 1)
        elif how == "alias" and ": " in lines[i]:
            lines[i] = lines[i].split(": ", 1)[0] + ": *a"
    return "\n".join(lines) + "\n"


@FAST
@given(text=mutated(schema_docs()))
@example(text="name: 2020-13-45\n" + VALID)  # a date YAML cannot build: ValueError escaped
@example(text="nodes:\n  - {host: a, procs: 0x" + "f" * 5000 + "}\nworkload: {name: linear}\n")
@example(text="env: {X: -" + "9" * 5000 + "}\n" + VALID)  # int(): over Python's digit limit
@example(text="env: {D: 2020-02-30}\n" + VALID)
@example(text="name: !!int abc\n" + VALID)  # ValueError
@example(text="name: !!timestamp x\n" + VALID)  # AttributeError
@example(text="name: !!bool x\n" + VALID)  # KeyError
@example(text=VALID + "name: !!int\n")  # IndexError
@example(text=VALID + "name: !!binary '@'\n")  # binascii.Error
@example(text="name: !foo x\n" + VALID)  # ConstructorError
@example(text="nodes:\n  - {host: a, gpus: {[1]: 2}}\nworkload: {name: linear}\n")
@example(text="workload: {name: linear, args: {epochs: !!python/object:os.system x}}\n"
              "nodes: [{host: a, gpus: 0}]\n")
@example(text="nodes:\n  - {host: a, gpus: &g [*g]}\nworkload: {name: linear}\n")
@example(text=laughs(8))  # 9**8 GPU entries through aliases: repr() of them never finished
@example(text="nodes:\n  - <<: {host: a}\n    gpus: 0\nworkload: {name: linear}\n")
@example(text=f"ssh: {{identity_file: {BASE}/keys.d}}\n" + VALID)
def test_schema_documents_raise_only_config_errors(text, base_dir):
    check(text, base_dir)


def test_the_schema_generators_reach_valid_files_and_deep_errors(base_dir):
    """Guard against generators that only ever stop at the first check."""
    seen: dict[str, int] = {"ok": 0, "deep": 0}

    @settings(max_examples=150, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(doc=schema_docs())
    def run(doc):
        text = yaml.safe_dump(doc, sort_keys=False).replace(BASE, base_dir)
        try:
            load_cluster_text(text, source="fuzz.yaml", base_dir=base_dir)
            seen["ok"] += 1
        except ConfigError as err:
            seen["deep"] += err.path.count(".") >= 1

    run()
    assert seen["ok"] >= 10 and seen["deep"] >= 10, seen


def test_error_messages_stay_short_for_huge_and_looping_values():
    text = ("nodes:\n  - host: a\n    gpus: [" + ", ".join(['"' + "x" * 10_000 + '"'] * 3)
            + "]\nworkload: {name: linear}\n")
    with pytest.raises(ConfigError) as info:
        load_cluster_text(text, source="c.yaml")
    assert len(str(info.value)) < 500
    with pytest.raises(ConfigError, match="is not a GPU index") as info:
        load_cluster_text(laughs(8), source="c.yaml")
    assert len(str(info.value)) < 500 and info.value.line == 3
    loop = "nodes:\n  - {host: a, gpus: &g [1, *g]}\nworkload: {name: linear}\n"
    with pytest.raises(ConfigError, match="contain itself") as info:
        load_cluster_text(loop, source="c.yaml")
    assert info.value.line == 2


# libyaml and PyYAML read a file alike ----------------------------------------
# ``yamlsrc.parse`` composes plain files with libyaml (``_compose_fast``), 30x
# faster than PyYAML's own scanner on a commented file. The oracle is PyYAML's
# pure-Python parser itself: for every text, the loader's outcome with the
# fast path must be the outcome without it, word for word.

def outcome(text: str, base_dir: str) -> tuple:
    try:
        return ("spec", repr(load_cluster_text(text, source="fuzz.yaml", base_dir=base_dir)))
    except ConfigError as err:
        return ("error", str(err))


@FAST
@given(text=st.one_of(mutated(schema_docs()), any_text,
                      documents.map(lambda doc: yaml.safe_dump(doc, sort_keys=False)),
                      documents.map(lambda doc: yaml.safe_dump(doc, default_flow_style=True))))
@example(text=VALID)
@example(text="nodes:\n  - {host: a, gpus: &g [*g]}\nworkload: {name: linear}\n")
@example(text=laughs(6))
@example(text="nodes:\n  - host: a\n    gpus: 0,1\n    0,1:\nworkload: {name: linear}\n")
@example(text="nodes:\r\n  - {host: 'a', gpus: \"0\"}\r\nworkload: |\n  linear\n")
@example(text="---")  # an empty document: libyaml marks its null a line later
@example(text="nodes:\n  - host: a\n    gpus:\nworkload: {name: linear}\n")
def test_libyaml_and_pyyaml_give_the_same_spec_or_the_same_error(text, base_dir):
    from orchestrator.config import yamlsrc

    text = text.replace(BASE, base_dir)
    fast = outcome(text, base_dir)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(yamlsrc, "_compose_fast", lambda _text: None)
        slow = outcome(text, base_dir)
    assert fast == slow


def test_the_example_and_every_bad_input_file_take_the_path_they_should():
    """The shipped example (a plain ASCII file) is read by libyaml where it
    is installed; a file with a tab or a non-ASCII character is left to PyYAML."""
    import os

    from orchestrator.config import yamlsrc

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    with open(os.path.join(root, "cluster.yaml.example"), encoding="utf-8") as fh:
        text = fh.read()
    assert (yamlsrc._compose_fast(text) is not None) == hasattr(yaml, "CSafeLoader")
    assert yamlsrc._compose_fast(text.replace("nodes:", "nodes:\t", 1)) is None
    assert yamlsrc._compose_fast(text + "# café\n") is None
