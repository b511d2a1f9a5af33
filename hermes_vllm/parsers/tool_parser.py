"""The vLLM tool parser of a dialect: constrains the request, then reads calls out of the output.

``adjust_request`` is what makes a plain OpenAI ``tools=[...]`` request schema-guaranteed: it
hands the tools to the hermes-vllm logits processor through ``vllm_xargs``. Reading is done by
:class:`~hermes_vllm.parsers.span_stream.SpanStream`; a call is streamed whole (one delta with
its index, id, name and complete arguments) once its closing tag has arrived, which is what
makes the streamed calls equal the non-streaming ones for every cut of the text and keeps a
call cut by ``max_tokens`` out of both.

Without a reasoning parser, reasoning markup stays in the content, and a span the prompt left
open is text the model is still writing: a call tag inside it is text, as the grammar has it,
so the parser is shown the prompt too (:mod:`hermes_vllm.parsers.prompt_state`). With a
reasoning parser the text reaches this one after it, reasoning already taken out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.entrypoints.generate.base.protocol import (
    DeltaFunctionCall,
    DeltaMessage,
    DeltaToolCall,
    ExtractedToolCallInformation,
    FunctionCall,
    ToolCall,
)
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.renderers.chat_utils import make_tool_call_id
from vllm.tool_parsers.abstract_tool_parser import ToolParser

from hermes_vllm.constraint import constraint_args
from hermes_vllm.dialect import DEFAULT_DIALECT, TagPair, get_dialect
from hermes_vllm.parsers import finish_reason
from hermes_vllm.parsers.answer import take_answer
from hermes_vllm.parsers.responses_api import responses_tool_choice, responses_tools
from hermes_vllm.parsers.shared import delta_message, keep_special_tags, own_constraint, prompt_opened
from hermes_vllm.parsers.span_stream import Released, SpanStream
from hermes_vllm.processor import remote
from hermes_vllm.processor.served import SERVED

if TYPE_CHECKING:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest


def _no_tools(request: ChatCompletionRequest) -> None:
    """Read an empty ``tools`` list as no tools, as vLLM 0.34's request validation does.

    OpenAI treats ``tools: []`` like an omitted field: ``auto`` and ``required`` have nothing to
    call and become ``none``, so no constraint is built and no call is owed, and a named tool
    names none of the tools (``ValueError``: HTTP 400). vLLM 0.34 rewrites such a request before
    it reaches a parser and 0.32 / 0.33 refuse it, but a request built without that validation
    (``model_construct``, another plugin) must not come out owing a call to no tool.
    """
    choice = request.tool_choice
    if choice is not None and not isinstance(choice, str):
        raise ValueError("tool_choice names a tool, but tools is an empty list")
    request.tools = None
    if choice in ("auto", "required"):
        request.tool_choice = "none"


class DialectToolParser(ToolParser):  # type: ignore[misc]
    """Tool calls of one dialect; subclasses only name the dialect."""

    dialect_name: ClassVar[str] = DEFAULT_DIALECT
    # Required and named choices are constrained by our processor and written in the dialect's
    # tags, so they must come through this parser, not through vLLM's JSON-list path.
    supports_required_and_named = False
    # vLLM then hands the raw deltas to this parser (also for tool_choice="none", whose content
    # it still cleans) and asks the reasoning parser when reasoning has ended.
    engine_based_streaming = True
    # Set by vLLM when no reasoning parser is configured: reasoning markup is then plain content.
    skip_reasoning_parsing = False
    # Asks vLLM to call adjust_request for tool_choice="none" too (see parsers.always_adjust).
    hermes_vllm_constrains_none: ClassVar[bool] = True

    def __init__(self, tokenizer: Any, tools: list[Any] | None = None) -> None:
        super().__init__(tokenizer, tools)
        # Runs in the API server only, before vLLM looks the non-streaming method up (idempotent).
        finish_reason.install()
        remote.install()  # engines on other hosts confirm activation through vLLM's RPC
        SERVED.serve_tokenizer(tokenizer)  # the reserve check counts in it
        self.dialect = get_dialect(self.dialect_name)
        self._stream: SpanStream | None = None
        self._calls_sent = 0
        self._opened: TagPair | None = None

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Remember the span the prompt leaves open; read only where no reasoning parser runs."""
        self._opened = prompt_opened(self.model_tokenizer, self.vocab, prompt_token_ids, self.dialect)

    def adjust_request(
        self, request: ChatCompletionRequest | ResponsesRequest
    ) -> ChatCompletionRequest | ResponsesRequest:
        """Constrain every request that carries tools, ``tool_choice="none"`` included.

        Both doors of the OpenAI server come here: Chat Completions, and the Responses API
        (``/v1/responses``, whose tools and ``tool_choice`` are read as the chat template shows
        them, see :mod:`hermes_vllm.parsers.responses_api`). For ``"none"`` the processor bans
        opening a call, so the model cannot write a fake call into the content; vLLM calls this
        for ``"none"`` even without a reasoning parser because :mod:`hermes_vllm.parsers.always_adjust`
        asks it to. A constraint a client sent under the same key is replaced: it must be the
        request's own tools and tool_choice. An empty ``tools`` list is no tools (see
        :func:`_no_tools`). A ``response_format`` (Responses: ``text.format``) or
        ``structured_outputs`` JSON schema becomes the turn's final answer
        (:mod:`hermes_vllm.parsers.answer`): calls or that answer, and vLLM's structured output
        stands aside.
        """
        if not request.tools:
            if isinstance(request, ChatCompletionRequest) and request.tools is not None:
                _no_tools(request)
            return request
        if isinstance(request, ChatCompletionRequest):
            tools: Sequence[Any] = request.tools
            tool_choice = request.tool_choice if request.tool_choice is not None else "auto"
        else:
            tools = responses_tools(request)
            if not tools:  # only built-in tools: no call of this parser's to constrain
                return request
            tool_choice = responses_tool_choice(request.tool_choice)
        args = constraint_args(
            tools,
            tool_choice=tool_choice,
            parallel_tool_calls=request.parallel_tool_calls is not False,
            dialect=self.dialect.name,
            answer=take_answer(request),
        )
        request.vllm_xargs = {**(request.vllm_xargs or {}), **args}
        keep_special_tags(request, self.model_tokenizer, self.dialect)
        return request

    def _new_stream(self) -> SpanStream:
        alone = self.skip_reasoning_parsing
        return SpanStream(
            self.dialect, "parse", free_spans_as_text=alone, opened=self._opened if alone else None
        )

    def extract_tool_calls(
        self, model_output: str, request: ChatCompletionRequest
    ) -> ExtractedToolCallInformation:
        if own_constraint(request):
            return ExtractedToolCallInformation(
                tools_called=False, tool_calls=[], content=model_output or None
            )
        released = self._new_stream().read(model_output)
        tool_calls = [
            ToolCall(function=FunctionCall(name=c.name, arguments=c.arguments)) for c in released.calls
        ]
        return ExtractedToolCallInformation(
            tools_called=bool(tool_calls), tool_calls=tool_calls, content=released.content or None
        )

    def extract_tool_calls_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
        request: ChatCompletionRequest,
    ) -> DeltaMessage | None:
        if own_constraint(request):
            return DeltaMessage(content=delta_text) if delta_text else None
        if self._stream is None:
            self._stream = self._new_stream()
        return self._delta(self._stream.feed(delta_text))

    def finish_streaming(self) -> DeltaMessage | None:
        """vLLM calls this once the output has ended (see :meth:`SpanStream.finish`)."""
        return None if self._stream is None else self._delta(self._stream.finish())

    def _delta(self, released: Released) -> DeltaMessage | None:
        tool_calls = [
            DeltaToolCall(
                index=self._calls_sent + i,
                id=make_tool_call_id(),
                type="function",
                function=DeltaFunctionCall(name=call.name, arguments=call.arguments),
            )
            for i, call in enumerate(released.calls)
        ]
        self._calls_sent += len(tool_calls)
        return delta_message(released, tool_calls)
