"""Reasoning parsers shown no prompt read an output as vLLM's qwen3 and deepseek_r1 parsers do.

Code that builds a reasoning parser itself (offline pipelines, evaluation harnesses, vLLM's own
parser tests) shows it no prompt. A ``</think>`` with no opening tag before it then means the
prompt opened the span: what precedes it is reasoning, whole and streamed (the stream holds the
text until a tag or the end decides, so nothing it released is taken back). Where the
tokenizer's own template opens ``<think>`` in its generation prompt, the output starts inside it.
Text with no tag, under a template that opens nothing, stays content. A parser shown the prompt
reads where the prompt left the model (``tests/test_parsers_prompt.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager

from hermes_vllm.plugin import register
from hermes_vllm.testing import tiny_model_path

TEMPLATES = Path(__file__).parent / "templates"
NAMES = ["hermes_vllm", "hermes_vllm_qwen"]


@pytest.fixture(scope="module")
def qwen3() -> Any:
    """Qwen 3's tokenizer and its own hybrid template, which opens no span in the prompt."""
    from transformers import AutoTokenizer

    register()
    return AutoTokenizer.from_pretrained(str(tiny_model_path("qwen3")))


@pytest.fixture(scope="module")
def opening() -> Any:
    """Qwen 3's tokenizer with a template whose generation prompt ends ``<think>\\n`` (2507)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_path("qwen3")))
    tokenizer.chat_template = (TEMPLATES / "qwen3_thinking_2507.jinja").read_text(encoding="utf-8")
    return tokenizer


def request() -> ChatCompletionRequest:
    return ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}])


def whole(name: str, tokenizer: Any, text: str) -> tuple[str | None, str | None]:
    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    reasoning, content = parser.extract_reasoning(text, request())
    return reasoning, content


def streamed(name: str, tokenizer: Any, deltas: list[str]) -> tuple[str | None, str | None]:
    """What a stream of ``deltas`` releases, the end's flush included (``finish_streaming``)."""
    parser = ReasoningParserManager.get_reasoning_parser(name)(tokenizer)
    reasoning = content = ""
    previous = ""
    for delta in deltas:
        message = parser.extract_reasoning_streaming(previous, previous + delta, delta, [], [], [])
        previous += delta
        if message is not None:
            reasoning += message.reasoning or ""
            content += message.content or ""
    end = parser.finish_streaming()
    if end is not None:
        reasoning += end.reasoning or ""
        content += end.content or ""
    return reasoning or None, content or None


def tokens(tokenizer: Any, text: str) -> list[str]:
    """``text`` a token a delta, as vLLM's parser tests stream it."""
    return [tokenizer.convert_tokens_to_string([t]) for t in tokenizer.tokenize(text)]


CASES = [
    # (output, under a template that opens nothing, under one that opens <think>)
    ("Plan it.</think>The answer.", ("Plan it.", "The answer."), ("Plan it.", "The answer.")),
    ("Plan it.</think>", ("Plan it.", None), ("Plan it.", None)),
    ("</think>The answer.", (None, "The answer."), (None, "The answer.")),
    ("<think>Plan it.</think>The answer.", ("Plan it.", "The answer."), ("Plan it.", "The answer.")),
    ("<think>Plan it.", ("Plan it.", None), ("Plan it.", None)),
    ("\n<think>Plan it.</think>Go", ("Plan it.", "\nGo"), ("Plan it.", "\nGo")),
    ("The answer.", (None, "The answer."), ("The answer.", None)),
    ("Say <think>hm</think> ok", ("hm", "Say  ok"), None),
]


@pytest.mark.parametrize(("output", "plain", "opened"), CASES)
@pytest.mark.parametrize("name", NAMES)
def test_an_unopened_closing_tag_means_the_prompt_opened_reasoning_whole_and_streamed(
    qwen3: Any, opening: Any, name: str, output: str, plain: Any, opened: Any
) -> None:
    for tokenizer, expected in ((qwen3, plain), (opening, opened)):
        if expected is None:
            continue
        assert whole(name, tokenizer, output) == expected
        assert streamed(name, tokenizer, tokens(tokenizer, output)) == expected
        assert streamed(name, tokenizer, [output]) == expected


@pytest.mark.parametrize("name", NAMES)
def test_a_stream_releases_no_reasoning_as_content_before_the_closing_tag(qwen3: Any, name: str) -> None:
    """Deltas grouped as speculative decoding commits them; the first is held, not content."""
    parser = ReasoningParserManager.get_reasoning_parser(name)(qwen3)
    assert parser.extract_reasoning_streaming("", "Plan", "Plan", [], [], []) is None
    message = parser.extract_reasoning_streaming("Plan", "Plan</think>Go", "</think>Go", [], [], [])
    assert message is not None
    assert (message.reasoning, message.content) == ("Plan", "Go")


@pytest.mark.parametrize("name", NAMES)
def test_reasoning_end_and_content_ids_read_the_output_alone_the_same_way(qwen3: Any, name: str) -> None:
    parser = ReasoningParserManager.get_reasoning_parser(name)(qwen3)
    ids = qwen3.encode("Plan it.</think>The answer.", add_special_tokens=False)
    assert parser.is_reasoning_end(ids)
    assert parser.extract_content_ids(ids) == qwen3.encode("The answer.", add_special_tokens=False)
    assert parser.count_reasoning_tokens(ids) == len(qwen3.encode("Plan it.", add_special_tokens=False))
    assert not parser.is_reasoning_end(qwen3.encode("The answer.", add_special_tokens=False))


@pytest.mark.parametrize("name", NAMES)
def test_thinking_switched_off_reads_the_output_as_written(opening: Any, name: str) -> None:
    """``enable_thinking=False`` (vLLM passes ``chat_template_kwargs``): nothing is open, whatever the
    template writes (Thinking-2507's opens ``<think>`` regardless)."""
    parser = ReasoningParserManager.get_reasoning_parser(name)(
        opening, chat_template_kwargs={"enable_thinking": False}
    )
    assert parser.extract_reasoning("Just the answer.", request()) == (None, "Just the answer.")
