"""What a grammar engine backend provides: compile a :class:`TurnSpec`, match tokens, fill masks."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar

import numpy as np
import torch
import xgrammar as xgr

from hermes_vllm.dialect import Dialect
from hermes_vllm.grammar.turn import TurnSpec


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


class EngineMatcher(ABC):
    """Per-request matcher state for one compiled grammar."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``; False when every token is allowed."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted at a point where the grammar may end."""

    @abstractmethod
    def can_end(self) -> bool:
        """True when the output accepted so far is a complete output of the grammar."""

    def direct(self) -> tuple[Callable[[int], bool], Callable[[torch.Tensor, int], bool]]:
        """:meth:`accept_token` and :meth:`fill_bitmask` as the engine's own callables where
        their results mean the same (one call less a token, for a caller on a hot path)."""
        return self.accept_token, self.fill_bitmask

    @property
    def batchable(self) -> Any:
        """The xgrammar ``GrammarMatcher`` this matcher forwards every call to, for its whole life,
        or None: a step may then accept its tokens and fill its masks in one batched call with
        other rows' (``xgrammar.BatchGrammarMatcher``), with no Python per row."""
        return None


class EngineGrammar(ABC):
    """A turn grammar compiled for one vocabulary."""

    @property
    @abstractmethod
    def memory_bytes(self) -> int:
        """Approximate resident size, for the cache's byte bound."""

    @abstractmethod
    def matcher(self, stop_token_ids: Sequence[int]) -> EngineMatcher:
        """A fresh matcher; ``stop_token_ids`` may end the output only where the grammar may end."""


class GrammarEngine(ABC):
    """A constrained-decoding library behind one interface."""

    name: ClassVar[str]
    supported_keywords: ClassVar[frozenset[str]]
    """JSON Schema keywords the engine enforces; others are refused or stripped by coverage policy."""
    answers: ClassVar[bool] = False
    """Whether the engine writes a turn with a final answer's schema (:attr:`TurnSpec.answer`);
    the others refuse such a request at admission."""

    def __init__(self, vocab: Vocabulary) -> None:
        self.vocab = vocab

    @classmethod
    def check(cls, turn: TurnSpec) -> None:
        """Raise ``ValueError`` if ``turn`` cannot be compiled; needs no tokenizer (frontend use).

        Engines that cannot check without a vocabulary accept here and report at compile time.
        """
        return None

    @abstractmethod
    def compile(self, turn: TurnSpec) -> EngineGrammar:
        """Compile ``turn``; raise ``ValueError`` with a readable message when it cannot."""

    def warm(self, turn: TurnSpec) -> None:
        """Pay the engine's one-time setup for this vocabulary now (at start-up) where a first
        compile pays it (``turn`` is a small one); engines whose setup is their constructor's
        have nothing to do (outlines-core's compile of even a small turn takes seconds)."""
        return None

    def fill_bitmasks(
        self, matchers: Sequence[EngineMatcher], bitmask: torch.Tensor, rows: Sequence[int]
    ) -> None:
        """Fill many rows at once; engines with a parallel batch fill override this."""
        for matcher, row in zip(matchers, rows, strict=True):
            matcher.fill_bitmask(bitmask, row)


def allocate_bitmask(rows: int, vocab_size: int, pin_memory: bool = False) -> torch.Tensor:
    """A packed int32 bitmask (1 bit per token, 1 = allowed), the layout every engine fills.

    Pinned when it feeds a GPU, so its host-to-device copy does not block.
    """
    words = (vocab_size + 31) // 32
    return torch.full((rows, words), -1, dtype=torch.int32, pin_memory=pin_memory)


def token_allowed(words: np.ndarray, token: int) -> bool:
    """Whether one packed bitmask row (its words, as numpy) allows ``token``: the one bit test."""
    return 0 <= token < words.size * 32 and bool(int(words[token >> 5]) >> (token & 31) & 1)


def set_token_allowed(bitmask: torch.Tensor, row: int, token: int, allowed: bool) -> None:
    """Set one token's bit in ``bitmask[row]``, for engines that decide some tokens (stops) themselves."""
    word, bit = divmod(token, 32)
    value = int(bitmask[row, word]) & 0xFFFFFFFF
    value = value | (1 << bit) if allowed else value & ~(1 << bit)
    bitmask[row, word] = value - (1 << 32) if value >= 1 << 31 else value
