"""The served model's vocabulary on the API server's side: the admission check counts in it."""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from hermes_vllm.budget.speller import Speller
from hermes_vllm.grammar.engines.base import Vocabulary


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


_served: list[ServedVocabulary] = []
_frontend: list[Callable[[], Speller]] = []


def served_vocabulary(tokenizer: Any) -> ServedVocabulary:
    """The :class:`ServedVocabulary` of ``tokenizer``, kept for the latest one (vLLM builds the
    parsers per request, with the server's one tokenizer)."""
    if not (_served and _served[0].tokenizer is tokenizer):
        _served[:] = [ServedVocabulary(tokenizer)]
    return _served[0]


def register_speller(source: Callable[[], Speller]) -> None:
    """Make the served model's vocabulary known to the frontend's admission check (the latest
    wins): an in-process engine registers its own core's speller."""
    _frontend[:] = [source]


def register_tokenizer(tokenizer: Any) -> None:
    """:func:`register_speller` for the server's tokenizer (the tool parser registers it)."""
    register_speller(served_vocabulary(tokenizer))


def frontend_speller() -> Speller | None:
    """The speller registered last, if any."""
    return _frontend[0]() if _frontend else None
