"""scripts/docstring-share counts docstrings, not every string or comment."""

from __future__ import annotations

from conftest import load_script


def share_script():
    return load_script("docstring-share")


SOURCE = '''"""A module's docstring,
on two lines."""

# a comment is not a docstring
X = """a string that opens nothing"""


class Plain:
    value = "not a docstring either"

    def method(self):
        """One line."""
        return """nor this"""


async def waits():
    """Three
    lines
    here."""
'''


def test_only_the_strings_that_open_a_module_class_or_function_count(tmp_path):
    script = share_script()
    assert script.docstring_lines(SOURCE) == 2 + 1 + 3
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text(SOURCE)
    assert script.shares(str(tmp_path / "pkg")) == [("a.py", 6, len(SOURCE.splitlines()))]
