"""The frontend's view of the served model: the vocabulary the admission check counts a reserve in.

One per process (:data:`SERVED`), told what it serves from below and from above alike: the tool
parser gives it the API server's tokenizer, an engine core built in this process (offline) its
own speller. It imports nothing of the processor's, so the core's builder (``config``) and the
admission check (``frontend``) both read it without importing each other or an adapter (it was
a class attribute of the V2 adapter, which the core's builder reached up to).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hermes_vllm.budget import Speller
from hermes_vllm.vocabulary import served_vocabulary


class ServedModel:
    """The speller of the model this process serves, as the admission check counts in it."""

    def __init__(self) -> None:
        self._engine_speller: Callable[[], Speller] | None = None
        self._parser_speller: Callable[[], Speller] | None = None

    def serve_tokenizer(self, tokenizer: Any) -> None:
        """The tool parser's tokenizer (the server's): counts the reserve where no engine runs in
        this process."""
        self._parser_speller = served_vocabulary(tokenizer)

    def serve_engine(self, speller: Callable[[], Speller]) -> None:
        """An engine core built in this process (offline): its speller wins, being the vocabulary
        the engine masks (padded ids included)."""
        self._engine_speller = speller

    def speller(self) -> Speller | None:
        """The speller the reserve is counted with; ``None`` where none was served."""
        source = self._engine_speller or self._parser_speller
        return None if source is None else source()


SERVED = ServedModel()
"""This process's served model."""
