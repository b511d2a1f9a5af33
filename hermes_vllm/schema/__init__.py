"""Tool definitions -> one normalised JSON Schema per tool, and the keyword coverage policy.

``tool`` normalises (OpenAI, bare, BFCL) within the limits; ``rewrite`` makes implicit JSON Schema
meaning explicit so engines read schemas as validators do; ``coverage`` refuses or strips what an
engine would ignore; ``tree`` walks schemas; ``spec`` holds the shared types.
"""

from hermes_vllm.schema.coverage import (
    Coverage,
    UncoveredKeyword,
    check_coverage,
    strip_keywords,
    uncovered_keywords,
)
from hermes_vllm.schema.rewrite import (
    ANY_ORDER_KEYS,
    ROOT_DEF,
    canonical_value,
    make_explicit,
    search_as_full_match,
    value_key,
)
from hermes_vllm.schema.satisfiable import Contradiction, UnsatisfiableToolError, contradiction
from hermes_vllm.schema.spec import JSON, ToolSchemaError, ToolSpec
from hermes_vllm.schema.tool import (
    bfcl_to_json_schema,
    canonical_json,
    normalize_tool,
    normalize_tools,
    read_tools,
)
from hermes_vllm.schema.tree import CONSTRAINING, iter_subschemas, resolve_ref

__all__ = [
    "ANY_ORDER_KEYS",
    "CONSTRAINING",
    "JSON",
    "ROOT_DEF",
    "Contradiction",
    "Coverage",
    "ToolSchemaError",
    "ToolSpec",
    "UncoveredKeyword",
    "UnsatisfiableToolError",
    "bfcl_to_json_schema",
    "canonical_json",
    "canonical_value",
    "check_coverage",
    "contradiction",
    "iter_subschemas",
    "make_explicit",
    "normalize_tool",
    "normalize_tools",
    "read_tools",
    "resolve_ref",
    "search_as_full_match",
    "strip_keywords",
    "uncovered_keywords",
    "value_key",
]
