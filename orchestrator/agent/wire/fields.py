"""The one field checker for every record that crosses into the agent or back.

Each record is a table of ``Field``s, read by one of two policies:
``first_bad`` refuses a spec or a message whole, naming its first bad field;
``keep_good`` drops a record's bad fields with a note, never raising. A name
ending in "?" may be absent. A bool is never a number here, as in JSON.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, NamedTuple


class Field(NamedTuple):
    """What a field's value must be (``check``) and the words for it (``wanted``)."""

    check: Callable[[Any], bool]
    wanted: str


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_time(value: Any) -> bool:
    """A wall-clock time or a duration: finite, 0 or more and below 1e11
    (year 5138), so ``time.localtime`` and arithmetic on it cannot fail."""
    return is_number(value) and math.isfinite(value) and 0 <= value < 1e11


def is_count(value: Any) -> bool:
    """An int of at least 0, and no bool: a count (a rank's samples so far)."""
    return is_int(value) and value >= 0


def of_types(*types: type) -> Field:
    """A value of one of ``types`` (a bool only where ``bool`` is one of them)."""
    return Field(lambda v: isinstance(v, types) and (bool in types or not isinstance(v, bool)),
                 " or ".join(t.__name__ for t in types))


def optional(field: Field) -> Field:
    return Field(lambda v: v is None or field.check(v), f"{field.wanted} or null")


TEXT = Field(lambda v: isinstance(v, str), "a string")
INT = Field(is_int, "an integer")
NUMBER = Field(is_number, "a number")
PATH = Field(lambda v: isinstance(v, str) and bool(v), "a directory path")
FLAG = Field(lambda v: isinstance(v, bool), "true or false")
RECORD = Field(lambda v: isinstance(v, dict), "an object")
LIST = Field(lambda v: isinstance(v, list), "a list")
STRINGS = Field(lambda v: isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v),
                "a list of strings")
COMMAND = Field(lambda v: STRINGS.check(v) and bool(v), "a command (a non-empty list of strings)")
ENV = Field(lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                  for k, x in v.items()),
            "a map of strings to strings")
PORT = Field(lambda v: is_int(v) and 0 <= v < 65536, "a port (0 to 65535)")
TIME = Field(is_time, "a time")


def count(minimum: int = 0, wanted: str = "") -> Field:
    return Field(lambda v: is_count(v) and v >= minimum,
                 wanted or f"a count ({minimum} or more)")


def seconds(positive: bool = False) -> Field:
    if positive:
        return Field(lambda v: is_number(v) and v > 0, "seconds (more than 0)")
    return Field(lambda v: is_number(v) and v >= 0, "seconds (0 or more)")


def one_of(values: Iterable[Any]) -> Field:
    values = tuple(values)
    return Field(lambda v: v in values, "one of " + ", ".join(map(str, values)))


def records_of(table: Mapping[str, Field], wanted: str) -> Field:
    """A list of objects, each with ``table``'s fields."""
    return Field(lambda v: isinstance(v, list) and all(
        isinstance(x, dict) and first_bad(x, table) is None for x in v), wanted)


def first_bad(data: Mapping[str, Any], fields: Mapping[str, Field]) -> tuple[str, Field] | None:
    """The first field ``data`` lacks (but for a "?" one) or holds wrong."""
    for name, field in fields.items():
        key = name[:-1] if name.endswith("?") else name
        if key != name and key not in data:
            continue
        if key not in data or not field.check(data[key]):
            return key, field
    return None


def why_bad(data: Mapping[str, Any], fields: Mapping[str, Field]) -> str | None:
    """``first_bad``'s field in words; None when every field is good."""
    bad = first_bad(data, fields)
    if bad is None:
        return None
    name, field = bad
    return f"{name!r} is {str(data.get(name))[:200]!r}: {field.wanted}"


def unknown(data: Mapping[str, Any], fields: Mapping[str, Field], *also: str) -> list[str]:
    """The names in ``data`` that neither ``fields`` nor ``also`` declare, sorted."""
    known = {name.rstrip("?") for name in fields} | set(also)
    return sorted(str(name) for name in set(data) - known)


def keep_good(record: Mapping[str, Any], fields: Mapping[str, Field], what: str,
              notes: list[str]) -> dict:
    """``record`` less each field present with a bad value, noting each."""
    out = dict(record)
    for name, field in fields.items():
        key = name.rstrip("?")
        if key in out and not field.check(out[key]):
            notes.append(f"ignored {what}'s {key!r}: {shown(out.pop(key))}")
    return out


def shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
