"""The Jinja chat template of a dialect: one generic ChatML template plus the dialect's data.

``grammars/templates/chatml.jinja`` names no tag; this module puts ``{%- set ... %}`` lines in
front of it with the dialect's tags, preamble and escape steps (the very steps
:mod:`hermes_vllm.formats.escape` applies in Python), so no tag string is written twice.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import json_escape_steps, text_escape_steps
from hermes_vllm.formats.system import SEPARATOR, preamble_parts

TEMPLATE_FILE = "chatml.jinja"


def _literal(value: object) -> str:
    """A Jinja literal for ``value``: JSON strings, lists and booleans are valid Jinja."""
    return json.dumps(value, ensure_ascii=False)


def template_variables(dialect: str | Dialect = "hermes") -> dict[str, object]:
    """What the generic template needs to know about ``dialect``."""
    d = get_dialect(dialect)
    head, tail = preamble_parts(d)
    reasoning = d.reasoning[0] if d.reasoning else None
    return {
        "turn_begin": d.turn.begin,
        "turn_end": d.turn.end,
        "call_begin": d.tool_call.begin,
        "call_end": d.tool_call.end,
        "response_begin": d.tool_response.begin,
        "response_end": d.tool_response.end,
        "response_role": d.response_role,
        "reasoning_begin": reasoning.begin if reasoning else "",
        "reasoning_end": reasoning.end if reasoning else "",
        "reasoning_after_last_query": d.reasoning_history == "after_last_query",
        "thinking_switch": d.thinking_switch,
        "arguments_first": d.key_order == "arguments_first",
        "preamble_head": head,
        "preamble_tail": tail,
        "system_separator": SEPARATOR,
        "text_escapes": [list(step) for step in text_escape_steps(d)],
        "json_escapes": [list(step) for step in json_escape_steps(d)],
    }


@cache
def chat_template(dialect: str | Dialect = "hermes") -> str:
    """Jinja ChatML template for ``dialect``; renders exactly what ``build_hermes_prompt`` does."""
    d = get_dialect(dialect)
    header = "".join(f"{{%- set {k} = {_literal(v)} %}}\n" for k, v in template_variables(d).items())
    body = resources.files("hermes_vllm.grammars").joinpath("templates", TEMPLATE_FILE)
    return f"{{#- hermes-vllm ChatML template, dialect {d.name} -#}}\n" + header + body.read_text("utf-8")
