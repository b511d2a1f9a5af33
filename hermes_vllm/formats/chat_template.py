"""The Jinja chat template of a dialect: one generic ChatML template plus the dialect's data.

``grammars/templates/chatml.jinja`` names no tag; this module puts ``{%- set ... %}`` lines in
front of it with the dialect's tags, preamble and escape steps (the very steps
:mod:`hermes_vllm.formats.escape` applies in Python, grouped by prefix), so no tag string is
written twice.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import Step, json_escape_steps, text_escape_steps
from hermes_vllm.formats.system import SEPARATOR, preamble_parts

TEMPLATE_FILE = "chatml.jinja"


def _literal(value: object) -> str:
    """A Jinja literal for ``value``: JSON strings, lists and booleans are valid Jinja."""
    return json.dumps(value, ensure_ascii=False)


GROUP_SIZE = 32
"""Most steps under one guard (see :func:`_grouped`)."""


def _common_prefix(a: str, b: str) -> str:
    return a[: next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))]


def _grouped(steps: tuple[Step, ...]) -> list[tuple[str, list[Step]]]:
    """Runs of at most :data:`GROUP_SIZE` consecutive steps, each under its ``old`` strings' common prefix.

    The template skips a run whose prefix the text does not hold (each of its replacements would
    find nothing), so the replacements made are exactly the list's. A tokenizer's reserved tokens
    can be a thousand steps (tekken's ``<SPECIAL_n>``) and a Jinja replace step costs tens of
    microseconds in the sandbox, so a run ends where its prefix would shrink below two characters
    (a lone ``<`` is in too much text).
    """
    groups: list[tuple[str, list[Step]]] = []
    for old, new in steps:
        prefix = _common_prefix(groups[-1][0], old) if groups else ""
        if len(prefix) < 2 or len(groups[-1][1]) == GROUP_SIZE:
            groups.append((old, [(old, new)]))
        else:
            groups[-1] = (prefix, [*groups[-1][1], (old, new)])
    return groups


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
        "text_escapes": _grouped(text_escape_steps(d)),
        "json_escapes": _grouped(json_escape_steps(d)),
    }


@cache
def chat_template(dialect: str | Dialect = "hermes") -> str:
    """Jinja ChatML template for ``dialect``; renders exactly what ``build_hermes_prompt`` does."""
    d = get_dialect(dialect)
    header = "".join(f"{{%- set {k} = {_literal(v)} %}}\n" for k, v in template_variables(d).items())
    body = resources.files("hermes_vllm.grammars").joinpath("templates", TEMPLATE_FILE)
    return f"{{#- hermes-vllm ChatML template, dialect {d.name} -#}}\n" + header + body.read_text("utf-8")
