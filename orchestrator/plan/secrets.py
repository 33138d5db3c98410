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
