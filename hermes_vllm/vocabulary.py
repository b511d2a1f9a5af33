"""A served model's vocabulary: the tokenizer as the engines, the budgets and the parsers read it.

:class:`Vocabulary` holds the tokenizer, the logits width and the stop tokens, with the tables
derived from them (each token's bytes, as latin-1 text); :class:`ServedVocabulary` is the API
server's one, with its :class:`~hermes_vllm.budget.Speller`. Below the grammar and the processor,
above the budget (whose speller it builds), so the budget reads no engine.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import xgrammar as xgr

from hermes_vllm.budget.speller import Speller
from hermes_vllm.dialect import Dialect


def special_ids(tokenizer: Any) -> list[int]:
    """The ids ``tokenizer`` treats as special (dropped by ``skip_special_tokens``, never split).

    Part of the vocabulary's identity: the same strings as plain added tokens (Hermes 2 Pro,
    Qwen) or as special ones (Hermes 3) detokenize differently.
    """
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return sorted({i for i, token in added.items() if token.special} | set(tokenizer.all_special_ids))


@dataclass(frozen=True)
class Vocabulary:
    """The tokenizer as the engines need it, plus the model's logits width."""

    tokenizer: Any
    """A Hugging Face tokenizer (fast or slow)."""
    vocab_size: int
    """Width of the model's logits; may exceed the tokenizer's length (padded heads)."""
    stop_token_ids: tuple[int, ...]
    fingerprint: str = field(default="", compare=False)

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, vocab_size: int | None = None, stop_token_ids: Sequence[int] | None = None
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

    @cached_property
    def _straddling(self) -> dict[str, bool]:
        return {}

    def gate_allowed(self, dialect: Dialect) -> bool:
        """Whether free text may skip the engine: False when a token holds a whole call tag and
        more text, since such a token could open an invalid call in one step."""
        trigger = dialect.tool_call.begin
        if trigger not in self._straddling:
            self._straddling[trigger] = any(trigger in t and not t.endswith(trigger) for t in self.latin1)
        return not self._straddling[trigger]


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
