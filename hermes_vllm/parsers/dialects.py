"""One tool parser and one reasoning parser class per registered name: they only name a dialect.

vLLM registers parsers by module path and class name and builds them from the tokenizer alone,
so each dialect needs classes of its own; :func:`hermes_vllm.parsers.register_parsers` points at
the names bound here.
"""

from __future__ import annotations

from hermes_vllm.parsers import PARSERS, parser_class_names
from hermes_vllm.parsers.reasoning_parser import DialectReasoningParser
from hermes_vllm.parsers.tool_parser import DialectToolParser


def _classes(name: str) -> tuple[type[DialectToolParser], type[DialectReasoningParser]]:
    tool_class, reasoning_class = parser_class_names(name)
    attrs = {"dialect_name": PARSERS[name], "__module__": __name__}
    tool = type(tool_class, (DialectToolParser,), attrs)
    return tool, type(reasoning_class, (DialectReasoningParser,), attrs)


HermesToolParser, HermesReasoningParser = _classes("hermes_vllm")
QwenToolParser, QwenReasoningParser = _classes("hermes_vllm_qwen")
BracketsToolParser, BracketsReasoningParser = _classes("hermes_vllm_brackets")
