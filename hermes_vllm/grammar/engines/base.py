"""What a grammar engine backend provides: compile a :class:`TurnSpec`, match tokens, fill masks."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from hermes_vllm.turn import TurnSpec
from hermes_vllm.vocabulary import Vocabulary

Direct = tuple[Callable[[int, bool], bool], Callable[[torch.Tensor, int, bool], bool], Callable[[int], None]]
"""An engine matcher's own accept, fill and rollback (:meth:`EngineMatcher.direct`)."""


KEY_CHARACTERS_MAX = 4096
"""The most characters all of a turn's property names may hold where its matchers' masks repeat
inside strings (:attr:`EngineMatcher.strings_repeat`): a key's mask allows only the tokens that
spell its next characters, so where the vocabulary has more plain string tokens than this, no
key's mask allows them all."""


class EngineMatcher(ABC):
    """Per-request matcher state for one compiled grammar."""

    @abstractmethod
    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (state unchanged) if the grammar does not allow it."""

    @abstractmethod
    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> bool:
        """Write the allowed next tokens into ``bitmask[row]``; False when every token is allowed
        (the row is written either way: vLLM's own xgrammar backend reads it without the result)."""

    @abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""

    @abstractmethod
    def is_terminated(self) -> bool:
        """True once a stop token was accepted at a point where the grammar may end."""

    @abstractmethod
    def can_end(self) -> bool:
        """True when the output accepted so far is a complete output of the grammar."""

    def direct(self) -> Direct:
        """:meth:`accept_token`, :meth:`fill_bitmask` and :meth:`rollback` as the engine's own
        callables where their results mean the same, for a caller on a hot path: the first two
        are called with one more argument, ``False`` (where xgrammar's native methods take their
        debug flag: returned bare, they skip its Python wrappers, a call less on every token,
        every fill and every rollback)."""
        accept, fill = self.accept_token, self.fill_bitmask
        return (lambda token, _: accept(token)), (lambda bitmask, row, _: fill(bitmask, row)), self.rollback

    def fill_rows(self, bitmask: torch.Tensor) -> Callable[[int, bool], bool]:
        """:meth:`fill_bitmask` into ``bitmask`` alone, called as ``(row, False)`` (as
        :meth:`direct`'s fill): for a caller that fills the same bitmask at every step, so that
        an engine may take it in its own form once, not on every fill."""
        fill = self.fill_bitmask
        return lambda row, _: fill(bitmask, row)

    strings_repeat: bool = False
    """Whether, inside a call, a mask that allows every plain string token (whole characters, no
    quote, backslash or control character: :meth:`ConstraintCore.string_plain`) is the mask again
    after such a token. It is where the matcher can only stand inside unbounded string values:
    the rest of the language is then the same after more plain characters, and so is the mask. An
    engine grammar says so only where it knows its turn's schemas allow nothing else there."""

    @property
    def batchable(self) -> Any:
        """The FFI handle of the xgrammar ``GrammarMatcher`` this matcher forwards every call to,
        for its whole life, or None: a step may then accept its tokens and fill its masks in one
        batched call with other rows' (``xgrammar.BatchGrammarMatcher``), with no Python per row."""
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
