"""Read a growing model output span by span, releasing only what later text cannot change.

Both parsers are built on this one reader, for streaming and non-streaming alike (a
non-streaming parse is one feed of the whole text), so a result never depends on how the output
was cut into deltas. The spans themselves come from :func:`hermes_vllm.spans.split_spans`.
What the reader releases, and when:

- free text, once no opening tag can start in it; a suffix that could still become a tag is
  held, and dropped if the output ends there, so a tag cut by ``max_tokens`` never leaks;
- the body of a reasoning or hidden span as it grows (minus a possible partial closing tag), as
  reasoning, or verbatim as text where nobody extracts reasoning;
- a call only once its closing tag has arrived and its payload parses. A call cut by
  ``max_tokens`` is therefore never reported, and a call already streamed is never retracted.
  While a call's JSON object is still unbalanced, a closing tag inside one of its strings does
  not end it. If it never balances, the output ended inside it (:meth:`SpanStream.finish`): it
  was cut, and nothing after its opening tag is released; unless a closed call follows, which
  shows the model went on: then it was a broken call ending at its first closing tag, as
  :func:`~hermes_vllm.spans.split_spans` reads it, and the calls after it are kept.

Whitespace right before a call and at the very end of the output (the layout around blocks) is
not content: trailing whitespace of the visible text is held until more visible text follows.

A reader may start inside a span the prompt opened (``opened``: the generation prompt ended with
``<think>``): the output is then read as if that opening tag preceded it, and the tag itself is
never released. A reader that was shown no prompt (``prompt_unknown``) cannot know whether it
starts inside reasoning: it holds the output back until the text decides (as
:func:`~hermes_vllm.spans.unopened_reasoning` reads it): a reasoning span's closing tag before any
opening tag means the prompt opened that span; an opening tag first, or the end of the output,
means the text stands where it was written. Given ``opened`` too (the tokenizer's template opens
the span), an output that starts with that opening tag itself (after whitespace) is read as written.
Nothing is released before that, so nothing released is ever taken back, and a whole reply and
its stream read alike.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Literal

from hermes_vllm.dialect import Dialect, TagPair
from hermes_vllm.formats.payload import dump_json, parse_call_payload
from hermes_vllm.spans import Span, partial_tag_suffix, payload_end, split_spans, unopened_reasoning

logger = logging.getLogger(__name__)

CallMode = Literal["parse", "raw", "stop"]
"""``parse``: release calls as :class:`ParsedCall`; ``raw``: release a complete call's markup as
content (for a later parser); ``stop``: stop at the first call tag and hand the rest over."""


@dataclass(frozen=True)
class ParsedCall:
    """One complete, readable call; ``arguments`` is JSON as ``json.dumps`` spaces it.

    vLLM's own hermes parser returns ``json.dumps(arguments, ensure_ascii=False)`` (``{"a": 1}``):
    the same text here, so a client switching parsers sees the same bytes.
    """

    name: str
    arguments: str


@dataclass
class Released:
    """What one feed released."""

    content: str = ""
    reasoning: str = ""
    calls: list[ParsedCall] = field(default_factory=list)
    handoff: str | None = None
    """``stop`` mode: everything not yet released when a call tag appeared, to parse further."""


@dataclass
class _Cursor:
    pos: int = 0
    """``text[:pos]`` is released."""
    done: int = 0
    """Characters of the open free span at ``pos`` already released."""
    open_tags: TagPair | None = None
    """The tags of that span, while it is open."""
    held: str = ""
    """Trailing whitespace of the visible text: released only if more visible text follows."""


def read_call(body: str) -> ParsedCall | None:
    """The call in a span body, or ``None`` (logged) when it is broken."""
    try:
        name, arguments = parse_call_payload(body)
        text = dump_json(arguments)
    except (ValueError, TypeError) as err:
        logger.warning("hermes-vllm: skipping an unreadable tool call: %s", err)
        return None
    return ParsedCall(name, text)


def _settled(body: str) -> bool:
    """Whether no later text can move the end of a call whose body starts ``body``.

    Only an unbalanced JSON object can still grow past a closing tag found inside one of its
    strings; :func:`~hermes_vllm.spans.split_spans` ends it there because it reads finished text.
    """
    payload = body.lstrip()
    return not payload.startswith("{") or payload_end(payload, 0) is not None


class SpanStream:
    """Incremental reader of one model output in one dialect."""

    def __init__(
        self,
        dialect: Dialect,
        calls: CallMode = "parse",
        free_spans_as_text: bool = False,
        opened: TagPair | None = None,
        prompt_unknown: bool = False,
    ) -> None:
        self.dialect = dialect
        self._calls = calls
        self._free_as_text = free_spans_as_text
        self._openers = tuple(p.begin for p in (dialect.tool_call, *dialect.free_spans))
        # The prompt's opening tag stands before the output, already released.
        self._text = opened.begin if opened is not None else ""
        self._cur = _Cursor(done=len(self._text), open_tags=opened)
        self._call_end_from: int | None = None
        """While a call waits: a new closing tag must start here before it can end (a cheap test)."""
        self._finished = False
        self.stopped = False
        self._preset = opened
        self._undecided = prompt_unknown and bool(dialect.reasoning)
        """No prompt shown and nothing yet says whether the output starts inside reasoning."""

    def feed(self, delta: str) -> Released:
        """Append ``delta`` and release what has become final."""
        self._text += delta
        out = Released()
        if self.stopped or not self._decided() or not self._open_call_may_close():
            return out
        start = dataclasses.replace(self._cur)
        while self._step(out):
            pass
        if self.stopped:
            # Hand over from where this delta began, so one parser alone reads this delta.
            self._cur = start
            return Released(handoff=self._unreleased())
        return out

    def read(self, text: str) -> Released:
        """The whole output at once: the non-streaming parse."""
        first, last = self.feed(text), self.finish()
        return Released(
            first.content + last.content, first.reasoning + last.reasoning, first.calls + last.calls
        )

    def finish(self) -> Released:
        """The output has ended: settle a call whose payload never balanced (not in stop mode)."""
        out = Released()
        self._finished = True
        self._call_end_from = None
        self._decided()
        while self._step(out):
            pass
        return out

    def _decided(self) -> bool:
        """Whether the reader knows where the output starts; decides it once the text can."""
        if not self._undecided:
            return True
        if self._preset is not None:  # the template's reading, unless the output opens the span itself
            begin = self._preset.begin
            output = self._text[len(begin) :]
            if begin.startswith(output.lstrip()) and not self._finished:
                return False
            if output.lstrip().startswith(begin):
                self._text, self._cur = output, _Cursor()
            self._undecided = False
            return True
        tags = unopened_reasoning(self._text, self.dialect)
        if tags is not None:  # the prompt opened it: read as if its opening tag came first
            self._text = tags.begin + self._text
            self._cur = _Cursor(done=len(tags.begin), open_tags=tags)
        elif not self._finished and not any(tag in self._text for tag in self._openers):
            return False
        self._undecided = False
        return True

    def _open_call_may_close(self) -> bool:
        if (
            self._call_end_from is None
            or self._text.find(self.dialect.tool_call.end, self._call_end_from) != -1
        ):
            self._call_end_from = None
            return True
        return False

    def _step(self, out: Released) -> bool:
        """Release the span at the cursor as far as it is final; whether to go on."""
        rest = self._text[self._cur.pos :]
        spans = split_spans(rest, self.dialect)
        if not spans:
            return False
        span = spans[0]
        if span.kind == "text":
            last = len(spans) == 1
            final = (
                span.body[: len(span.body) - partial_tag_suffix(span.body, self._openers)]
                if last
                else span.body
            )
            self._visible(final, out)
            self._cur.pos += len(final)
            return not last
        if span.kind == "call":
            return self._call(spans, rest, out)
        return self._free(span, rest, out)

    def _call(self, spans: list[Span], rest: str, out: Released) -> bool:
        span = spans[0]
        if self._calls == "stop":
            self.stopped = True
            return False
        settled = _settled(rest[len(self.dialect.tool_call.begin) :])
        broken = self._finished and any(s.kind == "call" and s.closed for s in spans[1:])
        if not span.closed or not (settled or broken):
            end = self.dialect.tool_call.end
            self._call_end_from = max(self._cur.pos, len(self._text) - len(end) + 1)
            return False
        if self._calls == "raw":  # the layout before the call is for the later parser to judge
            out.content += self._cur.held + rest[: span.end]
            self._cur.held = ""
        else:
            self._cur.held = ""
            if (call := read_call(span.body)) is not None:
                out.calls.append(call)
        self._cur.pos += span.end
        return True

    def _free(self, span: Span, rest: str, out: Released) -> bool:
        tags = span.tags
        assert tags is not None
        body_start = len(tags.begin)
        body_end = body_start + len(span.body)
        final = span.end if span.closed else body_end - partial_tag_suffix(span.body, (tags.end,))
        if self._free_as_text:
            self._visible(rest[self._cur.done : final], out)
        else:
            out.reasoning += rest[max(self._cur.done, body_start) : min(final, body_end)]
        if span.closed:
            self._cur.pos += span.end
            self._cur.done, self._cur.open_tags = 0, None
            return True
        self._cur.done, self._cur.open_tags = final, tags
        return False

    def _visible(self, text: str, out: Released) -> None:
        text = self._cur.held + text
        kept = text.rstrip()
        self._cur.held = text[len(kept) :]
        out.content += kept

    def _unreleased(self) -> str:
        """The text from the cursor on, re-opening a partly released free span."""
        rest = self._text[self._cur.pos :]
        tags = self._cur.open_tags
        if tags is not None:
            rest = rest[: len(tags.begin)] + rest[self._cur.done :]
        return self._cur.held + rest
