"""The vLLM reasoning parser of a dialect: reasoning and hidden spans out of the visible content.

Every reasoning span (hermes: ``<think>``) and hidden span (the bracket dialect's ``[step]`` and
``[scratchpad]``) goes to ``reasoning``, wherever it sits in the output; the visible text is the
content. How it composes with the tool parser in vLLM's chat path (``DelegatingParser``, both
parsers engine-based):

- non-streaming: this parser reads the whole output first and passes the content on with the
  call markup untouched; the tool parser then takes the calls out of it;
- streaming: this parser reads deltas until the first call tag. In that delta it releases
  nothing and reports the end of reasoning, handing everything unreleased over as raw text
  (``has_engine_confirmed_reasoning_end``); the tool parser reads on from there, spans included.

Both parsers release through the same :class:`~hermes_vllm.parsers.span_stream.SpanStream`
rules, so streaming and non-streaming agree.

Where the prompt leaves a reasoning span open (a generation prompt ending with ``<think>``, as in
Qwen3-Thinking-2507, Qwen 3.5 and DeepSeek-R1 templates), the output starts inside it:
``I should answer.\n</think>\n\nHello!`` is reasoning ``I should answer.\n`` and content
``\n\nHello!``, as vLLM's qwen3 and deepseek_r1 parsers read it. vLLM shows the parser the
prompt through :meth:`~DialectReasoningParser.adjust_initial_state_from_prompt` (streaming, its
own hook) and ``set_prompt_token_ids`` (non-streaming, forwarded by
:mod:`hermes_vllm.parsers.prompt_state`). A parser shown no prompt (built directly: offline
pipelines, evaluation harnesses, vLLM's own parser tests) reads as vLLM's thinking parsers do:
where the tokenizer's own template opens ``<think>`` in its generation prompt the output starts
inside it, and otherwise a ``</think>`` with no opening tag before it means the prompt opened the
span, so what precedes it is reasoning, whole and streamed (a stream holds the text back until a
tag or the end decides, see :class:`~hermes_vllm.parsers.span_stream.SpanStream`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.entrypoints.generate.base.protocol import DeltaMessage
from vllm.parser.engine.parser_engine import ReasoningEnd
from vllm.reasoning.abs_reasoning_parsers import ReasoningParser

from hermes_vllm.dialect import DEFAULT_DIALECT, get_dialect
from hermes_vllm.parsers.shared import (
    delta_message,
    keep_special_tags,
    own_constraint,
    prompt_opened,
    template_opened,
    turn_text,
)
from hermes_vllm.parsers.span_stream import SpanStream
from hermes_vllm.spans import open_at_end, split_spans, unopened_reasoning
from hermes_vllm.vocabulary import served_vocabulary

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest


class DialectReasoningParser(ReasoningParser):  # type: ignore[misc]
    """Reasoning of one dialect; subclasses only name the dialect."""

    dialect_name: ClassVar[str] = DEFAULT_DIALECT
    # vLLM then asks has_engine_confirmed_reasoning_end() when reasoning ends in a stream.
    engine_based_streaming = True

    def __init__(self, tokenizer: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(tokenizer, *args, **kwargs)
        self.dialect = get_dialect(self.dialect_name)
        thinking = (kwargs.get("chat_template_kwargs") or {}).get("enable_thinking")
        # Thinking switched off by the caller: no span is open, whatever the template writes.
        self._opened = None if thinking is False else template_opened(tokenizer, self.dialect.name, thinking)
        self._prompt: list[int] | None = None
        self._unknown = thinking is not False
        """No prompt shown and thinking not switched off: the output's own tags may say more."""
        self._stream = SpanStream(self.dialect, "stop", opened=self._opened, prompt_unknown=self._unknown)

    def adjust_initial_state_from_prompt(self, prompt_token_ids: Sequence[int]) -> None:
        """Start inside the span the prompt leaves open, if any (vLLM's hook, called before the
        first delta; :mod:`hermes_vllm.parsers.prompt_state` calls it for whole replies)."""
        self._prompt = list(prompt_token_ids)
        self._opened = prompt_opened(self.model_tokenizer, self.vocab, self._prompt, self.dialect)
        self._stream = SpanStream(self.dialect, "stop", opened=self._opened)

    @property
    def reasoning_start_str(self) -> str | None:
        return self.dialect.reasoning[0].begin if self.dialect.reasoning else None

    @property
    def reasoning_end_str(self) -> str | None:
        return self.dialect.reasoning[0].end if self.dialect.reasoning else None

    def adjust_request(
        self, request: ChatCompletionRequest | ResponsesRequest
    ) -> ChatCompletionRequest | ResponsesRequest:
        keep_special_tags(request, self.model_tokenizer, self.dialect)
        return request

    def is_reasoning_end(self, input_ids: Sequence[int]) -> bool:
        """Whether the current turn closed a reasoning span and is not inside a free span.

        vLLM asks this of the prompt (a generation prompt that already closed the reasoning
        skips the reasoning phase) and, for requests with structured outputs, of the prompt and
        the output so far (the output grammar starts after reasoning). The turn begins after the
        last turn marker; it is decoded, so text tags and special-token tags read alike. Ids
        that are not the prompt this parser was shown are the output alone: they start inside
        the span that prompt left open. Shown no prompt, ids holding a turn marker hold the prompt
        (vLLM's structured-output manager asks of the prompt and the output together) and are read
        as they are; ids without one are the output alone, inside reasoning where they hold a
        closing tag with no opening before it.
        """
        text = turn_text(self.model_tokenizer, self.vocab, input_ids, self.dialect)
        if self._prompt is None:
            if self._unknown and self.vocab.get(self.dialect.turn.begin) not in input_ids:  # the output
                tags = unopened_reasoning(text, self.dialect)
                text = (tags.begin if tags is not None else "") + text
        elif list(input_ids[: len(self._prompt)]) != self._prompt:
            text = self._opener(text) + text  # the output alone, after a prompt this parser was shown
        spans = split_spans(text, self.dialect)
        return any(s.kind == "reasoning" for s in spans) and spans[-1].closed

    @property
    def reasoning_end_token_ids(self) -> frozenset[int]:
        """The reasoning span's closing tag as a token id, where the vocabulary has it as one
        (an added or a special token: the grammar reads both by their bytes).

        vLLM 0.34's structured-output manager asks :meth:`find_reasoning_end` of the new tokens
        only where this is not empty (earlier releases never ask ours), and otherwise reads the
        whole output through :meth:`is_reasoning_end` at every step. A closing tag spelled in
        several tokens (the bracket dialect, Qwen 2.5's vocabulary) leaves it empty, as vLLM asks.
        The grammar also reads a one-token tag written in pieces as the end, which
        :meth:`find_reasoning_end` accounts for: the manager's answers stay exact.
        """
        ids = [self.vocab.get(tags.end) for tags in self.dialect.reasoning]
        return frozenset(i for i in ids if i is not None) if None not in ids else frozenset()

    @property
    def implicit_reasoning_end_token_ids(self) -> frozenset[int]:
        """Empty: in the turn grammar only a reasoning span's own closing tag ends it.

        A call tag inside the span is reasoning text (a call comes after the closing tag), unlike
        vLLM's qwen3 parser, where ``<tool_call>`` also ends reasoning. Listed here, vLLM 0.34
        would mask it while a ``response_format`` request reasons (a JSON grammar cannot start
        with a tag), taking from the model text that our grammar allows inside the span.
        """
        return frozenset()

    def find_reasoning_end(self, token_ids: Sequence[int]) -> ReasoningEnd | None:
        """``ReasoningEnd(len(token_ids), False)`` where these tokens end no reasoning span, else
        ``None``.

        vLLM 0.34 passes only the tokens written since it last found reasoning not ended (a step's
        new or draft tokens). A span closes only where its closing tag's last byte is written, so
        tokens whose bytes hold no closing tag, and do not start with the rest of one begun
        before them, close none, whatever came before. Where they do, whether reasoning ends
        depends on that earlier text, which they do not show: inside a reasoning span the tag
        ends it, while a closing tag with no opening, or one inside a call's string, is text.
        ``None`` then has vLLM read the whole output through :meth:`is_reasoning_end`, once for
        such a step instead of at every step.

        Decoded as :meth:`is_reasoning_end` reads, from the engine's own tokenizer (a decode of a
        few tokens a step); a space the decoder drops before the first token only makes ``None``
        likelier, never hides a tag.
        """
        text = str(self.model_tokenizer.decode(list(token_ids)))
        for tags in self.dialect.reasoning:
            end = tags.end
            if end in text or any(text.startswith(end[k:]) for k in range(1, len(end))):
                return None
        return ReasoningEnd(len(token_ids), False)

    def _opener(self, output: str) -> str:
        """The opening tag of the span ``output`` starts inside, or ``""``: the one the prompt (or,
        with none shown, the template) left open; with no prompt shown, also a reasoning span
        whose closing tag ``output`` holds before any opening tag."""
        if self._opened is not None:
            if self._prompt is None and self._unknown and output.lstrip().startswith(self._opened.begin):
                return ""  # the output opens the span itself, where the template would have
            return self._opened.begin
        tags = unopened_reasoning(output, self.dialect) if self._prompt is None and self._unknown else None
        return "" if tags is None else tags.begin

    def count_reasoning_tokens(self, token_ids: Sequence[int]) -> int:
        """The output's tokens inside reasoning and hidden spans, tags excluded: what vLLM reports
        as ``usage.completion_tokens_details.reasoning_tokens`` (chat and Responses).

        Read from the tokens' bytes, so tags spelled in several tokens count like special ones. A
        span the prompt opened counts from the output's first token.
        """
        pieces = served_vocabulary(self.model_tokenizer).vocab.latin1
        text = [pieces[t] if 0 <= t < len(pieces) else "" for t in token_ids]
        opener = self._opener("".join(text))
        starts = list(accumulate((len(p) for p in text), initial=len(opener)))
        count = 0
        for span in split_spans(opener + "".join(text), self.dialect):
            if span.kind in ("reasoning", "hidden"):
                assert span.tags is not None
                body = span.start + len(span.tags.begin)
                count += bisect_left(starts, body + len(span.body), hi=len(token_ids)) - bisect_left(
                    starts, body, hi=len(token_ids)
                )
        return count

    def extract_content_ids(self, input_ids: list[int]) -> list[int]:
        """The ids after the token that closes the first reasoning span; ``[]`` before that.

        As vLLM's thinking parsers give them (``[]`` also when the closing tag is the last
        token). Read by token id where the closing tag is one token; a closing tag spelled in
        several tokens (the bracket dialect) cannot be cut out by id: every id is content then.
        """
        if not self.dialect.reasoning:
            return input_ids
        tags = self.dialect.reasoning[0]
        end = self.vocab.get(tags.end)
        if end is None:
            return input_ids
        opener: str | None = None  # read once a closing tag is found (the whole output decoded)
        for i, token in enumerate(input_ids):
            if token == end and i + 1 < len(input_ids):
                if opener is None:
                    opener = self._opener(str(self.model_tokenizer.decode(input_ids)))
                inside = open_at_end(opener + str(self.model_tokenizer.decode(input_ids[:i])), self.dialect)
                if inside is not None and inside.tags == tags:
                    return input_ids[i + 1 :]
        return []

    def extract_reasoning(
        self, model_output: str, request: ChatCompletionRequest | ResponsesRequest
    ) -> tuple[str | None, str | None]:
        if own_constraint(request):
            # As a stream reads it: reasoning up to the first call tag, then the text as written.
            text = self._opener(model_output) + model_output
            cut = next((s.start for s in split_spans(text, self.dialect) if s.kind == "call"), None)
            if cut is not None:
                before = SpanStream(self.dialect, "raw").read(text[:cut])
                return before.reasoning or None, before.content + text[cut:] or None
        unknown = self._prompt is None and self._unknown
        released = SpanStream(self.dialect, "raw", opened=self._opened, prompt_unknown=unknown).read(
            model_output
        )
        return released.reasoning or None, released.content or None

    def extract_reasoning_streaming(
        self,
        previous_text: str,
        current_text: str,
        delta_text: str,
        previous_token_ids: Sequence[int],
        current_token_ids: Sequence[int],
        delta_token_ids: Sequence[int],
    ) -> DeltaMessage | None:
        released = self._stream.feed(delta_text)
        if released.handoff is not None:
            return DeltaMessage(content=released.handoff)
        return delta_message(released)

    def has_engine_confirmed_reasoning_end(self) -> bool:
        return self._stream.stopped

    def finish_streaming(self) -> DeltaMessage | None:
        """At the end of the output, what a stream shown no prompt still held undecided (text with
        no tag: content); nothing at the hand-over, whose delta carried all it had."""
        return None if self._stream.stopped else delta_message(self._stream.finish())
