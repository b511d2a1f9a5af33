"""Hermes ChatML formats: prompt rendering, chat templates, tool-call formatting, conversions.

Every piece of message text is escaped so that no message can spell a control string of any
built-in dialect (or a tokenizer's own tokens, with ``reserve_tokens``);
:mod:`hermes_vllm.formats.escape` documents the scheme.
"""

from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.formats.escape import WORD_JOINER, escape_json_text, escape_text, unescape_text
from hermes_vllm.formats.formatter import HermesFunctionFormatter, ParsedMessage
from hermes_vllm.formats.models import HermesToolCall, HermesToolResponse, ToolCall, ToolResponse
from hermes_vllm.formats.openai import MASK, HermesMessage, hermes_to_openai, openai_to_hermes, tool_call_id
from hermes_vllm.formats.payload import dump_json, load_payload, parse_call_payload, parse_response_payload
from hermes_vllm.formats.prompt import build_hermes_prompt
from hermes_vllm.formats.sharegpt import (
    ShareGPTConversation,
    ShareGPTMessage,
    openai_to_sharegpt,
    sharegpt_to_openai,
)
from hermes_vllm.formats.token_check import TokenReport, reserve_tokens, validate_prompt_tokens

__all__ = [
    "MASK",
    "WORD_JOINER",
    "HermesFunctionFormatter",
    "HermesMessage",
    "HermesToolCall",
    "HermesToolResponse",
    "ParsedMessage",
    "ShareGPTConversation",
    "ShareGPTMessage",
    "TokenReport",
    "ToolCall",
    "ToolResponse",
    "build_hermes_prompt",
    "chat_template",
    "dump_json",
    "escape_json_text",
    "escape_text",
    "hermes_to_openai",
    "load_payload",
    "openai_to_hermes",
    "openai_to_sharegpt",
    "parse_call_payload",
    "parse_response_payload",
    "reserve_tokens",
    "sharegpt_to_openai",
    "tool_call_id",
    "unescape_text",
    "validate_prompt_tokens",
]
