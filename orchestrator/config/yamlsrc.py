"""YAML with line numbers: every value knows its field path and its line
(``safe_load`` drops them), so errors read ``cluster.yaml:14: nodes[1].gpus: ...``.
"""

from __future__ import annotations

import re
import reprlib
from typing import Any, Iterable, Iterator

import yaml

from ..errors import ConfigError

# Integers longer than this are no one's GPU index or port; Python also
# refuses to print ones over 4300 digits, so they are rejected on reading.
MAX_INT_BITS = 3000
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")
_MERGE_TAG = "tag:yaml.org,2002:merge"


class Located:
    """A YAML node with its field path; accessors raise ``ConfigError``."""

    def __init__(self, node: yaml.Node, path: str, source: str, loader: yaml.SafeLoader):
        self.node = node
        self.path = path
        self.source = source
        self._loader = loader

    @property
    def line(self) -> int:
        return self.node.start_mark.line + 1

    def error(self, message: str, hint: str = "") -> ConfigError:
        return ConfigError(message, path=self.path, source=self.source,
                           line=self.line, hint=hint)

    def _child(self, node: yaml.Node, suffix: str) -> "Located":
        if suffix.startswith("[") or not self.path:
            path = self.path + suffix
        else:
            path = f"{self.path}.{suffix}"
        return Located(node, path, self.source, self._loader)

    def mapping(self, allowed: Iterable[str] | None) -> dict[str, "Located"]:
        """The entries of a mapping; unknown (unless ``allowed`` is None) or
        repeated keys are errors."""
        if not isinstance(self.node, yaml.MappingNode):
            raise self.error(f"expected a mapping (key: value lines), got {self.describe()}")
        allowed = None if allowed is None else tuple(allowed)
        out: dict[str, Located] = {}
        for index, (key_node, value_node) in enumerate(self.node.value):
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            where = Located(key_node, self.path, self.source, self._loader)
            if not isinstance(key, str) or not key:
                raise where.error("keys must be plain names")
            if key_node.tag == _MERGE_TAG:
                raise self._child(key_node, key).error(
                    "YAML merge keys (<<: *anchor) are not supported",
                    hint="write the keys out in full")
            if allowed is not None and key not in allowed:
                self._refuse_split_value(index)
                hint = closest_hint(key, allowed) or "allowed keys: " + ", ".join(allowed)
                raise self._child(key_node, key).error(f"unknown key '{key}'", hint)
            if key in out:
                raise self._child(key_node, key).error(f"'{key}' is given twice")
            out[key] = self._child(value_node, key)
        return out

    def _refuse_split_value(self, index: int) -> None:
        """``{host: a, gpus: 0,1}``: in a one-line mapping the comma ends the value,
        leaving a digit-only key with no value. Said so, at the key whose value
        was cut, with the value the user meant, quoted."""
        entries = self.node.value
        if not (getattr(self.node, "flow_style", False) and index > 0
                and _bare_number_key(*entries[index])):
            return
        start = index - 1
        while start > 0 and _bare_number_key(*entries[start]):
            start -= 1  # {gpus: 0,1,2}: '1' and '2' both split off gpus
        key_node, value_node = entries[start]
        if not (isinstance(value_node, yaml.ScalarNode) and value_node.style is None
                and isinstance(key_node, yaml.ScalarNode) and value_node.value):
            return
        end = index + 1
        while end < len(entries) and _bare_number_key(*entries[end]):
            end += 1
        meant = ",".join([value_node.value] + [k.value for k, _ in entries[start + 1:end]])
        raise self._child(key_node, key_node.value).error(
            f"'{key_node.value}: {meant}' was split at its commas: inside {{...}} a comma "
            f"ends the value, so YAML read {key_node.value}: {value_node.value} and "
            + " and ".join(f"a key '{k.value}'" for k, _ in entries[start + 1:end]),
            hint=f'quote the list: {key_node.value}: "{meant}"')

    def has_key(self, key: str) -> bool:
        """A mapping with ``key`` (checked without reading any value)."""
        return isinstance(self.node, yaml.MappingNode) and any(
            isinstance(k, yaml.ScalarNode) and k.value == key for k, _ in self.node.value)

    def sequence(self) -> list["Located"]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list, got {self.describe()}")
        return [self._child(item, f"[{i}]") for i, item in enumerate(self.node.value)]

    def value(self) -> Any:
        """The plain Python value of this node. Each scalar is read first, so a value
        YAML cannot convert (``2020-13-45``) is reported at its own line.
        """
        for node in _scalar_nodes(self.node):
            self._read_scalar(node)
        try:
            return self._loader.construct_object(self.node, deep=True)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            message, hint = _construct_problem(str(exc.problem or exc.context))
            raise ConfigError(message, path=self.path, source=self.source,
                              line=mark.line + 1 if mark else self.line, hint=hint) from None
        except RecursionError:
            raise self.error("the value is nested too deeply") from None

    def _read_scalar(self, node: yaml.ScalarNode) -> Any:
        where = Located(node, self.path, self.source, self._loader)
        kind = _KINDS.get(node.tag.rsplit(":", 1)[-1], node.tag)
        try:
            value = self._loader.construct_object(node, deep=True)
        except yaml.MarkedYAMLError as exc:
            raise where.error(f"cannot read {shown(node.value)}: {exc.problem or exc.context}",
                              hint=_PLAIN_HINT) from None
        except Exception as exc:  # int(), float(), date(), b64decode() on the user's text
            if "digits" in str(exc):  # int(): over Python's 4300-digit limit
                raise where.error(_too_large(node.value)) from None
            detail = f": {exc}" if kind == "a date" and isinstance(exc, ValueError) else ""
            raise where.error(f"cannot read {shown(node.value)} as {kind}{detail}",
                              hint="fix the value, or quote it to keep it as text") from None
        if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
            raise where.error(_too_large(node.value))
        return value

    def scalar(self) -> Any:
        if not isinstance(self.node, yaml.ScalarNode):
            raise self.error(f"expected a single value, got {self.describe()}")
        return self.value()

    def string(self) -> str:
        value = self.scalar()
        if not isinstance(value, str) or not value.strip():
            raise self.error(f"expected a non-empty string, got {self.describe()}")
        return value

    def integer(self, low: int, high: int) -> int:
        value = self.scalar()
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"expected a whole number, got {self.describe()}")
        if not low <= value <= high:
            raise self.error(f"{value} is out of range {low}-{high}")
        return value

    def describe(self) -> str:
        if isinstance(self.node, yaml.MappingNode):
            return "a mapping"
        if isinstance(self.node, yaml.SequenceNode):
            return "a list"
        try:
            value = self.value()
        except ConfigError:
            return f"the text {shown(self.node.value)}"
        if value is None:
            return "nothing (null)"
        return f"{type(value).__name__} {shown(value, 40)}"


_KINDS = {"timestamp": "a date", "int": "a whole number", "float": "a number",
          "bool": "true or false", "binary": "base64 data"}
_PLAIN_HINT = "cluster files hold plain strings, numbers, lists and mappings; remove any !tag"


def _construct_problem(problem: str) -> tuple[str, str]:
    """PyYAML's reason a list or mapping cannot be built, reworded, and a hint."""
    if "unhashable" in problem:
        return ("a list or mapping is used as a key",
                "a mapping key must be a single value, not a list or mapping")
    if "recursive" in problem:
        return ("an alias makes this value contain itself",
                "an alias (*name) cannot point at the list or mapping that contains it")
    return f"cannot read this value: {problem}", _PLAIN_HINT


def _too_large(raw: str) -> str:
    return f"{shown(raw)} is too large a number ({len(raw)} characters)"


def _scalar_nodes(root: yaml.Node) -> Iterator[yaml.ScalarNode]:
    """Every scalar under ``root``, each once (aliases may share and even loop)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            yield node
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed(node.value))
        elif isinstance(node, yaml.MappingNode):
            stack.extend(item for pair in reversed(node.value) for item in reversed(pair))


class _Shown(reprlib.Repr):
    """``repr`` cut short: bounded however long, deep or self-referencing."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = 60
        self.maxlevel, self.maxlist, self.maxdict = 2, 8, 8

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > MAX_INT_BITS:
            return f"<a {x.bit_length()}-bit number>"
        return super().repr_int(x, level)


def shown(value: Any, limit: int = 80) -> str:
    """A user's value for an error message: its repr, cut to ``limit`` characters."""
    text = _Shown().repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _bare_number_key(key: yaml.Node, value: yaml.Node) -> bool:
    """A key of digits alone with no value: what a comma leaves of ``0,1``."""
    return (isinstance(key, yaml.ScalarNode) and key.style is None and key.value.isdigit()
            and isinstance(value, yaml.ScalarNode) and value.value == "" and value.style is None)


def closest_hint(word: str, options: Iterable[str]) -> str:
    """``did you mean 'gpus'?`` for a misspelt ``gpu``, or "" if nothing is close."""
    import difflib  # only a mistake pays for it

    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def line_at(text: str, position: int) -> int:
    """The 1-based line of ``text[position]``, counting breaks as YAML does."""
    return len(_LINE_BREAK.findall(text, 0, position)) + 1


def _compose_fast(text: str) -> tuple[yaml.SafeLoader, yaml.Node] | None:
    """``text`` composed by libyaml (``CSafeLoader``) when PyYAML has it and the
    text is plain (ASCII, printable, no tabs); else, or on any problem, None,
    and the pure-Python parser reads it. Why: about 30 ms against under 1 ms
    for ``cluster.yaml.example``. libyaml's "" style is set back to None, and a
    file with an omitted value (``gpus:``) is left to PyYAML, which marks it right.
    """
    fast = getattr(yaml, "CSafeLoader", None)
    if fast is None or not text.isascii() or "\t" in text \
            or yaml.reader.Reader.NON_PRINTABLE.search(text):
        return None
    try:
        loader = fast(text)
        node = loader.get_single_node()
    except (yaml.YAMLError, RecursionError):
        return None
    if node is None:
        return None
    pending, seen = [node], set()
    while pending:  # each node once: aliases share nodes, and may make cycles
        item = pending.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, yaml.ScalarNode):
            if item.style == "" and item.value == "":
                return None  # an omitted value: libyaml marks it a line later than PyYAML
            if item.style == "":
                item.style = None
        elif isinstance(item, yaml.SequenceNode):
            pending.extend(item.value)
        elif isinstance(item, yaml.MappingNode):
            pending.extend(part for pair in item.value for part in pair)
    return loader, node


def parse(text: str, source: str) -> Located:
    """Compose ``text`` into a ``Located`` root; syntax errors carry a line."""
    composed = _compose_fast(text)
    if composed is not None:
        return Located(composed[1], "", source, composed[0])
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:  # a control character anywhere in the text
        raise ConfigError(f"unacceptable character #x{exc.character:04x}: "
                          "control characters are not allowed", source=source,
                          line=line_at(text, exc.position),
                          hint="remove it; a cluster file is plain UTF-8 text") from None
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem, hint = _syntax_problem(exc)
        raise ConfigError(f"YAML syntax error: {problem}", source=source,
                          line=mark.line + 1 if mark else None, hint=hint) from None
    except RecursionError:
        raise ConfigError("YAML syntax error: lists or mappings are nested too deeply",
                          source=source, line=loader.get_mark().line + 1,
                          hint="a cluster file needs only a few levels") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error: {exc}", source=source) from None
    if node is None:
        raise ConfigError("the file is empty", source=source, line=1,
                          hint="start from cluster.yaml.example")
    return Located(node, "", source, loader)


def _syntax_problem(exc: yaml.MarkedYAMLError) -> tuple[str, str]:
    """PyYAML's wording, made readable where it is cryptic, and a hint."""
    problem = exc.problem or exc.context or "invalid YAML"
    context = exc.context or ""
    if context.startswith("expected a single document"):
        return ("a second YAML document starts here",
                "a cluster file is one document: remove this `---` and what follows")
    if context.startswith("found duplicate anchor"):
        first = exc.context_mark.line + 1 if exc.context_mark else "?"
        return (context.split(";")[0] + f" (first defined on line {first})",
                "give each &anchor its own name")
    if problem.startswith("found undefined alias"):
        return problem, "define the anchor (&name) before its first use (*name)"
    if "'\\t'" in problem:
        return problem, "indent with spaces: YAML does not allow tabs for indentation"
    return problem, "check indentation and quoting on this line"
