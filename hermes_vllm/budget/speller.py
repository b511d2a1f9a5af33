"""Spelling text in one vocabulary's tokens: what the budgets force is written with these tokens.

The budget reads tokens as latin-1 text (one char a byte, :mod:`hermes_vllm.latin1`), so a token
that ends inside a UTF-8 character is still text; :class:`Speller` counts and spells such text by
greedy longest prefix, the measure every completion is compared by.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from hermes_vllm.latin1 import as_latin1
from hermes_vllm.memo import MISSING, TextKeyed

_LONGEST = 64
"""Longest token spelling tried when spelling text (characters)."""
_COUNTED_CHARS = 1 << 20
"""Text a :class:`Speller` keeps the counts of, in all."""


class Speller:
    """Greedy longest-prefix spelling of text in one vocabulary's tokens: what forcing writes."""

    def __init__(self, latin1: Sequence[str], exclude: Iterable[int] = ()) -> None:
        excluded = set(exclude)
        self._ids: dict[str, list[int]] = {}
        for token_id, piece in enumerate(latin1):
            if piece and token_id not in excluded:
                self._ids.setdefault(piece, []).append(token_id)
        self._longest = min(max((len(p) for p in self._ids), default=1), _LONGEST)
        self._counts: TextKeyed[str, int | None] = TextKeyed(_COUNTED_CHARS)
        self._prefixes: TextKeyed[str, tuple[int, ...]] = TextKeyed(_COUNTED_CHARS)

    def prefixes(self, text: str) -> tuple[int, ...]:
        """Tokens whose bytes are a prefix of ``text`` (latin-1), longest first.

        Kept per ``text``'s first ``longest`` characters (nothing after them can be in a token):
        a forced text is looked up at every fill while it is written, each draft row's and the
        fill again before the kept token, one dict lookup each after the first (up to 64 slices
        and lookups)."""
        head = text[: self._longest]
        found = self._prefixes.get(head)
        if found is not None:
            return found
        out: list[int] = []
        for k in range(len(head), 0, -1):
            out += self._ids.get(head[:k], ())
        return self._prefixes.keep(head, head, tuple(out))

    def tokens(self, text: str) -> int:
        """``text`` (not latin-1) measured in this vocabulary's tokens (its bytes where it cannot
        be spelled): how the completer compares completions."""
        latin1 = as_latin1(text)
        count = self.count(latin1)
        return len(latin1) if count is None else count

    def count(self, text: str) -> int | None:
        """Tokens of the greedy spelling of ``text`` (latin-1); ``None`` if it cannot be spelled.

        Kept per text: steering measures the same completions (a call's closing text and the
        mark) at every position inside a string value, and the completer measures candidates."""
        found = self._counts.get(text, MISSING)
        if found is not MISSING:
            return found  # type: ignore[return-value]
        return self._counts.keep(text, text, self._count(text))

    def _count(self, text: str) -> int | None:
        n, pos = 0, 0
        while pos < len(text):
            for k in range(min(len(text) - pos, self._longest), 0, -1):
                if text[pos : pos + k] in self._ids:
                    pos += k
                    n += 1
                    break
            else:
                return None
        return n
