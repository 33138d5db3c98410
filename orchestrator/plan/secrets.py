"""Secret masking: what never reaches a terminal, a stored file or a log in clear.

**The rule** (``is_secret``, the only place that decides): an environment
entry is a secret when its name looks secret (``*TOKEN*``, ``*SECRET*``,
``*PASSWORD*``, ``*KEY*``, ...) *and* its value could be a credential: at
least ``MIN_SECRET_CHARS`` characters, not a number, and not a word of
ordinary settings (``false``, ``disabled``...). So ``HF_TOKEN=hf_...`` is
a secret and ``TOKENIZERS_PARALLELISM=false`` is not: masking the word
``false`` would mangle every line that prints it, JSON included.

A secret's value is masked in every rendering of a plan (dry-run, stored
plan and cluster file), scrubbed from node output and fetched files, and
masked string by string inside control messages, never in their framing.
Nodes mask only the values the controller lists in their spec (its
``secrets``), so the rule is the same on local, SSH, kept and Slurm runs.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping

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


def masked_cluster_file(text: str, envs: Iterable[Mapping[str, str]]) -> str:
    """The cluster file ``text`` as it may be stored or uploaded: the secret
    env entries masked by their place in the YAML (``mask_cluster_text``),
    and the secrets of ``envs`` (each node's resolved env) by value wherever
    else they appear."""
    values = {v for env in envs for v in secret_values(env)}
    masked = mask_cluster_text(text).encode()
    return scrub(masked, tuple(sorted(values, key=len, reverse=True))).decode()


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
                         if isinstance(key, yaml.ScalarNode) and SECRET_NAME.search(str(key.value))
                         # a plain setting stays readable; anything else is masked
                         and not (isinstance(value, yaml.ScalarNode)
                                  and not is_secret(str(key.value), str(value.value))))

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
