"""YAML with line numbers: every value knows its field path and its line.

PyYAML's ``compose`` keeps the source position of each node; plain
``safe_load`` throws it away. ``Located`` wraps a composed node so the
validator can say ``cluster.yaml:14: nodes[1].gpus: ...`` for any value.
"""

from __future__ import annotations

import difflib
from typing import Any, Iterable

import yaml

from .errors import ConfigError


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
        for key_node, value_node in self.node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            where = Located(key_node, self.path, self.source, self._loader)
            if not isinstance(key, str) or not key:
                raise where.error("keys must be plain names")
            if allowed is not None and key not in allowed:
                hint = closest_hint(key, allowed) or "allowed keys: " + ", ".join(allowed)
                raise self._child(key_node, key).error(f"unknown key '{key}'", hint)
            if key in out:
                raise self._child(key_node, key).error(f"'{key}' is given twice")
            out[key] = self._child(value_node, key)
        return out

    def sequence(self) -> list["Located"]:
        if not isinstance(self.node, yaml.SequenceNode):
            raise self.error(f"expected a list, got {self.describe()}")
        return [self._child(item, f"[{i}]") for i, item in enumerate(self.node.value)]

    def value(self) -> Any:
        """The plain Python value of this node (scalars, lists, mappings)."""
        return self._loader.construct_object(self.node, deep=True)

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
        value = self.value()
        if value is None:
            return "nothing (null)"
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        return f"{type(value).__name__} {shown}"


def closest_hint(word: str, options: Iterable[str]) -> str:
    """``did you mean 'gpus'?`` for a misspelt ``gpu``, or "" if nothing is close."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"did you mean '{close[0]}'?" if close else ""


def parse(text: str, source: str) -> Located:
    """Compose ``text`` into a ``Located`` root; syntax errors carry a line."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"YAML syntax error: {problem}", source=source, line=line,
                          hint="check indentation and quoting on this line") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error: {exc}", source=source) from None
    if node is None:
        raise ConfigError("the file is empty", source=source, line=1,
                          hint="start from cluster.yaml.example")
    return Located(node, "", source, loader)
