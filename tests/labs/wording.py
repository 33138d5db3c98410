"""How the tests weigh ddp-orch's words: whether a hint says anything its
message does not (``shared_words``)."""

from __future__ import annotations

import re


def shared_words(a: str, b: str, n: int = 4) -> set[str]:
    """The runs of ``n`` words that ``a`` and ``b`` both hold (case, and a
    comma ending a word, aside; ``0,1,6`` is one word)."""
    def runs(text: str) -> set[str]:
        words = [w.strip(",") for w in re.findall(r"[\w:./`'<>,-]+", text.lower())]
        return {" ".join(words[i:i + n]) for i in range(len(words) - n + 1)}
    return runs(a) & runs(b)
