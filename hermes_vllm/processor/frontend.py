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

from hermes_vllm.budget import Speller
from hermes_vllm.constraint import ConstraintRequest, check_special_tags
from hermes_vllm.grammar import GrammarCompileError
from hermes_vllm.metrics import REQUESTS, TOOLS_LEFT_OUT, Refusal, events, mark_refused
from hermes_vllm.processor import speculative
from hermes_vllm.processor.config import engine_name
from hermes_vllm.processor.core import prepared_turn, refuse_structured_outputs, validate_request
from hermes_vllm.processor.handshake import announced_special_tags, runner_active, status
from hermes_vllm.schema.coverage import UnsupportedKeywordError
from hermes_vllm.schema.satisfiable import UnsatisfiableToolError
from hermes_vllm.schema.spec import ToolSchemaError
from hermes_vllm.settings import get_limits
from hermes_vllm.vocabulary import served_vocabulary

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
        HTTP 400, marked with its reason for the door that counts and logs it with the request's
        id (:func:`hermes_vllm.metrics.mark_refused`). Under speculative decoding the request is
        handed to vLLM's structured outputs (:mod:`hermes_vllm.processor.speculative`)."""
        try:
            request = self._admit(params)
        except ValueError as err:
            mark_refused(err, refusal_reason(err), offending_path(err))
            raise
        if request is not None:
            admitted(request)

    def _admit(self, params: SamplingParams) -> ConstraintRequest | None:
        request = validate_request(params.extra_args, engine_name(), params.max_tokens, self.speller())
        if request is None:
            return None
        if params.structured_outputs is not None and not speculative.is_marked(params):
            refuse_structured_outputs(request, params.structured_outputs)
        if not self._active_seen:
            active, detail = status()
            if not active:
                lacking = speculative.missing()
                if lacking is not None:
                    detail += f"; under speculative decoding: {lacking}"
                raise Refusal("inactive", f"hermes-vllm cannot constrain this request's tool calls: {detail}")
            self._active_seen = True
        check_special_tags(request, params.skip_special_tokens, announced_special_tags())
        if runner_active(speculative.RUNNER):
            speculative.route(params)
        return request


def refusal_reason(error: ValueError) -> str:
    """The :data:`hermes_vllm.metrics.REASONS` entry of an admission error."""
    if isinstance(error, Refusal):
        return error.reason
    if isinstance(error, UnsatisfiableToolError):
        return "unsatisfiable_schema"
    if isinstance(error, UnsupportedKeywordError):
        return "unsupported_keyword"
    if isinstance(error, (ToolSchemaError, GrammarCompileError)):
        return "invalid_schema"
    return "invalid_request"


def offending_path(error: ValueError) -> str:
    """Where in the request the error lies, for the log line (``tool 'f': parameters/...``)."""
    if isinstance(error, ToolSchemaError):
        where = f"tool {error.tool!r}" if error.tool is not None else "tools"
        return f"{where}: {error.path}" if error.path else where
    return "-"


def admitted(request: ConstraintRequest) -> None:
    """Count an admitted request (``requests_total``) and the tools its grammar leaves out, each
    logged at DEBUG (the WARNING naming them comes once per tool set)."""
    turn = prepared_turn(request, engine_name(), get_limits())
    spec = turn.prepared.spec
    chosen = request.tool_choice
    named = isinstance(chosen, dict) and chosen.get("type") != "allowed_tools"
    choice = "named" if spec.mode == "required" and named else spec.mode
    REQUESTS.inc(choice, request.dialect)
    unusable = turn.prepared.unusable
    if unusable:
        TOOLS_LEFT_OUT.inc(amount=len(unusable))
        for tool in unusable:
            events.debug(
                "hermes-vllm: tool left out: tool=%r path=%s reason=%s", tool.tool, tool.path, tool.detail
            )
