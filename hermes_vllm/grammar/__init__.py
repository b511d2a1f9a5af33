"""Span grammars: a request's tools -> one compiled turn grammar -> per-request matchers."""

from hermes_vllm.grammar.compiler import (
    CompiledToolGrammar,
    GrammarCompileError,
    PreparedTurn,
    ToolCallMatcher,
    ToolGrammarCompiler,
    shared_cache,
)
from hermes_vllm.grammar.engines import ENGINES, get_engine_class
from hermes_vllm.grammar.turn import turn_spec
from hermes_vllm.schema import ToolSchemaError

__all__ = [
    "ENGINES",
    "CompiledToolGrammar",
    "GrammarCompileError",
    "PreparedTurn",
    "ToolCallMatcher",
    "ToolGrammarCompiler",
    "ToolSchemaError",
    "TurnSpec",
    "get_engine_class",
    "shared_cache",
    "turn_spec",
]
