"""The budgets' "always" against a worst-case model (:mod:`hermes_vllm.testing.adversary`).

Each test is one hole an outside review found (issue 18), played by the sampler that finds it on a
real tokenizer through the processor core, with a few seeded budgets: the owed call arrives
complete and valid, no span runs over its budget, no row fails. The whole sweep is
``benchmarks/worstcase.py``.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import torch

from hermes_vllm import constraint_args
from hermes_vllm.budget import MARK, CallCompleter
from hermes_vllm.dialect import get_dialect
from hermes_vllm.latin1 import as_latin1
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.testing.adversary import Scenario, _marks_for, run

LONG_OPTIONAL = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "include_historical_weather_data_for_comparison": {"type": "boolean"},
        },
        "required": ["city"],
    },
}
SMALL = {"name": "t", "parameters": {"type": "object", "properties": {}}}
FIELDS = ["title_of_the_event", "location_of_the_event", "description_of_the_event", "organizer_email"]
LARGE = {
    "name": "create_calendar_event_with_many_fields",
    "parameters": {
        "type": "object",
        "properties": {k: {"type": "string", "minLength": 3} for k in FIELDS},
        "required": FIELDS,
    },
}
HERMES = get_dialect("hermes")


def core_for(tokenizer: Any, engine: str = "xgrammar") -> ConstraintCore:
    return ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)


def reserve(core: ConstraintCore, tools: list[dict[str, Any]], choice: str) -> int:
    named = choice if choice == "required" else {"type": "function", "function": {"name": choice}}
    args = constraint_args([{"type": "function", "function": t} for t in tools], named)
    state = core.admit(args, [], max_tokens=1000)
    assert state is not None and state.budget is not None
    return state.budget.reserve


def assert_kept(core: ConstraintCore, tokenizer: Any, scenarios: list[Scenario], sampler: str) -> None:
    for scenario in scenarios:
        outcome = run(core, tokenizer, scenario, sampler, seed=scenario.max_tokens)
        assert outcome.kept(scenario.thinking_budget), (scenario.max_tokens, outcome)


def test_an_optional_property_with_a_long_name_cannot_cut_a_named_call(tokenizer: Any) -> None:
    """Hole 1: one ``,`` opening the long optional key used to push the completion past what was left."""
    core = core_for(tokenizer)
    low = reserve(core, [LONG_OPTIONAL], "get_weather")
    scenarios = [Scenario([LONG_OPTIONAL], "get_weather", low + k) for k in range(14, 30)]
    assert_kept(core, tokenizer, scenarios, "longest")


def test_the_lookahead_is_sized_from_the_largest_tool(tokenizer: Any) -> None:
    """Hole 2: a tiny tool beside a large one; the model picks the large one at the last moment."""
    core = core_for(tokenizer)
    low = reserve(core, [SMALL, LARGE], "required")
    scenarios = [Scenario([SMALL, LARGE], "required", low + k) for k in (0, 4, 10, 20)]
    assert_kept(core, tokenizer, scenarios, "longest")


def completes(completer: CallCompleter, call: str, parameters: dict[str, Any]) -> None:
    completion = completer.complete(call)
    assert completion is not None, call
    text = (call + completion).removeprefix(HERMES.tool_call.begin).removesuffix(HERMES.tool_call.end)
    import json

    jsonschema.validate(json.loads(text)["arguments"], parameters)


FREE = {
    "type": "object",
    "properties": {"meta": {"type": "object", "additionalProperties": {"type": "string"}}},
    "required": ["meta"],
}


@pytest.mark.parametrize(
    "written",
    ['{"meta":{"ab', '{"meta":{"ab"', '{"meta":{"a":"b",', '{"meta":{"a":"b","c', '{"meta":{'],
)
def test_free_form_objects_and_undeclared_keys_are_completed(written: str) -> None:
    """Hole 3: inside an undeclared key, or after a comma with no declared key left."""
    completer = CallCompleter(HERMES, [("put", FREE)])
    completes(completer, '<tool_call>{"name":"put","arguments":' + written, FREE)


RANGES = {
    "type": "object",
    "properties": {
        "p": {"type": "number", "minimum": 0.1, "maximum": 0.9},
        "q": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "r": {"type": "integer", "exclusiveMinimum": 4, "multipleOf": 3},
        "s": {"type": "number", "minimum": 2.5, "maximum": 2.75, "multipleOf": 0.25},
    },
    "required": ["p", "q", "r", "s"],
}


@pytest.mark.parametrize("written", ["", '{"p":', '{"p":0.', '{"p":0.5,"q":', '{"p":0.5,"q":0.5,"r":'])
def test_fractional_exclusive_and_multiple_of_ranges_have_a_shortest_value(written: str) -> None:
    """Hole 4: ``minimum: 0.1, maximum: 0.9`` and exclusive bounds had no shortest value."""
    completer = CallCompleter(HERMES, [("tune", RANGES)])
    completes(completer, '<tool_call>{"name":"tune","arguments":' + written, RANGES)


def test_a_number_begun_below_its_minimum_is_finished_above_it() -> None:
    """Hole 8: ``1`` under ``minimum: 1000`` is a prefix of 1000, not a dead end."""
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1000}}, "required": ["n"]}
    completer = CallCompleter(HERMES, [("bn", schema)])
    for written in ('{"n":1', '{"n":99', '{"n":9'):
        completes(completer, '<tool_call>{"name":"bn","arguments":' + written, schema)


def test_min_properties_counts_the_properties_written() -> None:
    """Hole 7: the declared index of the last key was counted, not the keys written."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
        "minProperties": 2,
    }
    completer = CallCompleter(HERMES, [("mp", schema)])
    for written in ('{"b":1', '{"a":1', '{"a":1,"b"', "{", ""):
        completes(completer, '<tool_call>{"name":"mp","arguments":' + written, schema)


def test_the_reserve_is_the_shortest_call_in_tokens(tokenizer: Any) -> None:
    """Hole 8: of two enum values the one with fewer tokens is shorter, whatever its characters."""
    schema = {
        "type": "object",
        "properties": {"w": {"enum": ["qxzjkvqx", "information_information"]}},
        "required": ["w"],
    }
    core = core_for(tokenizer)
    state = core.admit(
        constraint_args([{"type": "function", "function": {"name": "e", "parameters": schema}}], "required"),
        [],
        max_tokens=400,
    )
    assert state is not None and state.budget is not None
    count = core.speller.count
    short = count(as_latin1('"qxzjkvqx"'))
    long = count(as_latin1('"information_information"'))
    assert short is not None and long is not None and long < short  # the premise, on this vocabulary
    for order in ('{"name":"e","arguments":{"w":%s}}', '{"arguments":{"w":%s},"name":"e"}'):
        call = "<tool_call>" + order % '"qxzjkvqx"' + "</tool_call>" + MARK
        assert state.budget.reserve < core.speller.count(as_latin1(call)) + state.budget.margin  # type: ignore[operator]


def feed(core: ConstraintCore, state: Any, tokens: list[int]) -> list[int]:
    """Feed ``tokens`` one step at a time; the tokens the last mask allows."""
    logits = torch.zeros((1, core.vocab_size))
    for token in [None, *tokens]:
        logits = torch.zeros((1, core.vocab_size))
        core.step(logits, [(0, state, [] if token is None else [token])])
    assert state.failed is None
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_a_stop_string_straddling_a_clean_point_is_refused_before_an_owed_call(tokenizer: Any) -> None:
    """Hole 5: ``stop=["\\n\\n"]``, the first newline ends a reasoning span's text, the second
    would follow ``</think>`` (a clean point)."""
    core = core_for(tokenizer)
    tools = [{"type": "function", "function": LONG_OPTIONAL}]
    state = core.admit(constraint_args(tools, "required"), [], max_tokens=400, stop=["\n\n"])
    assert state is not None
    newline = tokenizer.convert_tokens_to_ids("<0x0A>")
    assert newline in feed(core, state, tokenizer.encode("<think>a", add_special_tokens=False))
    state = core.admit(constraint_args(tools, "required"), [], max_tokens=400, stop=["</think>\n"])
    assert state is not None
    allowed = feed(core, state, tokenizer.encode("<think>a</think>", add_special_tokens=False))
    assert newline not in allowed
    state = core.admit(constraint_args(tools, "required"), [], max_tokens=400, stop=["\n\n"])
    assert state is not None
    allowed = feed(core, state, [*tokenizer.encode("<think>a</think>", add_special_tokens=False), newline])
    assert newline not in allowed


@pytest.mark.parametrize("engine", ["xgrammar", "llguidance", "outlines"])
def test_lone_utf8_lead_bytes_neither_defer_the_closing_tag_nor_fail_the_row(
    tokenizer: Any, engine: str
) -> None:
    """Hole 6: a model writing lone lead bytes held a 4-token span open for 34 tokens, and where
    vLLM's own thinking budget forces ``</think>`` at a split character the row failed."""
    core = core_for(tokenizer, engine)
    low = reserve(core, [LONG_OPTIONAL], "required")
    scenarios = [
        Scenario([LONG_OPTIONAL], "required", low + k, thinking_budget=4, vllm_thinking=vllm)
        for k in (10, 24, 40)
        for vllm in (False, True)
    ]
    assert_kept(core, tokenizer, scenarios, "lead_bytes")
    assert_kept(core, tokenizer, scenarios, "reopen")


def test_a_required_tool_without_a_shortest_call_is_refused_naming_tool_and_path() -> None:
    """Never admitted with a reserve of 0: the completer cannot build this pattern's string (its
    automaton is too large to search), though the engines compile it."""
    from hermes_vllm.processor.admission import validate_request

    code = {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[a-z]{5000}$"}}}
    params = {"type": "object", "properties": {"id": {**code, "required": ["code"]}}, "required": ["id"]}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]
    with pytest.raises(
        ValueError, match=r"tool 'f': no shortest value at parameters/properties/id/properties/code"
    ):
        validate_request(constraint_args(tools, "required"), "xgrammar")
    validate_request(constraint_args(tools, "auto"), "xgrammar")  # nothing is owed: admitted


@pytest.mark.parametrize("runner", ["v1", "v2-0.33", "v2-0.34"])
def test_both_runner_adapters_play_the_worst_case_exactly_as_the_core(
    tokenizer: Any, vllm_config: Any, runner: str
) -> None:
    """The adversary through each adapter, fed as vLLM feeds it (the V1 batch update's output
    list, the V2 runner's slot buffers read back each step), slots reused from reply to reply:
    every reply keeps the promise, and is token for token the reply the core alone gives (the
    adapters add no bookkeeping of their own to the worst case). V2 is played in 0.33's and
    0.34's call orders; V1 where the release still has it (0.34 deleted it)."""
    pytest.importorskip("vllm")
    from hermes_vllm.testing.adversary import CoreDriver, V1Driver, V2Driver

    core = core_for(tokenizer)
    if runner == "v1":
        pytest.importorskip("vllm.v1.sample.logits_processor", reason="this vLLM has no V1 runner")
        adapter: Any = V1Driver(core, vllm_config)
    else:
        adapter = V2Driver(core, vllm_config, runner.removeprefix("v2-"))
    named, both = reserve(core, [LONG_OPTIONAL], "get_weather"), reserve(core, [SMALL, LARGE], "required")
    plays = [
        (Scenario([LONG_OPTIONAL], "get_weather", named + 3), "longest"),
        (Scenario([LONG_OPTIONAL], "get_weather", named + 17, stop=("\n\n",)), "late"),
        (Scenario([SMALL, LARGE], "required", both + 9), "longest"),
        (
            Scenario([LONG_OPTIONAL], "required", named + 24, thinking_budget=4, vllm_thinking=True),
            "lead_bytes",
        ),
        (Scenario([LONG_OPTIONAL], "required", named + 10, thinking_budget=4), "reopen"),
        (Scenario([LONG_OPTIONAL], "auto", named + 6, stop=("\n\n",)), "random"),
    ]
    for scenario, sampler in plays:
        through = run(adapter, tokenizer, scenario, sampler, seed=scenario.max_tokens)
        alone = run(CoreDriver(core), tokenizer, scenario, sampler, seed=scenario.max_tokens)
        assert through.kept(scenario.thinking_budget), (sampler, through)
        assert (through.text, through.tokens, through.spans) == (alone.text, alone.tokens, alone.spans)


def test_an_object_declaring_no_properties_is_not_completed_as_free_form(tokenizer: Any) -> None:
    """Found by the sweep: ``{"properties": {}}`` admits only ``{}`` in every engine, but the
    completer read it as free-form, so a call written arguments first for the large tool was
    completed as a call of the small one (``"":0},"name":"t"``), a text the grammar refuses: the
    budget forced nothing and the call was cut at ``max_tokens`` (random sampler, 86 tokens)."""
    completer = CallCompleter(HERMES, [("t", SMALL["parameters"]), (LARGE["name"], LARGE["parameters"])])
    call = '<tool_call>{"arguments":{"title_of_the_event":"abc","'
    completion = completer.complete(call)
    assert completion is not None and LARGE["name"] in completion, completion
    core = core_for(tokenizer)
    low = reserve(core, [SMALL, LARGE], "required")
    scenario = Scenario([SMALL, LARGE], "required", low + 64, thinking_budget=6, vllm_thinking=True)
    assert_kept(core, tokenizer, [scenario], "random")


FRACTIONAL = {
    "name": "tune",
    "parameters": {
        "type": "object",
        "properties": {
            "p": {"type": "number", "minimum": 0.1, "maximum": 0.9},
            "q": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        },
        "required": ["p", "q"],
    },
}


@pytest.mark.parametrize("choice", ["required", "tune"])
def test_a_token_closing_a_call_cannot_begin_one_that_no_longer_fits(tokenizer: Any, choice: str) -> None:
    """Found by the sweep: after the owed call, one token (``>?[<``) closed it and began a second
    call with 25 tokens left, under a reserve of 34; the call tag was refused only between calls,
    so the second call was cut one step before its closing tag (``longest``, seed 2)."""
    core = core_for(tokenizer)
    scenario = Scenario([FRACTIONAL], choice, 75, thinking_budget=6, vllm_thinking=True)
    outcome = run(core, tokenizer, scenario, "longest", seed=2)
    assert outcome.kept(scenario.thinking_budget) and not outcome.cut, outcome


def test_a_key_written_twice_in_a_free_form_object_is_still_completed() -> None:
    """Found on the model trained here (``benchmarks/quality.py``, BFCL ``multiple_9``): it wrote
    the same undeclared key again and again in a free-form ``gradeDict``; the grammars allow that
    (they do not track which undeclared keys were written), the completer refused the text, so the
    budget steered nothing and the ``required`` call was cut at ``max_tokens``."""
    schema = {"type": "object", "properties": {"gradeDict": {"type": "object"}}, "required": ["gradeDict"]}
    completer = CallCompleter(get_dialect("qwen"), [("calc", schema)])
    call = '<tool_call>\n{"name": "calc", "arguments": {"gradeDict": {"name": 10, "arguments": 10, "name": 1'
    assert completer.complete(call) == "}}}</tool_call>"
    assert completer.complete(call[: -len(" 1")] + ' "x", "arguments"') == ":0}}}</tool_call>"


def test_a_samplers_marks_belong_to_the_vocabulary_not_to_a_core(tokenizer: Any) -> None:
    """The samplers' token marks are the vocabulary's: cores on one tokenizer share them. Keyed by
    a core's ``id``, a core built where a freed one had lived (with another tokenizer) read that
    one's marks, and every core's marks were kept for the rest of the process."""
    first, second = (ConstraintCore(lambda: tokenizer, len(tokenizer)) for _ in range(2))
    hermes = get_dialect("hermes")
    assert _marks_for(first, hermes) is _marks_for(second, hermes)
    assert _marks_for(first, hermes).length.size == len(first.compiler.vocab.latin1)


def test_a_reasoning_span_closed_by_its_tag_in_pieces_is_counted_up_to_the_tag(tiny_model_131k: Any) -> None:
    """A random model may close ``<think>`` with ``</`` ``think`` ``>``: the text (and the reasoning
    parser, and the processor) end the span there, so the count a test holds usage to must too,
    not run on to a later ``</think>`` token (a server test once failed on that)."""
    from transformers import AutoTokenizer

    from hermes_vllm.testing.adversary import span_token_counts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_131k))
    begin, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    body = tokenizer.encode("hello world again", add_special_tokens=False)
    tag = [t for part in ("</", "think", ">") for t in tokenizer.encode(part, add_special_tokens=False)]
    assert tokenizer.decode(tag) == "</think>" and end not in tag
    assert span_token_counts([begin, *body, *tag, *body, end], tokenizer) == [len(body)]
    assert span_token_counts([begin, *body, end, *body], tokenizer) == [len(body)]


def test_a_think_token_inside_a_call_opens_no_span(tiny_model_131k: Any) -> None:
    """A random model writes ``<think>`` into a call's string argument: it is the argument's text
    to the grammar and the reasoning parser (usage counts none of it), so the count a test holds
    usage to must not read a span there, nor end the call at a ``</tool_call>`` inside a string
    (a server test failed on that now and then: "usage reports 0 reasoning tokens for spans of
    [28]")."""
    from transformers import AutoTokenizer
    from vllm.tokenizers import get_tokenizer

    from hermes_vllm.parsers.dialects import HermesReasoningParser
    from hermes_vllm.testing.adversary import span_token_counts

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_131k))
    begin, end = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    call = [
        *encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon '),
        begin,
        *encode(' </tool_call> on"}}\n</tool_call>'),
    ]
    body = encode("hello world again")
    usage = HermesReasoningParser(get_tokenizer(str(tiny_model_131k))).count_reasoning_tokens
    for ids, spans in (
        (call, []),
        ([*call, *body, begin, *body, end], [len(body)]),
        ([begin, *body, end, *call, *body], [len(body)]),
    ):
        assert span_token_counts(ids, tokenizer) == spans
        assert usage(ids) == sum(spans)
