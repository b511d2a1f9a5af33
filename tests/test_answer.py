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
from hermes_vllm.processor.admission import validate_request
from hermes_vllm.processor.core import ConstraintCore
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
processor read a raw ``<think>`` there as a span): ``<`` is written as JSON's ``\u003c`` (xgrammar);
llguidance spells every character one way, raw, so there an answer's strings hold no ``<``."""
ESCAPED = "answer escaping a tag"


def accepted(engine: str, mode: str, parallel: bool) -> set[str]:
    return ACCEPTED[mode, parallel] - ({ESCAPED} if engine == "llguidance" else set())


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


@pytest.mark.parametrize("engine", ["xgrammar", "auto", "llguidance"])
@pytest.mark.parametrize(("mode", "parallel"), list(ACCEPTED), ids=[f"{m}-{p}" for m, p in ACCEPTED])
def test_an_answer_turn_is_calls_or_the_answer_never_free_text(
    engine: str, mode: str, parallel: bool, tokenizer: Any
) -> None:
    compiler = compiler_for(engine, tokenizer)
    raw = constraint_args([ADD], mode, parallel, answer=ANSWER)["hermes_vllm"]
    verdicts = {name: accepts(compiler, raw, text) for name, text in TEXTS.items()}
    assert {name for name, ok in verdicts.items() if ok} == accepted(engine, mode, parallel)


BOUNDED = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 12},
        "code": {"type": "string", "pattern": "^[A-Z<]{2}$"},
    },
    "required": ["answer", "code"],
    "additionalProperties": False,
}
"""An answer only llguidance writes (a length bound, a pattern), whose pattern would allow ``<``."""


@pytest.mark.parametrize(("mode", "parallel"), list(ACCEPTED), ids=[f"{m}-{p}" for m, p in ACCEPTED])
def test_the_auto_engine_writes_an_answer_only_llguidance_enforces(
    mode: str, parallel: bool, tokenizer: Any
) -> None:
    """Its bounds hold, its pattern is intersected with "no tag's first character", and the turn is
    the same language as xgrammar's around it."""
    compiler = compiler_for("auto", tokenizer)
    raw = constraint_args([ADD], mode, parallel, answer=BOUNDED)["hermes_vllm"]
    reply = '{"answer": "four", "code": "AB"}'
    texts = {
        **{name: text.replace(REPLY, reply) for name, text in TEXTS.items() if name not in (ESCAPED,)},
        "answer too long": '{"answer": "four and more!!", "code": "AB"}',
        "answer off pattern": '{"answer": "four", "code": "ab"}',
        "answer spelling a tag by its pattern": '{"answer": "four", "code": "A<"}',
    }
    verdicts = {name: accepts(compiler, raw, text) for name, text in texts.items()}
    assert {name for name, ok in verdicts.items() if ok} == accepted("llguidance", mode, parallel)


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


def test_the_outlines_engine_cannot_write_an_answer_and_refuses_it_at_admission() -> None:
    with pytest.raises(ValueError, match="response_format"):
        validate_request(constraint_args([ADD], "auto", answer=ANSWER), "outlines")
    validate_request(constraint_args([ADD], "required", answer=ANSWER), "outlines")  # the answer is unused


@pytest.mark.parametrize(
    ("answer", "where", "what"),
    [
        ({"type": "object"}, "parameters", "an object with keys of any spelling"),
        (
            {"type": "object", "properties": {"a": {}}, "required": ["a"]},
            "parameters/properties/a",
            "an untyped value",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "array"}}},
            "parameters/properties/a",
            "an array of untyped items",
        ),
    ],
)
@pytest.mark.parametrize("engine", ["llguidance", "auto"])
def test_llguidance_refuses_an_answer_whose_strings_no_schema_holds_to_no_tag(
    engine: str, answer: dict[str, Any], where: str, what: str
) -> None:
    """A key of a free-form object, or a string inside an untyped value, could spell a tag: with no
    way to escape ``<`` and no ``propertyNames``, llguidance refuses such an answer by name (under
    ``auto`` only when the turn needs llguidance: xgrammar escapes the character instead)."""
    bounded = tool({"type": "object", "properties": {"s": {"type": "string", "maxLength": 4}}}, "short")
    message = f"tool 'response_format': {where}: {what}.*HERMES_VLLM_ENGINE=xgrammar"
    with pytest.raises(ValueError, match=message):
        validate_request(constraint_args([bounded], "auto", answer=answer), engine)
    validate_request(constraint_args([bounded], "required", answer=answer), engine)  # the answer is unused
    validate_request(constraint_args([ADD], "auto", answer=answer), "xgrammar")


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
    assert state is not None and not state.gate.on
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


BOUNDED_NESTED = {
    **NESTED,
    "properties": {
        **NESTED["properties"],
        "answer": {"type": "string", "maxLength": 40},
        "sources": {"type": "array", "items": {"type": "string", "format": "uri"}},
    },
}
"""NESTED with a bounded string and a format: the auto engine writes it with llguidance."""


@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("mode", ["auto", "none"])
@pytest.mark.parametrize("answer", [NESTED, BOUNDED_NESTED], ids=["xgrammar", "llguidance"])
def test_a_call_or_the_answer_always_arrives_before_max_tokens(
    answer: dict[str, Any], mode: str, sampler: str, tokenizer: Any
) -> None:
    """The worst-case samplers (they write only what the mask allows, never end the reply or close
    a span while anything else is allowed) against a turn owing a call or its answer: every reply
    holds a complete valid call or a whole answer valid for its schema, at every ``max_tokens``
    from the answer's reserve on, with and without a thinking budget; on either engine the auto
    engine picks."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto")
    state = core.admit(constraint_args([WEATHER], mode, answer=answer), [], max_tokens=1000)
    assert state is not None and state.budget is not None
    engine = "llguidance" if answer is BOUNDED_NESTED else "xgrammar"
    assert type(state.future.result()).__name__.lower().startswith(engine)
    low = state.budget.answer_reserve
    scenarios = [
        Scenario([WEATHER], mode, low + k, thinking_budget=budget, answer=answer)
        for k in (0, 1, 3, 7, 12, 20, 33, 60)
        for budget in (None, 6)
    ]
    lost = []
    for scenario in scenarios:
        outcome = run(core, tokenizer, scenario, sampler, seed=scenario.max_tokens)
        if not outcome.kept(scenario.thinking_budget):
            lost.append((scenario.max_tokens, scenario.thinking_budget, outcome.failed, outcome.text))
    assert not lost, lost


def test_a_long_answer_is_not_read_whole_at_every_token(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget reads the answer written so far (to find its shortest completion) only when
    the tokens left could come down to what it needs: each token adds at most the answer's
    lookahead to that need. Read whole at every free-text token, the answer cost its length at
    every token: quadratic in the answer's length, on the engine's step."""
    core = ConstraintCore(lambda: tokenizer, len(tokenizer))
    state = core.admit(
        constraint_args([ADD], "auto", answer=ANSWER), [tokenizer.eos_token_id], max_tokens=4000
    )
    assert state is not None and state.budget is not None and state.budget.answer is not None
    budget, answer = state.budget, state.budget.answer
    reads: list[str] = []
    complete = answer.complete
    monkeypatch.setattr(
        answer, "complete", lambda text, measure=len: reads.append(text) or complete(text, measure)
    )
    latin1 = core.compiler.vocab.latin1
    tokens = tokenizer.encode('{"answer": "' + "four and " * 800, add_special_tokens=False)
    for position, token in enumerate(tokens):
        assert not budget.plan(position).force
        budget.feed(latin1[token])
    assert len(tokens) > 1000 and len(reads) < len(tokens) // 10, (len(reads), len(tokens))
    # Near its limit the answer is still finished in time: the worst-case test above holds that.
