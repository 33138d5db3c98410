"""Secret masking: what never reaches a terminal, a stored file or a log in clear.

``is_secret`` alone decides: a secret-looking name *and* a value that could
be a credential, not a number or a settings word, whose masking would mangle
every line that prints it. Nodes mask only the values the controller lists
in their spec, so the rule is the same for every backend.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from ..config.spec import ClusterSpec

SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL", re.IGNORECASE)
MASK = "********"
MIN_SECRET_CHARS = 8  # API tokens are 20-100 characters; setting words are short
# Values that are settings, not credentials, however their variable is named.
SETTING_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null",
                           "enabled", "disabled", "required", "optional", "default", "auto"})


def is_secret(name: str, value: str) -> bool:
    """Whether the env entry ``name=value`` is a secret (the module's rule)."""
    if not SECRET_NAME.search(name) or len(value) < MIN_SECRET_CHARS:
        return False
    if value.strip().lower() in SETTING_WORDS:
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False  # a number: a port, a size, a seed


def mask_env(env: Mapping[str, str]) -> dict[str, str]:
    """A copy of ``env`` with the values of secrets masked."""
    return {k: (MASK if is_secret(k, v) else v) for k, v in env.items()}


def secret_values(env: Mapping[str, str]) -> tuple[bytes, ...]:
    """The values to scrub from what nodes send: the secrets', longest first."""
    return tuple(sorted({v.encode() for k, v in env.items() if is_secret(k, v)},
                        key=len, reverse=True))


def scrub(line: bytes, secrets: tuple[bytes, ...]) -> bytes:
    for value in secrets:
        line = line.replace(value, MASK.encode())
    return line


def stored_cluster_file(spec: "ClusterSpec") -> str:
    """A ``ClusterSpec``'s file as stored and uploaded, masked with every env it
    holds (a top-level secret that every node overrides is still one)."""
    return masked_cluster_file(spec.text, (spec.env, *(node.env for node in spec.nodes)))


def masked_cluster_file(text: str, envs: Iterable[Mapping[str, str]]) -> str:
    """The cluster file ``text`` as it may be stored: secret env entries masked
    by their place, and the secrets of ``envs`` by value elsewhere."""
    values = {v for env in envs for v in secret_values(env)}
    return mask_cluster_text(text, tuple(v.decode() for v in values))


def mask_cluster_text(text: str, values: Iterable[str] = ()) -> str:
    """The cluster file's text with secret ``env`` values, and any scalar or
    comment holding one of ``values``, masked, parsing to the same structure.
    Done on the YAML nodes: masking by value misses other spellings
    (``"s3cr\\u0065t"``) and can break the YAML (``[********]``)."""
    import yaml  # only here: a dry run never stores the file

    secrets = tuple(sorted({v for v in values if v}, key=len, reverse=True))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        events = list(yaml.parse(text, Loader=yaml.SafeLoader))
        tokens = list(yaml.scan(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        # The loader accepted it, so this cannot happen; mask by value.
        return _scrub_text(text, secrets)
    anchors = {event.start_mark.index: event.anchor for event in events
               if getattr(event, "anchor", None) and not isinstance(event, yaml.AliasEvent)}
    whole: set[int] = set()  # start of each node masked whole (a secret env value)
    nodes: dict[int, yaml.Node] = {}  # start -> node, each node of the document once

    def entry(mapping: object, name: str) -> object:
        if isinstance(mapping, yaml.MappingNode):
            return next((v for k, v in mapping.value
                         if isinstance(k, yaml.ScalarNode) and k.value == name), None)
        return None

    def env_entries(mapping: object) -> None:  # (the loader refuses merge keys)
        if isinstance(mapping, yaml.MappingNode):
            for key, value in mapping.value:
                if (isinstance(key, yaml.ScalarNode) and SECRET_NAME.search(str(key.value))
                        # a plain setting stays readable; anything else is masked
                        and not (isinstance(value, yaml.ScalarNode)
                                 and not is_secret(str(key.value), str(value.value)))):
                    whole.add(value.start_mark.index)
                    nodes[value.start_mark.index] = value

    env_entries(entry(root, "env"))
    listed = entry(root, "nodes")
    for node in listed.value if isinstance(listed, yaml.SequenceNode) else ():
        env_entries(entry(node, "env"))

    def holding(node: object, seen: set[int]) -> None:  # scalars (keys too) holding a secret
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            if any(secret in node.value for secret in secrets):
                nodes.setdefault(node.start_mark.index, node)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                holding(item, seen)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                holding(key, seen)
                holding(value, seen)

    if secrets:
        holding(root, set())
    edits: list[tuple[int, int, str]] = []
    for start in sorted(nodes):
        node = nodes[start]
        if edits and start < edits[-1][1]:
            continue  # inside a node already masked whole
        end = node.end_mark.index
        end -= len(text[start:end]) - len(text[start:end].rstrip())  # a block keeps its line end
        value = MASK if start in whole else _scrub_text(node.value, secrets)
        anchor = f"&{anchors[start]} " if start in anchors else ""
        edits.append((start, end, anchor + _quoted(value)))
    # Comments lie between the tokens (outside a node masked whole); mask them by value.
    node_edits = list(edits)
    covered = sorted((t.start_mark.index, t.end_mark.index) for t in tokens)
    at = 0
    for start, end in covered + [(len(text), len(text))]:
        if start > at and secrets:
            gap = text[at:start]
            if any(secret in gap for secret in secrets) and \
                    not any(a <= at and start <= b for a, b, _ in node_edits):
                edits.append((at, start, _scrub_text(gap, secrets)))
        at = max(at, end)
    for start, end, new in sorted(edits, reverse=True):
        text = text[:start] + new + text[end:]
    return text


def _scrub_text(text: str, secrets: tuple[str, ...]) -> str:
    for value in secrets:
        text = text.replace(value, MASK)
    return text


def _quoted(value: str) -> str:
    """``value`` as one double-quoted YAML scalar on one line."""
    if value == MASK:
        return f'"{MASK}"'
    import yaml

    out = yaml.dump(value, default_style='"', allow_unicode=True, width=2 ** 31 - 1)
    return out.rstrip("\n").removesuffix("\n...").rstrip("\n")
