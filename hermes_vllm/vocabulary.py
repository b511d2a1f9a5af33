"""A served model's vocabulary: the tokenizer as the engines, the budgets and the parsers read it.

:class:`Vocabulary` holds the tokenizer, the logits width and the stop tokens, with the tables
derived from them (each token's bytes, as latin-1 text); :class:`ServedVocabulary` is the API
server's one, with its :class:`~hermes_vllm.budget.Speller`. Below the grammar and the processor,
above the budget (whose speller it builds), so the budget reads no engine.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar, cast

import xgrammar as xgr

from hermes_vllm.budget.speller import Speller
from hermes_vllm.dialect import Dialect
from hermes_vllm.memo import MISSING, IdentityMemo

T = TypeVar("T")


def special_ids(tokenizer: Any) -> list[int]:
    """The ids ``tokenizer`` treats as special (dropped by ``skip_special_tokens``, never split).

    Part of the vocabulary's identity: the same strings as plain added tokens (Hermes 2 Pro,
    Qwen) or as special ones (Hermes 3) detokenize differently.
    """
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return sorted({i for i, token in added.items() if token.special} | set(tokenizer.all_special_ids))


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer as the engines need it, plus the model's logits width, and every table derived
    from them (:meth:`table`): one owner, so a table is built once per vocabulary, under a lock,
    and lives as long as the vocabulary does."""

    tokenizer: Any
    """A Hugging Face tokenizer (fast or slow)."""
    vocab_size: int
    """Width of the model's logits; may exceed the tokenizer's length (padded heads)."""
    stop_token_ids: tuple[int, ...]
    fingerprint: str = field(default="", compare=False)
    _tables: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _building: threading.RLock = field(default_factory=threading.RLock, compare=False, repr=False)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int | None = None, stop_token_ids: Sequence[int] | None = None
    ) -> Vocabulary:
        """The vocabulary of ``tokenizer`` at this width with these stop tokens: the same object
        for the same tokenizer object (the latest :data:`_KEPT_TOKENIZERS`), so every compiler and
        core of a process shares its tables."""
        key = (vocab_size, None if not stop_token_ids else tuple(stop_token_ids))
        kept = _KEPT.get((tokenizer,), dict)
        found = kept.get(key)
        if found is None:
            found = kept.setdefault(key, cls._read(tokenizer, vocab_size, stop_token_ids))
        return found

    @classmethod
    def _read(
        cls, tokenizer: Any, vocab_size: int | None, stop_token_ids: Sequence[int] | None
    ) -> Vocabulary:
        vocab = tokenizer.get_vocab()
        size = vocab_size or max(len(tokenizer), max(vocab.values()) + 1)
        stops = tuple(stop_token_ids) if stop_token_ids else (tokenizer.eos_token_id,)
        tokens = sorted(vocab.items(), key=lambda kv: kv[1])
        digest = hashlib.sha256(repr((size, stops, tokens, special_ids(tokenizer))).encode()).hexdigest()
        return cls(tokenizer, size, stops, digest[:16])

    @cached_property
    def tokenizer_info(self) -> xgr.TokenizerInfo:
        """xgrammar's view of the vocabulary (decoded bytes per token), shared by all users."""
        return xgr.TokenizerInfo.from_huggingface(
            self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=list(self.stop_token_ids)
        )

    @cached_property
    def decoded(self) -> list[bytes]:
        """The bytes each token id stands for."""
        return list(self.tokenizer_info.decoded_vocab)

    @cached_property
    def latin1(self) -> list[str]:
        """Each token's bytes as a latin-1 string (one char a byte: tags are ASCII)."""
        return [b.decode("latin-1") for b in self.decoded]

    def table(self, name: str, build: Callable[[], T]) -> T:
        """The table ``name`` derived from this vocabulary, built by ``build`` on first use (one
        build at a time: the engine's start-up thread may be building one). ``name`` is fixed by
        the code that derives it (with a dialect's name at most), never read from a request, so a
        vocabulary holds a bounded number of tables."""
        found = self._tables.get(name, MISSING)
        if found is MISSING:
            with self._building:
                found = self._tables.get(name, MISSING)
                if found is MISSING:
                    found = self._tables[name] = build()
        return cast(T, found)

    def has_table(self, name: str) -> bool:
        """Whether :meth:`table` ``name`` is built."""
        return name in self._tables

    def gate_allowed(self, dialect: Dialect) -> bool:
        """Whether free text may skip the engine: False when a token holds a whole call tag and
        more text, since such a token could open an invalid call in one step."""
        trigger = dialect.tool_call.begin
        return not self.table(f"straddling {trigger}", lambda: _straddles(self.latin1, trigger))


def _straddles(latin1: list[str], tag: str) -> bool:
    """Whether a token holds the whole ``tag`` and more after it."""
    return any(tag in t and not t.endswith(tag) for t in latin1)


_KEPT_TOKENIZERS = 8
"""Tokenizers whose vocabularies are kept (a server has one; tests and benchmarks a few)."""
_KEPT: IdentityMemo[dict[tuple[int | None, tuple[int, ...] | None], Vocabulary]]
_KEPT = IdentityMemo(_KEPT_TOKENIZERS)
"""Per tokenizer object, its vocabularies by width and stop tokens (fixed by the served model)."""


class ServedVocabulary:
    """The served tokenizer's bytes per token and its :class:`Speller`, for the API server (the
    admission check, counting reasoning tokens); built on first use, a pass over the vocabulary."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @cached_property
    def vocab(self) -> Vocabulary:
        return Vocabulary.from_tokenizer(self.tokenizer)

    @cached_property
    def speller(self) -> Speller:
        return Speller(self.vocab.latin1, self.vocab.stop_token_ids)

    def __call__(self) -> Speller:
        return self.speller


@functools.lru_cache(maxsize=2)
def served_vocabulary(tokenizer: Any) -> ServedVocabulary:
    """The :class:`ServedVocabulary` of ``tokenizer``, kept for the latest ones (vLLM builds the
    parsers per request, with the server's one tokenizer)."""
    return ServedVocabulary(tokenizer)
