"""Parsers shown the prompt: a generation prompt that opens ``<think>`` starts the output inside it.

Qwen3-Thinking-2507, Qwen 3.5 and DeepSeek-R1 templates end the generation prompt with
``<think>\\n``; the model then writes the reasoning and only its closing tag. The templates here
(``tests/templates``) are written from those families' published behaviour. Each case runs
through the parser class vLLM composes, whole (``set_prompt_token_ids`` then ``parse``) and
streamed (``parse_delta`` with the prompt), with Qwen 3's tokenizer, and also covers what vLLM's
own qwen3 / deepseek_r1 / hermes parsers return for the same text (see the notes on parity).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager

from hermes_vllm.plugin import register
from hermes_vllm.testing import tiny_model_path

TEMPLATES = Path(__file__).parent / "templates"
NAMES = ["hermes_vllm", "hermes_vllm_qwen"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "days": 2}}\n</tool_call>'


@pytest.fixture(scope="module")
def qwen3() -> Any:
    from vllm.tokenizers import get_tokenizer

    register()
    return get_tokenizer(str(tiny_model_path("qwen3")))


def prompt(tokenizer: Any, template: str | None, **kwargs: Any) -> list[int]:
    """The ids of a one-message conversation's generation prompt under ``template`` (None: Qwen 3's own)."""
    chat_template = (
        None if template is None else (TEMPLATES / f"{template}.jinja").read_text(encoding="utf-8")
    )
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}],
        chat_template=chat_template,
        add_generation_prompt=True,
        tokenize=False,
        **kwargs,
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def request() -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], tools=TOOLS)


def composed(name: str, tokenizer: Any, reasoning: bool = True) -> Any:
    return ParserManager.get_parser(
        tool_parser_name=name,
        reasoning_parser_name=name if reasoning else None,
        enable_auto_tools=True,
        tokenizer=tokenizer,
    )


def both_ways(
    name: str, tokenizer: Any, ids: list[int], text: str, reasoning: bool = True
) -> tuple[str | None, str | None, list[tuple[str, str]]]:
    """(reasoning, content, calls) of ``text`` after the prompt ``ids``; whole and streamed agree."""
    cls = composed(name, tokenizer, reasoning)
    whole = cls(tokenizer, request().tools)
    whole.set_prompt_token_ids(ids)
    r, c, calls = whole.parse(text, request(), enable_auto_tools=True)
    parsed = (r, c, [(f.name, f.arguments) for f in calls or []])
    stream = cls(tokenizer, request().tools)
    out_ids = tokenizer.encode(text, add_special_tokens=False)
    got_r = got_c = ""
    got_calls: list[tuple[str, str]] = []
    done = ""
    for k in range(1, len(out_ids) + 1):
        now = tokenizer.decode(out_ids[:k])
        if now.endswith("\ufffd") and k < len(out_ids):
            continue
        delta = stream.parse_delta(
            now[len(done) :], out_ids[k - 1 : k], request(), ids, finished=k == len(out_ids)
        )
        done = now
        if delta is not None:
            got_r += delta.reasoning or ""
            got_c += delta.content or ""
            got_calls += [(t.function.name, t.function.arguments) for t in delta.tool_calls]
    assert (got_r or None, got_c or None, got_calls) == parsed
    return parsed


@pytest.mark.parametrize("template", ["qwen3_thinking_2507", "deepseek_r1"])
@pytest.mark.parametrize("name", NAMES)
def test_the_prompts_open_span_is_reasoning_up_to_its_closing_tag(
    qwen3: Any, name: str, template: str
) -> None:
    ids = prompt(qwen3, template)
    assert both_ways(name, qwen3, ids, "I should answer.\n</think>\n\nHello!") == (
        "I should answer.\n",
        "\n\nHello!",
        [],
    )


@pytest.mark.parametrize("name", NAMES)
def test_an_output_cut_inside_the_prompts_span_is_all_reasoning(qwen3: Any, name: str) -> None:
    ids = prompt(qwen3, "qwen3_thinking_2507")
    assert both_ways(name, qwen3, ids, "Still thinking about it") == ("Still thinking about it", None, [])


@pytest.mark.parametrize("name", NAMES)
def test_the_call_after_the_prompts_span_arrives_and_a_call_tag_inside_it_is_text(
    qwen3: Any, name: str
) -> None:
    ids = prompt(qwen3, "deepseek_r1")
    text = f"Maybe <tool_call> later.</think>\n\n{CALL}"
    reasoning, content, calls = both_ways(name, qwen3, ids, text)
    assert reasoning == "Maybe <tool_call> later."
    assert not content
    assert calls == [("get_weather", '{"city": "Oslo", "days": 2}')]


@pytest.mark.parametrize("name", NAMES)
def test_without_a_reasoning_parser_the_prompts_span_is_content_and_its_call_tag_text(
    qwen3: Any, name: str
) -> None:
    ids = prompt(qwen3, "qwen3_thinking_2507")
    text = f"Maybe <tool_call> later.</think>\n\nOn it.{CALL}"
    reasoning, content, calls = both_ways(name, qwen3, ids, text, reasoning=False)
    assert reasoning is None
    assert content == "Maybe <tool_call> later.</think>\n\nOn it."
    assert calls == [("get_weather", '{"city": "Oslo", "days": 2}')]


@pytest.mark.parametrize("name", NAMES)
def test_qwen3s_own_template_in_thinking_mode_leaves_the_tags_to_the_model(qwen3: Any, name: str) -> None:
    """Qwen 3's hybrid template opens nothing in thinking mode; with thinking off it closes an empty span."""
    thinking = prompt(qwen3, None)
    assert both_ways(name, qwen3, thinking, "<think>\nPlan.\n</think>\n\nHello!") == (
        "\nPlan.\n",
        "\n\nHello!",
        [],
    )
    assert both_ways(name, qwen3, thinking, "Hello!") == (None, "Hello!", [])
    off = prompt(qwen3, None, enable_thinking=False)
    assert both_ways(name, qwen3, off, "Plan.</think> Hello!") == (None, "Plan.</think> Hello!", [])


@pytest.mark.parametrize("name", NAMES)
def test_a_tokenizer_whose_template_opens_the_span_starts_inside_it_before_any_prompt(
    qwen3: Any, name: str
) -> None:
    """A parser used directly (no prompt shown) reads the tokenizer's own generation prompt."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("qwen3")))
    tokenizer.chat_template = (TEMPLATES / "qwen3_thinking_2507.jinja").read_text(encoding="utf-8")
    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    assert parser.extract_reasoning("Why not.</think>Sure.", request()) == ("Why not.", "Sure.")
    out = tokenizer.encode("Why not.</think>Sure.", add_special_tokens=False)
    assert parser.extract_content_ids(out) == tokenizer.encode("Sure.", add_special_tokens=False)


@pytest.mark.parametrize("name", NAMES)
def test_content_ids_are_those_after_the_first_reasoning_span(qwen3: Any, name: str) -> None:
    parser = ReasoningParserManager.get_reasoning_parser(name)(qwen3)
    enc = lambda s: qwen3.encode(s, add_special_tokens=False)  # noqa: E731
    assert parser.extract_content_ids(enc("<think>a b</think>Done.")) == enc("Done.")
    assert parser.extract_content_ids(enc("<think>a b</think>")) == []  # nothing after it
    assert parser.extract_content_ids(enc("<think>a b")) == []  # reasoning goes on
    assert parser.extract_content_ids(enc("no span</think>yet")) == enc("yet")  # no prompt shown
    parser.adjust_initial_state_from_prompt(prompt(qwen3, None))
    assert parser.extract_content_ids(enc("no span</think>yet")) == []  # a stray tag closes nothing
    parser.adjust_initial_state_from_prompt(prompt(qwen3, "deepseek_r1"))
    assert parser.extract_content_ids(enc("a b</think>Done.")) == enc("Done.")
    assert parser.is_reasoning_end(enc("a b</think>Done."))
    assert not parser.is_reasoning_end(enc("a b"))


@pytest.mark.parametrize("name", NAMES)
def test_arguments_are_spaced_as_vllms_hermes_parser_returns_them(qwen3: Any, name: str) -> None:
    parser = ToolParserManager.get_tool_parser(name)(qwen3)
    text = (
        '<tool_call>\n{"name": "final_answer", "arguments": {"trigger":true,"n":[1,2],"s":"é"}}\n</tool_call>'
    )
    call = parser.extract_tool_calls(text, request()).tool_calls[0]
    assert call.function.arguments == '{"trigger": true, "n": [1, 2], "s": "é"}'


@pytest.mark.parametrize("name", NAMES)
def test_the_layout_before_a_call_reaches_the_tool_parser(qwen3: Any, name: str) -> None:
    """The reasoning parser hands the content on as written; only the tool parser drops layout."""
    parser = ReasoningParserManager.get_reasoning_parser(name)(
        qwen3, chat_template_kwargs={"enable_thinking": False}
    )
    text = "I need to read the file.\n\n<tool_call>\n<function=bash>\n</function>\n</tool_call>"
    assert parser.extract_reasoning(text, request()) == (None, text)
