"""Tool and reasoning parsers on both shipped tokenizers, composed by vLLM's own ``ParserManager``.

Every case runs non-streaming (``Parser.parse``) and streaming (``Parser.parse_delta``, deltas
from incremental detokenization or from random cuts of the text), and both must give the same
reasoning, content and calls.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

from hermes_vllm.dialect import Dialect, TagPair, get_dialect
from hermes_vllm.formats.blocks import call_block
from hermes_vllm.parsers import PARSERS
from hermes_vllm.parsers.span_stream import SpanStream
from hermes_vllm.plugin import register
from hermes_vllm.spans import partial_tag_suffix

NAME_OF = {dialect: name for name, dialect in PARSERS.items()}
DIALECTS = ["hermes", "chatml-brackets"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}},
]


@dataclass(frozen=True)
class Parsed:
    reasoning: str | None
    content: str | None
    calls: list[tuple[str, str]]


@pytest.fixture(scope="module", autouse=True)
def _plugin() -> None:
    register()


def parser_class(dialect: str, tokenizer: Any, reasoning: bool = True) -> Any:
    name = NAME_OF[dialect]
    return ParserManager.get_parser(
        tool_parser_name=name,
        reasoning_parser_name=name if reasoning else None,
        enable_auto_tools=True,
        tokenizer=tokenizer,
    )


def chat_request(tool_choice: Any = "auto") -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, tool_choice=tool_choice
    )


def prompt_ids(tokenizer: Any, d: Dialect, assistant_prefix: str = "") -> list[int]:
    prompt = f"{d.turn.begin}user\nhi{d.turn.end}\n{d.turn.begin}assistant\n{assistant_prefix}"
    return list(tokenizer.encode(prompt, add_special_tokens=False))


def parse_whole(parser_cls: Any, tokenizer: Any, text: str, request: ChatCompletionRequest) -> Parsed:
    reasoning, content, calls = parser_cls(tokenizer, request.tools).parse(
        text, request, enable_auto_tools=True
    )
    return Parsed(reasoning, content, [(c.name, c.arguments) for c in calls or []])


def parse_stream(
    parser_cls: Any, tokenizer: Any, chunks: list[str], request: ChatCompletionRequest, prompt: list[int]
) -> Parsed:
    """Stream ``chunks`` and check the OpenAI shape of every tool-call delta on the way."""
    parser = parser_cls(tokenizer, request.tools)
    reasoning = content = ""
    calls: list[tuple[str, str]] = []
    for i, chunk in enumerate(chunks):
        delta = parser.parse_delta(chunk, [], request, prompt_token_ids=prompt, finished=i == len(chunks) - 1)
        if delta is None:
            continue
        reasoning += delta.reasoning or ""
        content += delta.content or ""
        for call in delta.tool_calls:
            assert call.index == len(calls) and call.id and call.type == "function"
            assert call.function is not None and call.function.name
            json.loads(call.function.arguments)
            calls.append((call.function.name, call.function.arguments))
    return Parsed(reasoning or None, content or None, calls)


def token_chunks(tokenizer: Any, text: str) -> list[str]:
    """The deltas incremental detokenization gives: one token at a time, whole characters only."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    chunks, done = [], ""
    for k in range(1, len(ids) + 1):
        prefix = tokenizer.decode(ids[:k])
        if prefix.startswith(done) and not prefix.endswith("\ufffd"):
            chunks.append(prefix[len(done) :])
            done = prefix
    assert done == tokenizer.decode(ids)
    return chunks


def check_both_ways(
    dialect: str, tokenizer: Any, text: str, request: ChatCompletionRequest | None = None
) -> Parsed:
    """Parse the tokenizer's decoding of ``text`` whole and token by token; they must agree."""
    request = request or chat_request()
    text = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False))
    cls = parser_class(dialect, tokenizer)
    whole = parse_whole(cls, tokenizer, text, request)
    streamed = parse_stream(
        cls, tokenizer, token_chunks(tokenizer, text), request, prompt_ids(tokenizer, get_dialect(dialect))
    )
    assert streamed == whole
    return whole


def literal_block(name: str, arguments: dict[str, Any], d: Dialect, arguments_first: bool = False) -> str:
    """A call as a model may write it: plain JSON, spaced, tags inside strings not escaped."""
    payload = (
        {"arguments": arguments, "name": name} if arguments_first else {"name": name, "arguments": arguments}
    )
    return f"{d.tool_call.begin}\n{json.dumps(payload, indent=1, ensure_ascii=False)}\n{d.tool_call.end}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_every_call_in_order_with_the_text_around_them(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    text = (
        f"Let me check.\n{call_block('get_weather', {'city': 'Paris', 'n': 2}, d)}\n"
        + literal_block("add", {"a": 1, "b": 2.5, "name": "not the tool"}, d, arguments_first=True)
        + "\nDone, see above."
    )
    parsed = check_both_ways(dialect, vllm_tokenizer, text)
    assert parsed.calls == [
        ("get_weather", '{"city": "Paris", "n": 2}'),
        ("add", '{"a": 1, "b": 2.5, "name": "not the tool"}'),
    ]
    assert parsed.content == "Let me check.\nDone, see above."


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tags_inside_json_strings_do_not_end_or_open_a_call(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    tricky = f'a{d.tool_call.end}b{d.tool_call.begin}c "{d.reasoning[0].begin}'
    text = literal_block("get_weather", {"city": tricky}, d) + " after"
    parsed = check_both_ways(dialect, vllm_tokenizer, text)
    assert parsed.calls == [("get_weather", json.dumps({"city": tricky}, ensure_ascii=False))]
    assert parsed.content == " after"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_broken_call_does_not_lose_the_good_ones(dialect: str, vllm_tokenizer: Any, caplog: Any) -> None:
    d = get_dialect(dialect)
    good = call_block("add", {"a": 1, "b": 2}, d)
    # Balanced but not a call; then an unbalanced one whose string holds the closing tag.
    broken = f'{d.tool_call.begin}{{"name": "add", "arguments": {{"a": }}}}{d.tool_call.end}'
    unbalanced = f'{d.tool_call.begin}{{"name": "add", "arguments": {{"a": "x{d.tool_call.end}'
    with caplog.at_level(logging.WARNING, logger="hermes_vllm"):
        parsed = check_both_ways(
            dialect, vllm_tokenizer, f"{good}\n{broken}\n{good} mid\n{unbalanced}\n{good} end"
        )
    assert parsed.calls == [("add", '{"a": 1, "b": 2}')] * 3
    assert parsed.content == " mid end"
    assert "skipping an unreadable tool call" in caplog.text


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_call_cut_by_max_tokens_is_not_reported_but_the_calls_before_it_are(
    dialect: str, vllm_tokenizer: Any
) -> None:
    d = get_dialect(dialect)
    first = call_block("get_weather", {"city": "Oslo"}, d)
    # Cut after the closing tag in its string, the second call's JSON is still unbalanced.
    second = literal_block("add", {"a": 1, "b": f"{d.tool_call.end} {d.tool_call.begin}"}, d)
    for cut in range(1, len(second)):
        parsed = check_both_ways(dialect, vllm_tokenizer, f"Intro {first}\n{second[:cut]}")
        assert parsed.calls == [("get_weather", '{"city": "Oslo"}')], cut
        assert parsed.content == "Intro", cut


@pytest.mark.parametrize("dialect", DIALECTS)
def test_arguments_serialised_as_a_json_string_are_decoded_once(dialect: str, vllm_tokenizer: Any) -> None:
    """Granite 4 writes ``arguments`` as the JSON text of the object: the call is that object, whole
    and streamed (vLLM's hermes parser after 0.32 agrees); any other string is no call."""
    d = get_dialect(dialect)
    serialised = json.dumps({"name": "add", "arguments": json.dumps({"a": 1, "b": "x"})})
    bare = json.dumps({"name": "add", "arguments": '{"a": 1} tail'})
    text = f"{d.tool_call.begin}{serialised}{d.tool_call.end}{d.tool_call.begin}{bare}{d.tool_call.end}"
    assert check_both_ways(dialect, vllm_tokenizer, text).calls == [("add", '{"a": 1, "b": "x"}')]


@pytest.mark.parametrize("dialect", DIALECTS)
def test_python_literal_payloads_are_read_and_written_back_as_json(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    payload = "{'name': 'add', 'arguments': {'a': 1, 'b': True, 'c': None}}"
    text = f"{d.tool_call.begin}{payload}{d.tool_call.end}"
    assert check_both_ways(dialect, vllm_tokenizer, text).calls == [("add", '{"a": 1, "b": true, "c": null}')]


def test_hermes_reasoning_comes_first_then_the_calls(vllm_tokenizer: Any) -> None:
    d = get_dialect("hermes")
    think = d.reasoning[0]
    call = call_block("add", {"a": 1}, d)
    text = f"{think.begin}Plan: {d.tool_call.begin} is just text here{think.end}\nOn it. {call}"
    parsed = check_both_ways("hermes", vllm_tokenizer, text)
    assert parsed == Parsed(f"Plan: {d.tool_call.begin} is just text here", "\nOn it.", [("add", '{"a": 1}')])


def test_bracket_hidden_spans_go_to_reasoning_wherever_they_are(vllm_tokenizer: Any) -> None:
    d = get_dialect("chatml-brackets")
    (mono,), (step, pad) = d.reasoning, d.hidden
    text = (
        f"{mono.begin}think{mono.end}{step.begin} one{pad.end}{step.end}Visible"
        f"{pad.begin} two{pad.end} text{call_block('add', {'a': 1}, d)}{step.begin} three{step.end}"
    )
    parsed = check_both_ways("chatml-brackets", vllm_tokenizer, text)
    assert parsed == Parsed(f"think one{pad.end} two three", "Visible text", [("add", '{"a": 1}')])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_without_a_reasoning_parser_spans_stay_in_the_content(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    span = f"{d.reasoning[0].begin}not {d.tool_call.begin} a call{d.reasoning[0].end}"
    text = f"{span} ok {call_block('add', {'a': 1}, d)}"
    cls = parser_class(dialect, vllm_tokenizer, reasoning=False)
    request = chat_request()
    whole = parse_whole(cls, vllm_tokenizer, text, request)
    streamed = parse_stream(cls, vllm_tokenizer, list(text), request, prompt_ids(vllm_tokenizer, d))
    assert whole == streamed == Parsed(None, f"{span} ok", [("add", '{"a": 1}')])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_tool_choice_none_reports_no_call(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    parsed = check_both_ways(dialect, vllm_tokenizer, f"Hi {call_block('add', {}, d)}", chat_request("none"))
    assert parsed == Parsed(None, "Hi", [])


def test_a_clients_own_constraint_in_another_dialect_comes_back_as_written(vllm_tokenizer: Any) -> None:
    """A request without tools carrying its own bracket-dialect constraint (``vllm_xargs``) on a
    hermes server: vLLM asks the hermes parser to clean the content as for ``tool_choice="none"``;
    it must not read the hermes tag the model wrote inside the bracket call's string (the load run
    saw such content cut there)."""
    from hermes_vllm import constraint_args

    functions = [t["function"] for t in TOOLS]
    bracket = literal_block("add", {"a": "<tool_call>{"}, get_dialect("chatml-brackets"))
    text = f"Hi {bracket} ok"
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "hi"}],
        vllm_xargs=constraint_args(functions, "required", dialect="chatml-brackets"),
    )
    assert check_both_ways("hermes", vllm_tokenizer, text, request) == Parsed(None, text, [])
    # Reasoning before the call still goes to reasoning, streamed or whole.
    thought = check_both_ways("hermes", vllm_tokenizer, f"<think>plan</think>{text}", request)
    assert thought == Parsed("plan", text, [])


@pytest.mark.parametrize("dialect", DIALECTS)
def test_is_reasoning_end_reads_the_current_turn_only(dialect: str, vllm_tokenizer: Any) -> None:
    d = get_dialect(dialect)
    pair = d.reasoning[0]
    parser = parser_class(dialect, vllm_tokenizer)(vllm_tokenizer, TOOLS)
    assert not parser.is_reasoning_end(prompt_ids(vllm_tokenizer, d))
    assert not parser.is_reasoning_end(prompt_ids(vllm_tokenizer, d, f"{pair.begin}still thinking"))
    closed = f"{pair.begin}done{pair.end}answer"
    assert parser.is_reasoning_end(prompt_ids(vllm_tokenizer, d, closed))
    earlier_turn = prompt_ids(vllm_tokenizer, d, f"{closed}{d.turn.end}\n")
    assert not parser.is_reasoning_end(earlier_turn + prompt_ids(vllm_tokenizer, d))


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_prompt_that_closed_reasoning_streams_the_same(dialect: str, vllm_tokenizer: Any) -> None:
    """Then vLLM skips the reasoning phase and the tool parser alone reads every span."""
    d = get_dialect(dialect)
    pair = d.reasoning[0]
    text = f"A{pair.begin}r{pair.end}B {call_block('add', {'a': 1}, d)}"
    cls = parser_class(dialect, vllm_tokenizer)
    request = chat_request()
    prompt = prompt_ids(vllm_tokenizer, d, f"{pair.begin}{pair.end}")
    streamed = parse_stream(cls, vllm_tokenizer, list(text), request, prompt)
    assert (
        streamed
        == parse_whole(cls, vllm_tokenizer, text, request)
        == Parsed("r", "AB", [("add", '{"a": 1}')])
    )


# Random outputs, cut at random: streaming must equal non-streaming, and both the generated calls.

VISIBLE = st.text(alphabet="ab .,\né", max_size=6)
"""Free text never holds a tag character here, so any '<' or '[' in the content is a leak."""


def _pieces(d: Dialect) -> list[str]:
    tags = [t for p in (d.tool_call, d.tool_response, *d.free_spans) for t in (p.begin, p.end)]
    return ["a", " ", "\n", "é", "😀", '"', "'", "\\", "{", "}", "[", "]", "<", *tags]


def _json_value(d: Dialect) -> st.SearchStrategy[Any]:
    strings = st.lists(st.sampled_from(_pieces(d)), max_size=5).map("".join)
    scalars = st.one_of(strings, st.integers(-99, 99), st.booleans(), st.none())
    return st.one_of(scalars, st.lists(scalars, max_size=2))


@st.composite
def _call(draw: st.DrawFn, d: Dialect) -> tuple[str, tuple[str, str]]:
    name = draw(st.sampled_from(["get_weather", "add"]))
    arguments = draw(
        st.dictionaries(st.sampled_from(["s", "n", "name", "arguments"]), _json_value(d), max_size=3)
    )
    items = [("name", name), ("arguments", arguments)]
    payload = json.dumps(
        dict(items if draw(st.booleans()) else items[::-1]),
        ensure_ascii=draw(st.booleans()),
        indent=draw(st.sampled_from([None, 1])),
    )
    pad = st.sampled_from(["", "\n", " "])
    text = f"{d.tool_call.begin}{draw(pad)}{payload}{draw(pad)}{d.tool_call.end}"
    return text, (name, json.dumps(arguments, ensure_ascii=False))


def _body(d: Dialect, pair: TagPair) -> st.SearchStrategy[str]:
    body = st.lists(st.sampled_from(_pieces(d)), max_size=5).map("".join)
    return body.filter(lambda b: (b + pair.end).find(pair.end) == len(b))


@st.composite
def outputs(draw: st.DrawFn, d: Dialect) -> tuple[str, list[str], list[str], list[tuple[str, str]]]:
    """(text, visible pieces, reasoning bodies, complete calls) of a random model output."""
    text, visible, bodies, calls = "", [], [], []
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["text", "call", "free", "broken"]))
        if kind == "text":
            piece = draw(VISIBLE)
            visible.append(piece)
            text += piece
        elif kind == "call":
            call_text, call = draw(_call(d))
            text += call_text
            calls.append(call)
        elif kind == "free":
            pair = draw(st.sampled_from(d.free_spans))
            body = draw(_body(d, pair))
            bodies.append(body)
            text += f"{pair.begin}{body}{pair.end}"
        else:
            text += f'{d.tool_call.begin}{{"name": "add", "arguments": [1]}}{d.tool_call.end}'
    tail = draw(st.sampled_from(["none", "call", "tag", "free"]))
    if tail == "call":
        # Cut before the first closing tag is whole (a string argument may hold one): a call cut
        # after it is a broken call followed by more text, read at that tag once the output ends
        # (SpanStream.finish), not a cut call.
        call_text, _ = draw(_call(d))
        end = d.tool_call.end
        text += call_text[: draw(st.integers(1, call_text.index(end) + len(end) - 1))]
    elif tail == "tag":
        opener = draw(st.sampled_from([p.begin for p in (d.tool_call, *d.free_spans)]))
        text += opener[: draw(st.integers(1, len(opener) - 1))]
    elif tail == "free":
        pair = draw(st.sampled_from(d.free_spans))
        body = draw(_body(d, pair)) + pair.end[: draw(st.integers(0, len(pair.end) - 1))]
        bodies.append(body[: len(body) - partial_tag_suffix(body, (pair.end,))])
        text += pair.begin + body
    return text.lstrip(" "), visible, bodies, calls


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_outputs_parse_the_same_however_they_are_cut(
    dialect: str, vllm_tokenizer: Any, data: Any
) -> None:
    d = get_dialect(dialect)
    raw, visible, bodies, calls = data.draw(outputs(d))
    text = vllm_tokenizer.decode(vllm_tokenizer.encode(raw, add_special_tokens=False))
    assert text == raw
    cls = parser_class(dialect, vllm_tokenizer)
    request = chat_request()
    whole = parse_whole(cls, vllm_tokenizer, text, request)
    assert whole.calls == calls
    assert whole.reasoning == ("".join(bodies) or None)
    content = whole.content or ""
    assert not set(content) & set("<[")
    assert "".join(content.split()) == "".join("".join(visible).split())
    if data.draw(st.booleans()):
        tokens = token_chunks(vllm_tokenizer, text)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(tokens) - 1)))))
        chunks = ["".join(tokens[a:b]) for a, b in zip([0, *cuts], [*cuts, len(tokens)], strict=True)]
    else:
        cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)))))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    chunks = [c for c in chunks if c] or [text]
    assert parse_stream(cls, vllm_tokenizer, chunks, request, prompt_ids(vllm_tokenizer, d)) == whole


def test_a_long_open_call_is_not_rescanned_on_every_delta() -> None:
    """While no new closing tag has arrived, a delta costs a substring search, not a JSON scan.

    Rescanning 100k characters of JSON 2000 times takes minutes in Python; the search, well
    under a second.
    """
    d = get_dialect("hermes")
    stream = SpanStream(d)
    stream.feed(d.tool_call.begin + '{"name": "add", "arguments": {"s": "')
    start = time.perf_counter()
    for _ in range(2000):
        assert stream.feed("x" * 50).calls == []
    assert time.perf_counter() - start < 2.0
    assert stream.feed(f'"}}}}{d.tool_call.end}').calls[0].arguments == '{"s": "' + "x" * 100_000 + '"}'


def test_a_lone_surrogate_escape_in_arguments_survives_as_utf8() -> None:
    """Found by the load run: a random model wrote ``"\\udedc"``; raw, the stream chunk failed to encode."""
    from hermes_vllm.formats.payload import dump_json
    from hermes_vllm.parsers.span_stream import read_call

    call = read_call('{"name": "f", "arguments": {"s": "a\\udedcb", "pair": "\\ud83d\\ude00"}}')
    assert call is not None
    call.arguments.encode("utf-8")
    assert json.loads(call.arguments) == {"s": "a\udedcb", "pair": "\U0001f600"}
    dump_json({"s": "\udedc"}).encode("utf-8")
