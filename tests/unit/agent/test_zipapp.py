"""The agent's zipapp (``bootstrap.zipapp``): the Slurm nodes' agent, with
each module's compiled code beside its source. Python itself is the oracle
here: what a node imports is what ``zipimport`` picks from the archive."""

from __future__ import annotations

import importlib.util
import marshal
import subprocess
import sys
import zipfile

import pytest

from orchestrator.agent.wire import bootstrap

MODULE = "ddp_orch_agent/layout.py"


def _pyc(source: bytes, code_of: bytes, magic: bytes = importlib.util.MAGIC_NUMBER) -> bytes:
    """A checked hash-based .pyc that claims ``source`` and holds ``code_of``'s code."""
    return (magic + (0b11).to_bytes(4, "little") + importlib.util.source_hash(source)
            + marshal.dumps(compile(code_of, "x.py", "exec")))


def _swap(pyz, name: str, data: bytes, out) -> None:
    with zipfile.ZipFile(pyz) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, data if info.filename == name else src.read(info))


def _imported(pyz) -> str:
    """What the agent's ``layout`` module says it is, imported from ``pyz``
    by an isolated Python, as a node would."""
    ran = subprocess.run([sys.executable, "-I", "-S", "-c",
                          f"import sys; sys.path.insert(0, {str(pyz)!r}); "
                          "import ddp_orch_agent.layout as m; print(getattr(m, 'WHO', 'source'))"],
                         capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


def test_every_module_has_its_code_compiled_beside_its_source(tmp_path):
    pyz = tmp_path / "agent.pyz"
    bootstrap.zipapp(str(pyz), cache_dir="")
    names = set(zipfile.ZipFile(pyz).namelist())
    sources = {n for n in names if n.endswith(".py") and n != "__main__.py"}
    assert sources and {n + "c" for n in sources} <= names


@pytest.mark.parametrize("case, expected", [
    ("this python's code for that source", "compiled"),
    ("code for another source", "source"),  # checked: a stale .pyc is not run
    ("another python's magic", "source"),  # a node with another Python compiles
])
def test_a_node_runs_the_compiled_code_only_where_it_is_its_sources_for_its_python(
        tmp_path, case, expected):
    pyz = tmp_path / "agent.pyz"
    bootstrap.zipapp(str(pyz), cache_dir="")
    source = zipfile.ZipFile(pyz).read(MODULE)
    claimed = source if case != "code for another source" else source + b"\n# edited\n"
    magic = importlib.util.MAGIC_NUMBER if case != "another python's magic" else b"\x00\x00\r\n"
    swapped = tmp_path / "swapped.pyz"
    _swap(pyz, MODULE + "c", _pyc(claimed, b"WHO = 'compiled'\n", magic), swapped)
    assert _imported(swapped) == expected


def test_its_own_compiled_code_is_checked_against_the_source_beside_it(tmp_path):
    """Its .pyc are checked hash-based ones: a source changed in the archive
    after it was compiled is the one a node runs."""
    pyz = tmp_path / "agent.pyz"
    bootstrap.zipapp(str(pyz), cache_dir="")
    source = zipfile.ZipFile(pyz).read(MODULE)
    edited = tmp_path / "edited.pyz"
    _swap(pyz, MODULE, source + b"\nWHO = 'edited source'\n", edited)
    assert _imported(edited) == "edited source"


def test_the_archive_is_built_once_per_sources_and_python_then_read_from_the_cache(
        tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    first = bootstrap.zipapp(str(tmp_path / "a.pyz"), cache_dir=str(cache))
    assert len(list(cache.iterdir())) == 1
    built = []
    monkeypatch.setattr(bootstrap, "_build_zipapp",
                        lambda modules: built.append(1) or b"rebuilt")
    assert bootstrap.zipapp(str(tmp_path / "b.pyz"), cache_dir=str(cache)) == first
    assert built == [] and (tmp_path / "b.pyz").read_bytes() == (tmp_path / "a.pyz").read_bytes()
    changed = {**bootstrap.sources(), "ddp_orch_agent.extra": "X = 1\n"}
    monkeypatch.setattr(bootstrap, "sources", lambda: changed)
    bootstrap.zipapp(str(tmp_path / "c.pyz"), cache_dir=str(cache))
    assert built == [1] and len(list(cache.iterdir())) == 2  # new sources, a new entry


@pytest.mark.parametrize("damage", [
    lambda data: data[:len(data) // 2],  # cut short
    lambda data: _edited(data),  # whole, but not these sources
    lambda data: b"not a zip",
])
def test_a_cached_archive_that_is_not_whole_or_not_these_sources_is_built_again(
        tmp_path, damage):
    cache = tmp_path / "cache"
    good = bootstrap.zipapp(str(tmp_path / "a.pyz"), cache_dir=str(cache))
    (kept,) = cache.iterdir()
    kept.write_bytes(damage(kept.read_bytes()))
    assert bootstrap.zipapp(str(tmp_path / "b.pyz"), cache_dir=str(cache)) == good
    assert kept.read_bytes() == (tmp_path / "a.pyz").read_bytes()  # the cache mended too


def _edited(data: bytes) -> bytes:
    """``data``'s archive, whole, with one source changed."""
    import io

    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            raw = src.read(info)
            dst.writestr(info, raw + b"\n# edited\n" if info.filename == MODULE else raw)
    return out.getvalue()


def test_a_cache_that_cannot_be_written_only_costs_the_build(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    pyz = tmp_path / "agent.pyz"
    bootstrap.zipapp(str(pyz), cache_dir=str(blocked / "ddp-orch"))
    assert _imported(pyz) == "source"  # the real layout module: no WHO


def test_the_cache_is_under_xdg_cache_home_or_the_home():
    assert bootstrap.zipapp_cache_dir({"XDG_CACHE_HOME": "/c"}) == "/c/ddp-orch"
    assert bootstrap.zipapp_cache_dir({"XDG_CACHE_HOME": "rel"}).endswith("/.cache/ddp-orch")
