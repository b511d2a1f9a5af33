"""The served model's vocabulary on the API server's side: the admission check counts in it."""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=2)
def served_vocabulary(tokenizer: Any) -> ServedVocabulary:
    """The :class:`ServedVocabulary` of ``tokenizer``, kept for the latest ones (vLLM builds the
    parsers per request, with the server's one tokenizer)."""
    return ServedVocabulary(tokenizer)
