"""Secret masking: what never reaches a terminal, a stored file or a log in clear.

Values of environment variables whose names look secret (``*TOKEN*``,
``*SECRET*``, ``*PASSWORD*``, ``*KEY*``, ...) are masked in every rendering
of a plan and scrubbed from node output, because dry-run output and stored
plans end up in terminals, tickets and CI logs.
"""

from __future__ import annotations

import re
from typing import Mapping

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "********"


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secret-looking names masked."""
    return {k: (MASK if SECRET_NAME.search(k) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> tuple[bytes, ...]:
    """The values to scrub from logs: those of secret-looking names, 4+ chars."""
    return tuple(sorted({v.encode() for k, v in env.items()
                         if SECRET_NAME.search(k) and len(v) >= 4}, key=len, reverse=True))


def scrub(line: bytes, secrets: tuple[bytes, ...]) -> bytes:
    for value in secrets:
        line = line.replace(value, MASK.encode())
    return line


def mask_cluster_text(text: str) -> str:
    """The cluster file's text with the values of secret-looking ``env``
    entries replaced, wherever and however the YAML spells them.

    Masking by value misses what the text spells differently from the value
    (``"s3cr\\u0065t"``, a hex integer, a folded block), so the spans of the
    values come from the YAML nodes themselves: the top-level ``env`` and
    every node's. An alias points at its anchor's node, so the anchored
    original is masked too. Values are then also masked wherever they
    appear verbatim (a comment, another key).
    """
    import yaml  # only here: a dry run never stores the file

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return text  # the loader accepted it; this cannot happen, and masks by value below
    spans: list[tuple[int, int]] = []

    def env_spans(mapping: object) -> None:
        if isinstance(mapping, yaml.MappingNode):
            spans.extend((value.start_mark.index, value.end_mark.index)
                         for key, value in mapping.value
                         if isinstance(key, yaml.ScalarNode) and SECRET_NAME.search(str(key.value)))

    def entry(mapping: object, name: str) -> object:
        if isinstance(mapping, yaml.MappingNode):
            return next((v for k, v in mapping.value
                         if isinstance(k, yaml.ScalarNode) and k.value == name), None)
        return None

    env_spans(entry(root, "env"))
    nodes = entry(root, "nodes")
    for node in nodes.value if isinstance(nodes, yaml.SequenceNode) else ():
        env_spans(entry(node, "env"))
    for start, end in sorted(set(spans), reverse=True):
        end -= len(text[start:end]) - len(text[start:end].rstrip())  # a block keeps its line end
        text = text[:start] + f'"{MASK}"' + text[end:]
    return text
