"""``uniqueItems`` over a small ``enum`` (issue 28, item 2): pydantic's ``set[Enum]`` and
``set[Literal[...]]``, spelled out as the arrays of distinct members, on every engine."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel

from hermes_vllm import constraint_args
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.schema import normalize_tool
from hermes_vllm.spans import split_spans
from hermes_vllm.testing.adversary import SAMPLERS, Scenario, run


class Channel(StrEnum):
    mail = "mail"
    sms = "sms"
    push = "push"


class Notify(BaseModel):
    via: set[Channel]
    days: frozenset[Literal["mon", "tue"]] = frozenset()


NOTIFY = {"type": "function", "function": {"name": "notify", "parameters": Notify.model_json_schema()}}
ENGINES = ("xgrammar", "llguidance", "outlines", "auto")


def call(arguments: dict[str, Any]) -> str:
    return f'<tool_call>{{"name": "notify", "arguments": {json.dumps(arguments)}}}</tool_call>'


def test_a_set_of_enum_members_is_spelled_out() -> None:
    via = normalize_tool(NOTIFY).parameters["properties"]["via"]
    assert "uniqueItems" not in json.dumps(via)
    assert len(via["anyOf"]) == 1 + 3 + 6 + 6


@pytest.mark.parametrize("engine", ENGINES)
def test_every_engine_admits_distinct_members_only(tokenizer: Any, engine: str) -> None:
    grammar = ToolGrammarCompiler(tokenizer, engine=engine).compile([NOTIFY])
    for via in ([], ["sms"], ["push", "mail"], ["sms", "mail", "push"]):
        assert grammar.matcher().accepts_text(call({"via": via, "days": ["tue", "mon"]})), via
    for via in (["sms", "sms"], ["mail", "push", "mail"], ["fax"]):
        assert not grammar.matcher().accepts_text(call({"via": via})), via
    assert not grammar.matcher().accepts_text(call({"via": [], "days": ["mon", "mon"]}))


def test_a_set_of_free_strings_is_still_refused_by_name(tokenizer: Any) -> None:
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    tags = {"type": "function", "function": {"name": "tag", "parameters": schema}}
    with pytest.raises(ValueError, match="uniqueItems"):
        ToolGrammarCompiler(tokenizer, engine="auto").compile([tags])


def test_worst_case_calls_hold_distinct_members(tokenizer: Any) -> None:
    """Every sampler, ``required`` and named, from the reserve up: jsonschema (``uniqueItems``
    as sent) and ``Notify.model_validate`` accept each call (the tool was refused before)."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto")
    state = core.admit(constraint_args([NOTIFY], "required"), [], max_tokens=1000)
    assert state is not None and state.budget is not None
    validator = Draft202012Validator(Notify.model_json_schema())
    for sampler in SAMPLERS:
        for choice, extra in (("required", 0), ("notify", 6), ("required", 40)):
            outcome = run(core, tokenizer, Scenario([NOTIFY], choice, state.budget.reserve + extra), sampler)
            assert outcome.kept(None), (sampler, choice, extra, outcome)
            for span in split_spans(outcome.text, get_dialect("hermes"), strict=True):
                if span.kind == "call":
                    arguments = json.loads(span.body)["arguments"]
                    validator.validate(arguments)
                    Notify.model_validate(arguments)
