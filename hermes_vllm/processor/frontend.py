"""What the API server's side of a process knows when it admits a constrained request.

vLLM asks a logits processor to check a request through a classmethod (``validate_params``)
with the request's parameters alone, so what the check needs beyond them (the served model's
vocabulary, to count the reserve a ``required`` call keeps; whether a processor announced itself)
is one :class:`Frontend` object held by the processor class. Who serves it the vocabulary is
explicit: the tool parser (the server's tokenizer) or an engine built in this process (offline,
its own core's speller, the exact vocabulary the engine masks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_vllm.budget import Speller, served_vocabulary
from hermes_vllm.constraint import check_special_tags
from hermes_vllm.processor import speculative
from hermes_vllm.processor.config import engine_name
from hermes_vllm.processor.core import refuse_structured_outputs, validate_request
from hermes_vllm.processor.handshake import announced_special_tags, runner_active, status

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class Frontend:
    """The admission check's view of the served model, for one process."""

    def __init__(self) -> None:
        self._engine_speller: Callable[[], Speller] | None = None
        self._parser_speller: Callable[[], Speller] | None = None
        self._active_seen = False

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

    def validate(self, params: SamplingParams) -> None:
        """The frontend's admission check of a request, for both runners: ``ValueError`` becomes
        HTTP 400. Under speculative decoding the request is handed to vLLM's structured outputs
        (:mod:`hermes_vllm.processor.speculative`)."""
        request = validate_request(params.extra_args, engine_name(), params.max_tokens, self.speller())
        if request is None:
            return
        if params.structured_outputs is not None and not speculative.is_marked(params):
            refuse_structured_outputs(request, params.structured_outputs)
        if not self._active_seen:
            active, detail = status()
            if not active:
                lacking = speculative.missing()
                if lacking is not None:
                    detail += f"; under speculative decoding: {lacking}"
                raise ValueError(f"hermes-vllm cannot constrain this request's tool calls: {detail}")
            self._active_seen = True
        check_special_tags(request, params.skip_special_tokens, announced_special_tags())
        if runner_active(speculative.RUNNER):
            speculative.route(params)
