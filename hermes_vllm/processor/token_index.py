"""Which tokens of a vocabulary hold a text, or begin with one: built once per vocabulary.

A request's ``stop`` strings are refused inside calls (and before an owed call): every fill there
bans the tokens that would complete one, that is the tokens holding it and, where the text ends
with its first characters, the tokens beginning with the rest. Each new string used to be found
by reading every token in Python (tens of milliseconds a string on a 152k vocabulary, on the
engine's step, and kept in tables no request ever emptied). The index answers both questions
from arrays built at start-up: where each byte value occurs in the vocabulary's bytes (a text is
looked for at the positions of its rarest byte, then checked byte by byte, all in numpy), and the
sorted distinct spellings (the tokens beginning with a text are one range, two bisects). Answers
are kept up to :data:`CACHED_IDS` token ids in all, then the table is emptied whole: clients
choose the strings, so no table keyed by them may grow without bound.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hermes_vllm.grammar.engines.head import SortedVocabulary
from hermes_vllm.vocabulary import Vocabulary

CACHED_IDS = 1 << 20
"""Token ids the answers kept hold in all (8 MiB), before the table is emptied."""


class TokenIndex:
    """Tokens holding, or beginning with, a byte string (latin-1 text: one char a byte)."""

    def __init__(self, decoded: Sequence[bytes]) -> None:
        self.size = len(decoded)
        self.blob = np.frombuffer(b"".join(decoded), dtype=np.uint8)
        """Every token's bytes, one after another."""
        lengths = np.fromiter(map(len, decoded), dtype=np.int64, count=len(decoded))
        self.owner = np.repeat(np.arange(len(decoded), dtype=np.int64), lengths)
        """The token each byte of :attr:`blob` belongs to."""
        counts = np.bincount(self.blob, minlength=256)
        self._counts = counts
        self._byte_at = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._by_byte = np.argsort(self.blob, kind="stable").astype(np.int64)
        """Positions in :attr:`blob`, grouped by their byte value (``_byte_at`` its offsets)."""
        self._sorted = SortedVocabulary(decoded, frozenset())
        self._kept: dict[tuple[bool, str], np.ndarray] = {}
        self._kept_ids = 0
        self._any: dict[bytes, np.ndarray] = {}
        """Keyed by the dialects' tag bytes (a handful), never by a client's input."""

    def holding_byte(self, byte: int) -> np.ndarray:
        """Boolean array over the vocabulary: does the token hold ``byte``?"""
        out = np.zeros(self.size, dtype=bool)
        out[self.owner[self._positions(byte)]] = True
        return out

    def holding_any(self, watch: bytes) -> np.ndarray:
        """Boolean array over the vocabulary: does the token hold any byte of ``watch``? (what a
        gate watches: the first bytes of a dialect's tags).
        Kept per ``watch``: a gate reads it at every token that may touch a tag."""
        found = self._any.get(watch)
        if found is None:
            found = np.zeros(self.size, dtype=bool)
            for byte in watch:
                found |= self.holding_byte(byte)
            self._any[watch] = found
        return found

    def holding(self, text: str) -> np.ndarray:
        """The tokens whose bytes hold ``text`` (latin-1, not empty), in id order."""
        return self._kept_answer(True, text)

    def starting(self, text: str) -> np.ndarray:
        """The tokens whose bytes begin with ``text`` (latin-1, not empty)."""
        return self._kept_answer(False, text)

    def kept_ids(self) -> int:
        """The token ids the kept answers hold now (at most :data:`CACHED_IDS`)."""
        return self._kept_ids

    def _kept_answer(self, holding: bool, text: str) -> np.ndarray:
        key = (holding, text)
        found = self._kept.get(key)
        if found is not None:
            return found
        data = text.encode("latin-1")
        found = self._holding(data) if holding else self._starting(data)
        bound = CACHED_IDS  # read here: a test lowers it
        if found.size <= bound:
            if self._kept_ids + found.size > bound:
                self._kept.clear()
                self._kept_ids = 0
            self._kept[key] = found
            self._kept_ids += found.size
        return found

    def _positions(self, byte: int) -> np.ndarray:
        return self._by_byte[self._byte_at[byte] : self._byte_at[byte + 1]]

    def _holding(self, data: bytes) -> np.ndarray:
        """Found at the positions of ``data``'s rarest byte: each checked byte by byte, and the
        whole of it inside one token."""
        anchor = min(range(len(data)), key=lambda j: int(self._counts[data[j]]))
        starts = self._positions(data[anchor]) - anchor
        starts = starts[(starts >= 0) & (starts + len(data) <= self.blob.size)]
        for j, byte in enumerate(data):
            if j != anchor and starts.size:
                starts = starts[self.blob[starts + j] == byte]
        owners = self.owner[starts]
        owners = owners[owners == self.owner[starts + len(data) - 1]]
        return np.unique(owners)

    def _starting(self, data: bytes) -> np.ndarray:
        lo, hi = self._sorted.prefixed(data)
        return self._sorted.ids_in(lo, hi)


def token_index(vocab: Vocabulary) -> TokenIndex:
    """The :class:`TokenIndex` of ``vocab``, one of its tables (:meth:`Vocabulary.table`): built
    once per vocabulary, shared by every core of the tokenizer."""
    return vocab.table("token index", lambda: TokenIndex(vocab.decoded))
