"""docs/reliability.md's table is the fault matrix's declaration, rendered:
a bound written there is the bound its cells are tested against."""

from __future__ import annotations

from conftest import load_script


def script():
    return load_script("reliability-table")


def test_the_reliability_doc_holds_the_fault_matrixs_table_as_declared():
    table = script()
    with open(table.DOC, encoding="utf-8") as fh:
        doc = fh.read()
    assert doc == table.with_table(doc), \
        "docs/reliability.md is out of date: run scripts/reliability-table --write"
    assert table.BEGIN + table.table() + table.END in doc


def test_every_cell_is_declared_once_and_every_runnable_one_has_its_words_and_bound():
    import faultmatrix as m

    assert len({c.id for c in m.CELLS}) == len(m.CELLS)
    for cell in m.CELLS:
        verdict = cell.expect
        if isinstance(verdict, m.Excluded):
            assert verdict.why, cell.id
            continue
        assert verdict.ends in (m.SURVIVES, m.RESTARTS, m.FAILS, m.INTERRUPTED, m.REFUSED,
                                m.GOES_ON), cell.id
        if verdict.ends in (m.FAILS, m.REFUSED):
            assert verdict.pattern and verdict.shown, cell.id
    share = m.ci_share("abc", 10, ["local-attached-training-rank_raises", "not-a-cell"])
    assert "local-attached-training-rank_raises" in share and "not-a-cell" not in share
    assert len(share) in (10, 11)
    assert m.ci_share("abc", 10, []) == m.ci_share("abc", 10, [])  # the commit decides
    assert m.ci_share("abc", 10, []) != m.ci_share("abd", 10, [])
