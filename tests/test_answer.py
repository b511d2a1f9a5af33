"""Tools and a final answer's schema in one turn grammar (a request's ``response_format`` beside
its ``tools``): under ``auto`` reasoning, then calls or the answer as JSON in its schema, never
free text; under ``none`` the answer only; where a call is required, the answer is unused. The
engines that cannot write such a turn refuse it at admission, naming the response_format."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from support.soundness import tool

from hermes_vllm.constraint import constraint_args, decode_constraint, parse_constraint
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.compiler import prepare_constraint
from hermes_vllm.grammar.engines import get_engine_class
from hermes_vllm.processor.core import ConstraintCore, validate_request
from hermes_vllm.settings import get_limits
from hermes_vllm.testing.adversary import SAMPLERS, Scenario, run

ADD = tool({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "add")
ANSWER = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"enum": ["low", "high"]}},
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
REPLY = '{"answer": "four", "confidence": "high"}'
TEXTS: dict[str, str] = {
    "answer": REPLY,
    "reasoning, answer": f"<think>add them</think>\n\n{REPLY}\n",
    "call": CALL,
    "reasoning, call": f"<think>add them</think>\n\n{CALL}",
    "two calls": f"{CALL}\n{CALL}",
    "text": "The answer is four.",
    "text, answer": f"Sure. {REPLY}",
    "answer, text": f"{REPLY} Done.",
    "call, answer": f"{CALL}\n{REPLY}",
    "answer off schema": '{"answer": "four", "confidence": "sure"}',
    "answer with an extra key": '{"answer": "four", "confidence": "high", "x": 1}',
    "answer spelling a tag": '{"answer": "<think>", "confidence": "high"}',
    "answer escaping a tag": '{"answer": "\\u003cthink>", "confidence": "high"}',
    "reasoning only": "<think>add them</think>",
    "nothing": "",
}
ACCEPTED: dict[tuple[str, bool], set[str]] = {
    ("auto", True): {
        "answer",
        "reasoning, answer",
        "call",
        "reasoning, call",
        "two calls",
        "answer escaping a tag",
    },
    ("auto", False): {"answer", "reasoning, answer", "call", "reasoning, call", "answer escaping a tag"},
    ("none", True): {"answer", "reasoning, answer", "answer escaping a tag"},
    ("required", True): {"call", "reasoning, call", "two calls"},
}
"""Under ``required`` the answer is unused and the turn is calls only (without a response_format
free text may follow a required call). An answer's strings spell no tag (the parsers and the
processor read a raw ``<think>`` there as a span): ``<`` is written as JSON's ``\u003c``."""
_COMPILERS: dict[str, ToolGrammarCompiler] = {}


def compiler_for(engine: str, tokenizer: Any) -> ToolGrammarCompiler:
    if engine not in _COMPILERS:
        _COMPILERS[engine] = ToolGrammarCompiler(tokenizer, engine=engine)
    return _COMPILERS[engine]


def accepts(compiler: ToolGrammarCompiler, raw: str, text: str) -> bool:
    """Whether the turn's matcher takes ``text`` token by token and may end after it."""
    prepared = prepare_constraint(decode_constraint(raw), type(compiler.engine), compiler.limits)
    matcher = compiler.result(prepared, compiler.submit(prepared)).matcher()
    ids = compiler.vocab.tokenizer.encode(text, add_special_tokens=False)
    return all(matcher.accept_token(t) for t in ids) and matcher.can_end()


@pytest.mark.parametrize("engine", ["xgrammar", "auto"])
@pytest.mark.parametrize(("mode", "parallel"), list(ACCEPTED), ids=[f"{m}-{p}" for m, p in ACCEPTED])
def test_an_answer_turn_is_calls_or_the_answer_never_free_text(
    engine: str, mode: str, parallel: bool, tokenizer: Any
) -> None:
    compiler = compiler_for(engine, tokenizer)
    raw = constraint_args([ADD], mode, parallel, answer=ANSWER)["hermes_vllm"]
    verdicts = {name: accepts(compiler, raw, text) for name, text in TEXTS.items()}
    assert {name for name, ok in verdicts.items() if ok} == ACCEPTED[mode, parallel]


def test_a_required_call_leaves_the_answer_unused_and_owes_no_answer(tokenizer: Any) -> None:
    xgrammar = get_engine_class("xgrammar")
    limits = get_limits()
    required = prepare_constraint(
        decode_constraint(constraint_args([ADD], "required", answer=ANSWER)["hermes_vllm"]), xgrammar, limits
    )
    other = prepare_constraint(
        decode_constraint(constraint_args([ADD], "required", answer=NESTED)["hermes_vllm"]), xgrammar, limits
    )
    assert not required.spec.answers and required.spec.key() == other.spec.key()  # one grammar
    core = ConstraintCore(lambda: tokenizer, len(tokenizer))
    state = core.admit(constraint_args([ADD], "required", answer=ANSWER), [], max_tokens=100)
    assert state is not None and state.budget is not None and state.budget.answer is None
    auto = prepare_constraint(
        decode_constraint(constraint_args([ADD], "auto", answer=ANSWER)["hermes_vllm"]), xgrammar, limits
    )
    assert auto.spec.answers and not auto.spec.free_text


@pytest.mark.parametrize("engine", ["llguidance", "outlines"])
def test_engines_that_cannot_write_an_answer_refuse_it_at_admission(engine: str) -> None:
    with pytest.raises(ValueError, match="response_format"):
        validate_request(constraint_args([ADD], "auto", answer=ANSWER), engine)
    validate_request(constraint_args([ADD], "required", answer=ANSWER), engine)  # the answer is unused


def test_the_auto_engine_refuses_an_answer_beside_schemas_only_llguidance_writes() -> None:
    patterned = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}$"}}}
    with pytest.raises(ValueError, match="response_format beside tools is written by xgrammar only"):
        validate_request(constraint_args([ADD], "auto", answer=patterned), "auto")
    validate_request(constraint_args([ADD], "auto", answer=ANSWER), "auto")


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ({"type": "string"}, "response_format.*JSON object"),
        (
            {"type": "object", "properties": {"a": {"type": "nope"}}},
            "response_format.*not a valid JSON Schema",
        ),
    ],
)
def test_an_answer_schema_the_turn_cannot_take_is_a_readable_400(answer: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_request(constraint_args([ADD], "auto", answer=answer), "xgrammar")
    raw = {**json.loads(constraint_args([ADD])["hermes_vllm"]), "answer": 1}
    with pytest.raises(ValueError, match="answer: expected a JSON schema object"):
        parse_constraint({"hermes_vllm": json.dumps(raw)})


def test_a_row_with_an_answer_is_masked_from_its_first_token(tokenizer: Any) -> None:
    """No gate: free text is not the model's own in an answer turn, so the engine masks every token
    (a gated row would let ``The`` through and only the grammar's end would refuse it)."""
    vocab_size = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, vocab_size)
    state = core.admit(constraint_args([ADD], "auto", answer=ANSWER), [tokenizer.eos_token_id])
    assert state is not None and not state.gated
    logits = torch.zeros((1, vocab_size))
    core.step(logits, [(0, state, [])])
    allowed = {t for t in range(vocab_size) if logits[0, t] > float("-inf")}
    (the,) = tokenizer.encode("The", add_special_tokens=False)[-1:]
    (brace,) = tokenizer.encode("{", add_special_tokens=False)[-1:]
    assert the not in allowed and brace in allowed
    assert tokenizer.eos_token_id not in allowed


NESTED = {
    "type": "object",
    "properties": {
        "answer": {"type": "string"},
        "confidence": {"enum": ["low", "high"]},
        "sources": {"type": "array", "items": {"type": "string"}},
        "notes_for_the_user_in_a_longer_form": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    "required": ["answer", "confidence"],
    "additionalProperties": False,
}
WEATHER = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "include_historical_weather_data": {"type": "boolean"}},
        "required": ["city"],
    },
}


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("mode", ["auto", "none"])
def test_a_call_or_the_answer_always_arrives_before_max_tokens(
    mode: str, sampler: str, tokenizer: Any
) -> None:
    """The worst-case samplers (they write only what the mask allows, never end the reply or close
    a span while anything else is allowed) against a turn owing a call or its answer: every reply
    holds a complete valid call or a whole answer valid for its schema, at every ``max_tokens``
    from the answer's reserve on, with and without a thinking budget."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer))
    state = core.admit(constraint_args([WEATHER], mode, answer=NESTED), [], max_tokens=1000)
    assert state is not None and state.budget is not None
    low = state.budget.answer_reserve
    scenarios = [
        Scenario([WEATHER], mode, low + k, thinking_budget=budget, answer=NESTED)
        for k in (0, 1, 3, 7, 12, 20, 33, 60)
        for budget in (None, 6)
    ]
    lost = []
    for scenario in scenarios:
        outcome = run(core, tokenizer, scenario, sampler, seed=scenario.max_tokens)
        if not outcome.kept(scenario.thinking_budget):
            lost.append((scenario.max_tokens, scenario.thinking_budget, outcome.failed, outcome.text))
    assert not lost, lost
