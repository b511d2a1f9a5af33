"""What the API server's side of a process knows when it admits a constrained request.

vLLM asks a logits processor to check a request through a classmethod (``validate_params``)
with the request's parameters alone, so what the check needs beyond them is this process's:
its :data:`FRONTEND` (whether a processor announced itself) and the served model's vocabulary,
to count the reserve a ``required`` call keeps (:data:`~hermes_vllm.processor.served.SERVED`,
which the tool parser serves the server's tokenizer, or an engine built in this process,
offline, its own core's speller: the exact vocabulary the engine masks). The adapters import
this module; it imports none of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes_vllm.constraint import ConstraintRequest, check_special_tags
from hermes_vllm.grammar import GrammarCompileError
from hermes_vllm.metrics import REQUESTS, TOOLS_LEFT_OUT, Refusal, events, mark_refused
from hermes_vllm.processor import speculative
from hermes_vllm.processor.config import engine_name
from hermes_vllm.processor.core import prepared_turn, refuse_structured_outputs, validate_request
from hermes_vllm.processor.handshake import announced_special_tags, runner_active, status
from hermes_vllm.processor.served import SERVED
from hermes_vllm.schema.coverage import UnsupportedKeywordError
from hermes_vllm.schema.satisfiable import UnsatisfiableToolError
from hermes_vllm.schema.spec import ToolSchemaError
from hermes_vllm.settings import get_limits

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams


class Frontend:
    """The admission check of one process, counting in its served model
    (:data:`~hermes_vllm.processor.served.SERVED`)."""

    def __init__(self) -> None:
        self._active_seen = False

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
        request = validate_request(params.extra_args, engine_name(), params.max_tokens, SERVED.speller())
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


FRONTEND = Frontend()
"""This process's admission check: vLLM calls ``validate_params`` on the adapter's class, with the
request's parameters alone."""


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
