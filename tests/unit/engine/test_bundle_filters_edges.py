"""``engine/bundle.py``'s filters, pattern by pattern, as its docstring
states the syntax (a subset of gitignore); expected values by hand."""

from __future__ import annotations

import tarfile

import pytest

from orchestrator.engine.bundle import (_Pattern, _last_match, _match_parts, _normalize,
                                        _secret_looking, _skip, parse_patterns)


def test_parse_patterns_reads_the_documented_subset():
    text = ("# a comment\n\n/\n!\n*.ckpt   \n!keep.ckpt\n\\#hash\n\\!bang\ndata/\n/build\ndocs/*.md\n"
            "**/tmp/*.log\n**\nlogX/\n/Xdir/y\n sp/x\n")
    assert parse_patterns(text)[-3:] == (
        _Pattern(("logX",), False, True, False),
        _Pattern(("Xdir", "y"), False, False, True),
        _Pattern((" sp", "x"), False, False, True),
    )
    assert parse_patterns(text)[:-3] == (
        _Pattern(("*.ckpt",), False, False, False),
        _Pattern(("keep.ckpt",), True, False, False),
        _Pattern(("#hash",), False, False, False),
        _Pattern(("!bang",), False, False, False),
        _Pattern(("data",), False, True, False),
        _Pattern(("build",), False, False, True),
        _Pattern(("docs", "*.md"), False, False, True),
        _Pattern(("**", "tmp", "*.log"), False, False, True),
        _Pattern(("*",), False, False, False),
    )


def test_an_unanchored_pattern_matches_the_base_name_at_any_depth():
    p = parse_patterns("*.ckpt")[0]
    assert p.matches("a/b/m.ckpt", False) and p.matches("m.ckpt", False)
    assert not p.matches("m.ckpt/x", False)


def test_a_directory_pattern_matches_directories_only():
    p = parse_patterns("data/")[0]
    assert p.matches("x/data", True) and not p.matches("x/data", False)


def test_an_anchored_pattern_matches_from_the_top_only():
    p = parse_patterns("/build")[0]
    assert p.matches("build", True) and not p.matches("src/build", True)
    docs = parse_patterns("docs/*.md")[0]
    assert docs.matches("docs/a.md", False) and not docs.matches("docs/x/a.md", False)


@pytest.mark.parametrize("pattern,path,expected", [
    ((), (), True),
    ((), ("a",), False),
    (("a", "**"), ("a",), False),
    (("a", "**"), ("a", "b"), True),
    (("a", "**"), ("a", "b", "c"), True),
    (("**",), (), False),
    (("**", "b"), ("b",), True),
    (("**", "b"), ("x", "y", "b"), True),
    (("**", "b"), ("x", "y"), False),
    (("a", "**", "b"), ("a", "b"), True),
    (("a", "**", "b"), ("a", "x", "y", "b"), True),
    (("a", "*"), ("a",), False),
    (("a", "b"), ("a", "b", "c"), False),
    (("A",), ("a",), False),
])
def test_match_parts(pattern, path, expected):
    assert _match_parts(pattern, path) is expected


def test_the_last_matching_pattern_decides():
    patterns = parse_patterns("*.log\n!keep.log\n")
    assert _last_match(patterns, "x/a.log", False) is True
    assert _last_match(patterns, "keep.log", False) is False
    assert _last_match(patterns, "a.txt", False) is None
    assert _last_match(parse_patterns("!keep.log\n*.log\n"), "keep.log", False) is True


@pytest.mark.parametrize("name,expected", [
    (".env", True), (".hidden", True), ("ID_RSA.pub", True), ("server.PEM", True),
    ("credentials", True), ("client_secret_1.json", True), ("prod.env", True),
    ("train.py", False), ("environment.yaml", False), ("key.txt", False),
])
def test_secret_looking_names(name, expected):
    assert _secret_looking(name) is expected


def info(name: str, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type = kind
    ti.uid, ti.gid, ti.uname, ti.gname = 1000, 1000, "me", "me"
    return ti


def test_skip_drops_caches_compiled_files_links_and_the_dev_script():
    for name in ("code/.git/config", "code/x/__pycache__/a.py", "code/a.pyc", "code/a.pyo",
                 "code/workloads/make_tiny_datasets.py"):
        assert _skip(info(name)) is None, name
    assert _skip(info("code/link", tarfile.SYMTYPE)) is None
    kept = _skip(info("code/workloads/linear.py"))
    assert (kept.uid, kept.gid, kept.uname, kept.gname) == (0, 0, "", "")
    assert _skip(info("code/workloads", tarfile.DIRTYPE)) is not None


def test_normalize_keeps_files_only_with_no_owner():
    assert _normalize(info("project/x", tarfile.DIRTYPE)) is None
    assert _normalize(info("project/x", tarfile.SYMTYPE)) is None
    kept = _normalize(info("project/x"))
    assert (kept.uid, kept.gid, kept.uname, kept.gname) == (0, 0, "", "")
