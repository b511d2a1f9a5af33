"""The plugin registers the parsers under their names, and ``adjust_request`` constrains requests."""

from __future__ import annotations

import json
import logging
import os
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager

from hermes_vllm.constraint import ARGS_KEY, constraint_args
from hermes_vllm.dialect import get_dialect
from hermes_vllm.parsers import PARSERS, register_parsers
from hermes_vllm.plugin import register
from hermes_vllm.processor.admission import validate_request
from hermes_vllm.processor.handshake import ENV as HANDSHAKE_ENV
from hermes_vllm.schema import ToolSchemaError

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}


def test_the_plugin_is_an_entry_point_and_registers_every_name_idempotently() -> None:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert plugins.get("hermes_vllm") == "hermes_vllm.plugin:register"
    register()
    register()
    assert Path(os.environ[HANDSHAKE_ENV]).is_dir()
    for name, dialect in PARSERS.items():
        tool_parser = ToolParserManager.get_tool_parser(name)
        reasoning_parser = ReasoningParserManager.get_reasoning_parser(name)
        assert tool_parser.dialect_name == reasoning_parser.dialect_name == dialect
        assert tool_parser.__module__ == reasoning_parser.__module__ == "hermes_vllm.parsers.dialects"
    register()
    assert ToolParserManager.get_tool_parser("hermes_vllm").dialect_name == "hermes"


def test_the_names_are_not_vllm_builtins() -> None:
    from vllm.reasoning import _REASONING_PARSERS_TO_REGISTER
    from vllm.tool_parsers import _TOOL_PARSERS_TO_REGISTER

    assert not set(PARSERS) & (set(_TOOL_PARSERS_TO_REGISTER) | set(_REASONING_PARSERS_TO_REGISTER))


def test_a_name_taken_by_another_package_is_left_to_it(caplog: Any) -> None:
    saved = ToolParserManager.lazy_parsers.get("hermes_vllm_qwen")
    ToolParserManager.tool_parsers.pop("hermes_vllm_qwen", None)
    ToolParserManager.lazy_parsers["hermes_vllm_qwen"] = ("someone.else", "TheirParser")
    try:
        with caplog.at_level(logging.ERROR, logger="hermes_vllm"):
            register_parsers()
        assert ToolParserManager.lazy_parsers["hermes_vllm_qwen"] == ("someone.else", "TheirParser")
        assert "'hermes_vllm_qwen' is taken by someone.else" in caplog.text
    finally:
        if saved is not None:
            ToolParserManager.lazy_parsers["hermes_vllm_qwen"] = saved
        register_parsers()
    assert ToolParserManager.get_tool_parser("hermes_vllm_qwen").dialect_name == "qwen"


def adjusted(name: str, tokenizer: Any, **fields: Any) -> ChatCompletionRequest:
    """A request after vLLM's composed parser (reasoning + tool) adjusted it, as the server does."""
    register()
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}], **fields)
    cls = ParserManager.get_parser(
        tool_parser_name=name, reasoning_parser_name=name, enable_auto_tools=True, tokenizer=tokenizer
    )
    adjusted: ChatCompletionRequest = cls(tokenizer, request.tools).adjust_request(request)
    return adjusted


@pytest.mark.parametrize("name", sorted(PARSERS))
@pytest.mark.parametrize("tool_choice", ["auto", "required", NAMED, "none"])
@pytest.mark.parametrize("parallel", [True, False])
def test_a_plain_tools_request_is_constrained_through_vllm_xargs(
    name: str, tool_choice: Any, parallel: bool, vllm_tokenizer: Any
) -> None:
    request = adjusted(
        name,
        vllm_tokenizer,
        tools=[WEATHER],
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        vllm_xargs={"other": "kept"},
    )
    expected = constraint_args([WEATHER], tool_choice, parallel, PARSERS[name])[ARGS_KEY]
    assert request.vllm_xargs is not None and request.vllm_xargs.keys() == {"other", ARGS_KEY}
    assert json.loads(request.vllm_xargs[ARGS_KEY]) == json.loads(expected)
    # vLLM's own tool constraint stays off: our processor enforces the dialect's format.
    assert request.structured_outputs is None
    # The tags are plain added tokens in both tokenizers, so special tokens may still be skipped
    # (vLLM 0.33 leaves the request's field None and resolves it when building the sampling params).
    params = request.to_sampling_params(64, {})
    assert params.skip_special_tokens is True
    # What the processor's frontend check (validate_params -> HTTP 400) accepts.
    constraint = validate_request(params.extra_args, "xgrammar")
    assert constraint is not None and constraint.dialect == PARSERS[name]


def test_a_request_without_tools_is_left_alone(vllm_tokenizer: Any) -> None:
    request = adjusted("hermes_vllm", vllm_tokenizer)
    assert request.vllm_xargs is None


def test_a_client_constraint_under_our_key_is_replaced(vllm_tokenizer: Any) -> None:
    forged = constraint_args([], "none")
    request = adjusted("hermes_vllm", vllm_tokenizer, tools=[WEATHER], vllm_xargs=forged)
    assert request.vllm_xargs == constraint_args([WEATHER])


def test_special_token_tags_are_kept_in_the_text(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    tags = sorted(get_dialect("hermes").parsed_tags)
    tokenizer.add_special_tokens({"additional_special_tokens": tags})
    for request in (adjusted("hermes_vllm", tokenizer, tools=[WEATHER]), adjusted("hermes_vllm", tokenizer)):
        assert request.to_sampling_params(64, {}).skip_special_tokens is False


def test_a_malformed_schema_is_refused_naming_the_tool_and_the_path(vllm_tokenizer: Any) -> None:
    schema = {"properties": {"x": {"type": "strin"}}}
    bad = {"type": "function", "function": {"name": "bad", "parameters": schema}}
    request = adjusted("hermes_vllm", vllm_tokenizer, tools=[WEATHER, bad])
    with pytest.raises(ToolSchemaError, match=r"tool 'bad': parameters/properties/x/type"):
        validate_request(request.to_sampling_params(64, {}).extra_args, "xgrammar")


def test_our_composed_parser_asks_vllm_to_adjust_tool_choice_none_requests(vllm_tokenizer: Any) -> None:
    """Without a reasoning parser vLLM adjusts a "none" request only if the parser class asks."""
    register()
    ours = ParserManager.get_parser(tool_parser_name="hermes_vllm", enable_auto_tools=True)
    theirs = ParserManager.get_parser(tool_parser_name="hermes", enable_auto_tools=True)
    assert ours is not None and ours.always_adjust_request
    assert theirs is not None and not theirs.always_adjust_request
    request = ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice="none"
    )
    ours(vllm_tokenizer, request.tools).adjust_request(request)
    assert request.vllm_xargs == constraint_args([WEATHER], "none")


RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("responses_choice", "chat_choice"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        ({"type": "function", "name": "get_weather"}, NAMED),
        (
            {
                "type": "allowed_tools",
                "mode": "required",
                "tools": [{"type": "function", "name": "get_weather"}],
            },
            {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [NAMED]}},
        ),
    ],
)
def test_a_responses_api_request_is_constrained_like_its_chat_twin(
    responses_choice: Any, chat_choice: Any, vllm_tokenizer: Any
) -> None:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    register()
    cls = ParserManager.get_parser(tool_parser_name="hermes_vllm", enable_auto_tools=True)
    request = ResponsesRequest(
        model="tiny", input="hi", tools=[RESPONSES_WEATHER], tool_choice=responses_choice
    )
    cls(vllm_tokenizer, request.tools).adjust_request(request)
    sent = validate_request(request.to_sampling_params(64, {}).extra_args, "xgrammar")
    twin = validate_request(constraint_args([WEATHER], chat_choice), "xgrammar")
    assert sent is not None and twin is not None
    assert sent.tool_choice == twin.tool_choice
    assert [t["function"]["name"] for t in sent.tools] == ["get_weather"]
    assert sent.tools[0]["function"]["parameters"] == WEATHER["function"]["parameters"]  # type: ignore[index]


def test_a_responses_choice_of_a_builtin_tool_is_refused_by_name(vllm_tokenizer: Any) -> None:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest

    register()
    cls = ParserManager.get_parser(tool_parser_name="hermes_vllm", enable_auto_tools=True)
    request = ResponsesRequest(
        model="tiny", input="hi", tools=[RESPONSES_WEATHER], tool_choice={"type": "web_search_preview"}
    )
    with pytest.raises(ValueError, match="function tools only, got type 'web_search_preview'"):
        cls(vllm_tokenizer, request.tools).adjust_request(request)
