"""Token budgets: the turn's reasoning budget, the reserve for a required call, closing cut calls,
stop strings, preemption.

The completer is checked against the engine's own masks (every completion it writes is accepted
token by token by the grammar and ends the call), the core's budget decisions on a real
tokenizer, and the whole path in an offline vLLM engine on the random tiny model with no bias
toward the call tag.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import torch
from support.corpus import sample_tool_sets

from hermes_vllm import constraint_args
from hermes_vllm.budget import MARK, CallCompleter, Speller
from hermes_vllm.budget.turn_budget import NOTHING
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.engines.base import allocate_bitmask
from hermes_vllm.processor import token_index
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.spans import split_spans

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "minLength": 2},
                "days": {"type": "integer", "minimum": 3},
            },
            "required": ["city", "days"],
        },
    },
}


def allowed_tokens(matcher: Any, vocab_size: int) -> np.ndarray:
    bitmask = allocate_bitmask(1, vocab_size)
    matcher.fill_bitmask(bitmask, 0)
    bits = np.unpackbits(bitmask[0].numpy().view(np.uint8), bitorder="little")[:vocab_size]
    return np.flatnonzero(bits)


def walk_and_complete(
    compiler: ToolGrammarCompiler,
    tool_sets: list[list[dict[str, Any]]],
    walks: int,
    favour: str,
    odds: float,
    longest: int,
    seed: int,
) -> int:
    """Random walks through each turn's grammar inside a call (a share ``odds`` of the steps
    favour tokens holding one of ``favour``); from where each walk stops, the completer's text,
    spelled greedily, must be accepted token by token and end the call. Returns the walks checked."""
    latin1 = compiler.vocab.latin1
    speller = Speller(latin1, compiler.vocab.stop_token_ids)
    favoured_tokens = np.array([any(c in p for c in favour) for p in latin1])
    rng = random.Random(seed)
    checked = 0
    for tools in tool_sets:
        grammar = compiler.compile(tools, "required")
        completer = CallCompleter(grammar.spec.dialect, [(t.name, t.parameters) for t in grammar.spec.tools])
        assert completer.shortest_call() is not None
        for _ in range(walks):
            matcher = grammar.matcher(gated=False)
            text = ""
            for token in compiler.vocab.tokenizer.encode("<tool_call>", add_special_tokens=False):
                assert matcher.accept_token(token)
                text += latin1[token]
            for _ in range(rng.randint(0, longest)):
                allowed = [
                    t for t in allowed_tokens(matcher, compiler.vocab.vocab_size).tolist()
                    if t < len(latin1) and t not in compiler.vocab.stop_token_ids
                ]  # fmt: skip
                favoured = [t for t in allowed if favoured_tokens[t]]
                token = rng.choice(favoured if favoured and rng.random() < odds else allowed)
                assert matcher.accept_token(token)
                text += latin1[token]
            if "</tool_call>" in text:
                continue
            try:
                written = text.encode("latin-1").decode("utf-8")
            except UnicodeDecodeError:
                continue
            completion = completer.complete(written)
            assert completion is not None, written
            rest = completion.encode("utf-8").decode("latin-1")
            while rest:
                token = speller.prefixes(rest)[0]
                assert matcher.accept_token(token), (written, completion, rest)
                rest = rest[len(latin1[token]) :]
            assert matcher.can_end(), (written, completion)
            checked += 1
    return checked


def test_every_completion_is_accepted_by_the_engine_and_closes_the_call(tokenizer: Any) -> None:
    """Random walks through the grammar inside calls of BFCL tool sets (half of the steps favour
    JSON punctuation, so walks reach nested values, keys and numbers)."""
    compiler = ToolGrammarCompiler(tokenizer, engine="xgrammar")
    assert walk_and_complete(compiler, sample_tool_sets(40), 4, '"{}[],:0123456789', 0.5, 80, 0) >= 100


FREE_TOOL = {
    "name": "stats",
    "parameters": {"type": "object", "properties": {"grades": {"type": "object"}}, "required": ["grades"]},
}


@pytest.mark.parametrize("depth", [30, 2000])
def test_a_free_value_nested_past_any_bound_is_completed_as_the_engine_accepts(
    tokenizer: Any, depth: int
) -> None:
    """A free-form object (no properties) lets a model nest its values as deep as its tokens
    allow: the trained model nested one past a hundred levels under ``max_call_whitespace=0``, the
    completer (reading 24 levels) found no completion and the budget left the call cut. Read at
    any depth (past Python's recursion limit too), the completion closes the call on the engine,
    from inside a key and from inside a value."""
    compiler = ToolGrammarCompiler(tokenizer, engine="xgrammar")
    grammar = compiler.compile([FREE_TOOL], "required")
    completer = CallCompleter(grammar.spec.dialect, [(t.name, t.parameters) for t in grammar.spec.tools])
    latin1 = compiler.vocab.latin1
    speller = Speller(latin1, compiler.vocab.stop_token_ids)
    nested = '<tool_call>{"name": "stats", "arguments": {"grades": {"a": ' + '[{"k": [1, ' * depth
    for written in (nested + '{"ke', nested + '{"key": tr', nested + '{"key": -'):
        completion = completer.complete(written)
        assert completion is not None, written[-40:]
        matcher = grammar.matcher(gated=False)
        rest = (written + completion).encode("utf-8").decode("latin-1")
        while rest:
            token = speller.prefixes(rest)[0]
            assert matcher.accept_token(token), rest[:40]
            rest = rest[len(latin1[token]) :]
        assert matcher.can_end(), completion[-40:]


PATTERN_TOOL = {
    "name": "book",
    "parameters": {
        "type": "object",
        "properties": {
            "date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"},
            "code": {"type": "string", "pattern": "^(?:[A-Z]{3}|x[0-9a-f]+)$"},
            "tags": {"type": "array", "items": {"type": "string", "pattern": "^#[a-z_]{2,}$"}, "minItems": 1},
            "note": {"type": "string", "pattern": "q"},
        },
        "required": ["date", "code", "tags", "note"],
    },
}
ESCAPED_PATTERN_TOOL = {
    "name": "quote",
    "parameters": {
        "type": "object",
        "properties": {"text": {"type": "string", "pattern": '[\\\\"]q'}},
        "required": ["text"],
    },
}


@pytest.mark.parametrize(
    ("engine", "tools"),
    [("xgrammar", [PATTERN_TOOL]), ("llguidance", [PATTERN_TOOL, ESCAPED_PATTERN_TOOL])],
    ids=["xgrammar", "llguidance"],
)
def test_calls_cut_inside_a_pattern_are_completed_as_the_engine_accepts(
    tokenizer: Any, engine: str, tools: list[dict[str, Any]]
) -> None:
    """A string under ``pattern`` (anchored, or a search as JSON Schema means it; on llguidance
    also a class only escapes can spell) is finished by the pattern's automaton."""
    compiler = ToolGrammarCompiler(tokenizer, engine=engine)
    assert walk_and_complete(compiler, [tools], 40, '"#-,[]\\0123456789ABC', 0.7, 60, 1) >= 25


def test_pattern_completions_prefer_plain_characters_and_decline_what_they_do_not_model() -> None:
    from hermes_vllm.budget.pattern import shortest_completion

    assert shortest_completion(r"^\d{3}-\d{4}$", "12") == "0-0000"
    assert shortest_completion('^[\\\\"a]$', "") == "a"  # not a character JSON must escape
    assert shortest_completion('^[\\\\"]$', "") in ("\\", '"')  # unless the class has no other
    assert shortest_completion(r"^(?:ab|c)+x$", "ab") == "x"
    assert shortest_completion(r"^[A-Z]{2}$", "a") is None  # no completion exists
    assert shortest_completion(r"^(?i:ab)$", "") is None  # flags: not modelled
    assert shortest_completion(r"^\bfoo$", "") is None  # word boundaries: not modelled


def test_shortest_call_meets_lengths_bounds_and_required_properties() -> None:
    from hermes_vllm.dialect import get_dialect
    from hermes_vllm.schema import normalize_tools

    (spec,) = normalize_tools([TOOL], check_metaschema=True)
    completer = CallCompleter(get_dialect("qwen"), [(spec.name, spec.parameters)])
    text = completer.shortest_call()
    assert text == '<tool_call>{"name":"get_weather","arguments":{"city":"aa","days":3}}</tool_call>'


def core_for(tokenizer: Any) -> ConstraintCore:
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="xgrammar")
    cache: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    core.compiler = ToolGrammarCompiler(tokenizer, engine="xgrammar", vocab_size=len(tokenizer), cache=cache)
    return core


def run(core: ConstraintCore, state: Any, tokenizer: Any, text: str) -> list[int]:
    """Feed ``text``'s tokens one step at a time; the tokens the last mask allows."""
    logits = torch.zeros((1, len(tokenizer)))
    for token in [None, *tokenizer.encode(text, add_special_tokens=False)]:
        logits = torch.zeros((1, len(tokenizer)))
        core.step(logits, [(0, state, [] if token is None else [token])])
    assert state.failed is None
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_a_spent_reasoning_budget_forces_the_closing_tag(tokenizer: Any) -> None:
    core = core_for(tokenizer)
    state = core.admit(constraint_args([TOOL]), [], max_tokens=200, thinking_budget=3)
    assert state is not None
    assert len(run(core, state, tokenizer, "Hi <think> a b")) > 1000  # two of three spent
    allowed = run(core, state, tokenizer, "Hi <think> a b c")
    assert [core.compiler.vocab.latin1[t] for t in allowed] == ["</think>"]
    # The vllm_xargs budget, when vLLM's is not set.
    state = core.admit(constraint_args([TOOL], reasoning_budget=2), [], max_tokens=200)
    assert state is not None
    assert [core.compiler.vocab.latin1[t] for t in run(core, state, tokenizer, "<think> a b")] == ["</think>"]


def test_a_required_call_opens_when_only_its_reserve_is_left(tokenizer: Any) -> None:
    core = core_for(tokenizer)
    state = core.admit(constraint_args([TOOL], "required"), [], max_tokens=60)
    assert state is not None and state.budget is not None
    reserve = state.budget.reserve
    latin1 = core.compiler.vocab.latin1
    # One token for <think>, then spans may write until only the reserve and </think> are left.
    assert len(run(core, state, tokenizer, "<think>" + " a" * (57 - reserve))) > 1000
    allowed = run(core, state, tokenizer, " a")
    assert [latin1[t] for t in allowed] == ["</think>"]
    allowed = run(core, state, tokenizer, "</think>")
    assert [latin1[t] for t in allowed] == ["<tool_call>"]


def test_under_auto_no_call_opens_once_it_cannot_fit(tokenizer: Any) -> None:
    core = core_for(tokenizer)
    state = core.admit(constraint_args([TOOL]), [], max_tokens=40)
    assert state is not None
    call = tokenizer.convert_tokens_to_ids("<tool_call>")
    assert call in run(core, state, tokenizer, "Hello")
    assert call not in run(core, state, tokenizer, " a" * 20)


def test_a_stop_string_cannot_complete_inside_a_call(tokenizer: Any) -> None:
    core = core_for(tokenizer)
    latin1 = core.compiler.vocab.latin1
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    state = core.admit(constraint_args([TOOL]), [], max_tokens=500, stop=["Paris"])
    assert state is not None
    allowed = {latin1[t] for t in run(core, state, tokenizer, text)}
    assert "is" not in allowed and "isian" not in allowed and "Paris" not in allowed
    assert "x" in allowed
    # Outside a call the stop string is vLLM's business: nothing is refused...
    state = core.admit(constraint_args([TOOL]), [], max_tokens=500, stop=["Paris"])
    assert state is not None
    assert len(run(core, state, tokenizer, "Par")) == len(tokenizer)
    # ...except before the call a required turn owes: it would end the reply without one.
    state = core.admit(constraint_args([TOOL], "required"), [], max_tokens=500, stop=["Paris"])
    assert state is not None
    allowed = {latin1[t] for t in run(core, state, tokenizer, "<think>Par")}
    assert "is" not in allowed and "x" in allowed


class _CountedReads(list[Any]):
    """A vocabulary table that counts how often it is read whole (iterated)."""

    reads = 0

    def __iter__(self) -> Iterator[Any]:
        self.reads += 1
        return super().__iter__()


def test_fresh_stop_strings_read_no_vocabulary_and_leave_bounded_tables(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests bringing new stop strings (each client its own, 4 a request) are refused inside
    calls from the index built at start-up: no token of the vocabulary is read for a new string
    (that scan cost tens of milliseconds a string on the engine's step), and the answers kept
    stay within the index's bound however many strings arrive."""
    monkeypatch.setattr(token_index, "CACHED_IDS", 4096)
    core = core_for(tokenizer)
    core.warm()
    vocab = core.compiler.vocab
    tables = {name: _CountedReads(getattr(vocab, name)) for name in ("latin1", "decoded")}
    vars(vocab).update(tables)
    latin1 = vocab.latin1
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Par'
    for request in range(40):
        stop = [f"Paris{request}", f"is{request}x", f" {request}!", f"ar{request}"]
        state = core.admit(constraint_args([TOOL]), [], max_tokens=500, stop=stop)
        assert state is not None
        allowed = {latin1[t] for t in run(core, state, tokenizer, text + "is")}
        assert "x" in allowed and (request >= 10 or str(request) not in allowed)
    assert [t.reads for t in tables.values()] == [0, 0]
    assert core.index.kept_ids() <= 4096


def test_vllms_thinking_budget_never_sees_a_reasoning_tag_inside_a_call(tokenizer: Any) -> None:
    """With ``thinking_token_budget`` set, vLLM counts from any ``<think>`` token and would force
    ``</think>`` where the grammar refuses it: inside a call that token is refused."""
    core = core_for(tokenizer)
    think = tokenizer.convert_tokens_to_ids("<think>")
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "'
    state = core.admit(constraint_args([TOOL]), [], max_tokens=500, thinking_budget=24)
    assert state is not None
    assert think not in run(core, state, tokenizer, text)
    state = core.admit(constraint_args([TOOL]), [], max_tokens=500)
    assert state is not None
    assert think in run(core, state, tokenizer, text)


def valid_calls(text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The closed calls of ``text``, each checked against its tool's (normalised) schema."""
    from hermes_vllm.schema import normalize_tools

    schemas = {s.name: s.parameters for s in normalize_tools(tools)}
    calls = []
    for span in split_spans(text, "hermes"):
        if span.kind == "call" and span.closed:
            payload = json.loads(span.body)
            jsonschema.validate(payload["arguments"], schemas[payload["name"]])
            calls.append(payload)
    return calls


@pytest.mark.engine
def test_required_and_named_replies_always_hold_a_valid_call(tiny_model: Path, tokenizer: Any) -> None:
    """No bias toward the call tag: the model wanders into reasoning spans; at 400 tokens, at a
    max_tokens just above the reserve, and 20 above it with no bias at all, every reply holds a
    valid call (strings under a ``pattern`` too) and says ``"length"`` where the budget closed
    it, and a reasoning budget given through vllm_xargs caps the turn's spans."""
    from support.budget_scenarios import reserve
    from support.offline import offline_llm
    from vllm import SamplingParams

    from hermes_vllm.parsers.dialects import HermesReasoningParser

    llm = offline_llm(tiny_model)
    reasoning = HermesReasoningParser(tokenizer)
    bias = {i: 8.0 for t, i in tokenizer.get_vocab().items() if any(c in t for c in '"}]')}
    prompt = "<|im_start|>user\nPlease help.<|im_end|>\n<|im_start|>assistant\n"
    sets = [*sample_tool_sets(12), [PATTERN_TOOL]]  # the last: calls closed inside patterns
    requests = []
    for i, tools in enumerate(sets):
        choice: Any = "required" if i % 2 else {"type": "function", "function": {"name": tools[0]["name"]}}
        args = constraint_args(tools, choice, reasoning_budget=24 if i % 3 == 0 else None)
        low = reserve(tokenizer, tools, choice)
        # Just above the reserve the budget writes nearly every token; 20 above it, with no bias
        # at all, the model chooses where it wanders and when it calls.
        for max_tokens, push in ((400, bias), (low + 2, bias), (low + 20, None)):
            requests.append((tools, args, max_tokens, push))
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=m, logit_bias=push, extra_args=a, skip_special_tokens=False
        )
        for _, a, m, push in requests
    ]
    outputs = llm.generate([prompt] * len(params), params, use_tqdm=False)
    thought = 0
    for (tools, args, max_tokens, _), output in zip(requests, outputs, strict=True):
        text = output.outputs[0].text
        assert valid_calls(text, tools), (max_tokens, text[-300:])
        assert len(output.outputs[0].token_ids) <= max_tokens
        if MARK in text:
            assert output.outputs[0].finish_reason == "length", text[-300:]
        if "hermes_vllm_reasoning_budget" in args:
            used = reasoning.count_reasoning_tokens(output.outputs[0].token_ids)
            assert used <= 24, text  # the turn's budget, the tags spelled in any tokens
            thought += used
    assert thought, "no reasoning to check the budget on"


@pytest.mark.engine
def test_auto_with_the_close_policy_returns_only_valid_marked_calls(tiny_model: Path, tokenizer: Any) -> None:
    from support.offline import offline_llm
    from vllm import SamplingParams

    from hermes_vllm.demo.bias import call_bias

    llm = offline_llm(tiny_model)
    sets = sample_tool_sets(8)
    bias = call_bias(tokenizer)
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=40, logit_bias=bias, skip_special_tokens=False,
            extra_args=constraint_args(tools, "auto", cut_policy="close"),
        )
        for tools in sets
    ]  # fmt: skip
    outputs = llm.generate(["<|im_start|>assistant\n"] * len(params), params, use_tqdm=False)
    closed = 0
    for tools, output in zip(sets, outputs, strict=True):
        text = output.outputs[0].text
        spans = split_spans(text, "hermes")
        valid_calls(text, tools)
        assert all(s.closed for s in spans if s.kind == "call"), text
        closed += MARK.strip() in text
    assert closed, "no call was closed by the budget"


def test_a_required_row_left_alone_inside_reasoning_masks_exactly_like_the_engine(any_tokenizer: Any) -> None:
    """Inside a reasoning span before the first call, a budgeted required row reuses the mask
    the engine gave at the span's start instead of running it; at every step its mask equals the
    engine's (split characters, a ``<`` and a partial closing tag inside the span, two spans)."""
    tokenizer = any_tokenizer
    turn = (
        "<think>héllo 日本 a<b </thi still 🙂 thinking</think>\n<think>again ü</think>"
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 4}}</tool_call>'
    )
    budgeted, plain = core_for(tokenizer), core_for(tokenizer)
    args = constraint_args([TOOL], "required")
    fast = budgeted.admit(args, [], max_tokens=10_000)
    slow = plain.admit(args, [])
    assert fast is not None and slow is not None and fast.budget is not None and slow.budget is None
    paused = 0
    for step, token in enumerate([None, *tokenizer.encode(turn, add_special_tokens=False)]):
        new = [] if token is None else [token]
        a, b = torch.zeros((1, len(tokenizer))), torch.zeros((1, len(tokenizer)))
        budgeted.step(a, [(0, fast, new)])
        plain.step(b, [(0, slow, new)])
        assert torch.equal(a, b), f"step {step}: masks differ"
        paused += fast.engine.paused is not None
    assert fast.failed is None and slow.failed is None
    assert paused >= 5, "the row was never left alone"


def test_a_call_cut_inside_a_split_character_is_closed_with_a_valid_one(tokenizer: Any) -> None:
    """A random model leaves a lone UTF-8 lead byte in an argument; closing the call must first
    finish that character (found by the load run: such calls were cut instead)."""
    core = core_for(tokenizer)
    lead, continuation = tokenizer.convert_tokens_to_ids(["<0xE2>", "<0x80>"])
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa'
    tokens = [*tokenizer.encode(text, add_special_tokens=False), lead]
    state = core.admit(constraint_args([TOOL], "required"), [], max_tokens=len(tokens) + 12)
    assert state is not None
    logits = torch.zeros((1, len(tokenizer)))
    for token in [None, *tokens]:
        logits = torch.zeros((1, len(tokenizer)))
        core.step(logits, [(0, state, [] if token is None else [token])])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [continuation]


def test_the_turns_spans_share_one_reasoning_budget(tokenizer: Any) -> None:
    """``thinking_token_budget`` caps the turn's reasoning, not each span's: a second span gets
    what the first left, and once it is spent no span opens again, under auto (a gated row) and
    under required (an engine row)."""
    core = core_for(tokenizer)
    latin1 = core.compiler.vocab.latin1
    think = tokenizer.convert_tokens_to_ids("<think>")
    state = core.admit(constraint_args([TOOL]), [], max_tokens=400, thinking_budget=3)
    assert state is not None
    assert think in run(core, state, tokenizer, "Hi <think> a b</think> ok")  # one token left
    assert [latin1[t] for t in run(core, state, tokenizer, "<think> c")] == ["</think>"]
    allowed = run(core, state, tokenizer, "</think> and then")
    assert think not in allowed and len(allowed) > 1000
    state = core.admit(constraint_args([TOOL], "required"), [], max_tokens=400, thinking_budget=2)
    assert state is not None
    assert think not in run(core, state, tokenizer, "<think> a b</think>")
    # The opening tag spelled in pieces: after a "<" (which may still open the call) nothing
    # spells on toward "<think>", where the grammar allows only tags (before a required call).
    lt = next(t for t in core.speller.prefixes("<") if latin1[t] == "<")
    logits = torch.zeros((1, len(tokenizer)))
    core.step(logits, [(0, state, [lt])])
    after = {latin1[t] for t in torch.isfinite(logits[0]).nonzero().flatten().tolist()}
    assert after and not any(p.startswith("th") for p in after), sorted(after)[:20]
    fresh = core.admit(constraint_args([TOOL], "required"), [], max_tokens=400)
    assert think in run(core, fresh, tokenizer, "<think> a b</think>")


def test_the_frontend_refuses_exactly_below_the_engines_reserve_mark_included(tokenizer: Any) -> None:
    """One count of the reserve: the smallest ``max_tokens`` the frontend admits is the engine's
    reserve, which holds the shortest call and the mark of a call the budget closes."""
    from hermes_vllm.processor.admission import prepared_turn, validate_request
    from hermes_vllm.settings import get_limits
    from hermes_vllm.vocabulary import served_vocabulary

    speller = served_vocabulary(tokenizer).speller
    args = constraint_args([TOOL], "required")
    state = core_for(tokenizer).admit(args, [], max_tokens=500)
    assert state is not None and state.budget is not None
    reserve = state.budget.reserve
    turn = prepared_turn(state.request, "auto", get_limits())
    shortest = turn.needs.shortest_call(core_for(tokenizer).speller)
    assert shortest is not None
    spelled = len(tokenizer.encode(shortest + MARK, add_special_tokens=False))
    assert reserve >= spelled + 4  # the margin's default
    with pytest.raises(ValueError, match=f"max_tokens={reserve - 1} .* {reserve} tokens"):
        validate_request(args, "auto", reserve - 1, speller)
    assert validate_request(args, "auto", reserve, speller) is not None
    # Under the drop policy no mark is written, and none is reserved.
    dropping = {**args, "hermes_vllm_cut_policy": "drop"}
    state = core_for(tokenizer).admit(dropping, [], max_tokens=500)
    assert state is not None and state.budget is not None and state.budget.reserve < reserve


def test_a_resumed_row_forces_the_rest_of_its_closing_text(tokenizer: Any) -> None:
    """After preemption a row is admitted afresh and its whole output replayed at once: what the
    budget was forcing there (the rest of the call's completion and its mark) is forced again."""
    core = core_for(tokenizer)
    latin1 = core.compiler.vocab.latin1
    args = constraint_args([TOOL], "required")
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris and then some more'
    written = tokenizer.encode(text, add_special_tokens=False)
    budget = len(written) + 15  # the completion and its mark are forced from here on
    state = core.admit(args, [], max_tokens=budget)
    assert state is not None
    logits = torch.zeros((1, len(tokenizer)))
    for token in [None, *written]:
        logits = torch.zeros((1, len(tokenizer)))
        core.step(logits, [(0, state, [] if token is None else [token])])
    # Follow the forced text into the mark, then resume from there.
    while MARK[:4] not in "".join(latin1[t] for t in written):
        (token,) = torch.isfinite(logits[0]).nonzero().flatten().tolist()
        written.append(token)
        logits = torch.zeros((1, len(tokenizer)))
        core.step(logits, [(0, state, [token])])
    expected = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert len(expected) == 1
    resumed = core.admit(args, [], max_tokens=budget)
    assert resumed is not None
    logits = torch.zeros((1, len(tokenizer)))
    core.step(logits, [(0, resumed, written)])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == expected


def test_usage_counts_the_tokens_inside_reasoning_and_hidden_spans(vllm_tokenizer: Any) -> None:
    """``count_reasoning_tokens`` (vLLM's ``usage.completion_tokens_details.reasoning_tokens``):
    every span's tokens, tags excluded, whether the tags are special tokens or plain text."""
    from hermes_vllm.parsers.dialects import BracketsReasoningParser, HermesReasoningParser

    def ids(*parts: str) -> list[int]:
        return [t for p in parts for t in vllm_tokenizer.encode(p, add_special_tokens=False)]

    inner = ids(" one two three")
    tokens = [*ids("Hi <think>"), *inner, *ids("</think> ok <think>"), *inner]
    assert HermesReasoningParser(vllm_tokenizer).count_reasoning_tokens(tokens) == 2 * len(inner)
    # Tags in several tokens: a tag's first token may carry the space before it (inside the span).
    tokens = ids("[step]", " a b", "[/step] c [scratchpad]", " d", "[/scratchpad] e")
    least = len(ids(" a b")) + len(ids(" d"))
    assert least <= BracketsReasoningParser(vllm_tokenizer).count_reasoning_tokens(tokens) <= least + 2


@pytest.mark.engine
def test_budget_closed_calls_keep_their_whole_mark_through_preemption(
    tiny_model: Path, tokenizer: Any
) -> None:
    """A KV cache of 16 blocks for 64 requests: vLLM preempts rows and resumes them (its counter
    says how often); a resumed row the budget was closing still writes the whole completion and
    its mark. ``max_tokens`` just above the reserve, so most of each reply is forced."""
    from support.budget_scenarios import reserve
    from support.offline import offline_llm
    from vllm import SamplingParams

    llm = offline_llm(
        tiny_model, kv_cache_memory_bytes=1 << 20, block_size=32, max_model_len=256, max_num_seqs=64,
        disable_log_stats=False,
    )  # fmt: skip
    args = constraint_args([TOOL], "required")
    max_tokens = reserve(tokenizer, [TOOL], "required") + 6
    # Prompts of 33 to 38 tokens: every row needs its third KV block (where vLLM preempts the
    # latest row, which is about as far along) 26 to 31 tokens into its reply, where the budget
    # is writing the call's completion and its mark.
    texts = [
        f"<|im_start|>user\nPlease help{' now' * k}.<|im_end|>\n<|im_start|>assistant\n" for k in range(40)
    ]
    prompts = [{"prompt_token_ids": ids} for t in texts if 33 <= len(ids := tokenizer.encode(t)) <= 38]
    prompts = (prompts * 64)[:64]
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=max_tokens, extra_args=args, skip_special_tokens=False, seed=i
        )
        for i in range(len(prompts))
    ]
    outputs = llm.generate(prompts, params, use_tqdm=False)
    preempted = sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == "vllm:num_preemptions")
    assert preempted > 0, "nothing was preempted: the test proves nothing"
    closed = 0
    for output in outputs:
        text = output.outputs[0].text
        assert valid_calls(text, [TOOL]), text
        if MARK[:5] in text:
            assert MARK in text, text
            closed += 1
    assert closed, "no call was closed by the budget"


@pytest.mark.engine
def test_the_offline_llm_reports_a_call_the_budget_closed_as_length(tiny_model: Path, tokenizer: Any) -> None:
    """``vllm.LLM.generate`` runs the offline engine, not ``AsyncLLM``: a reply holding a call the
    budget closed says ``"length"`` there too, even where the model ended its turn right after
    the mark (a push toward the end of turn, which the grammar allows only after the call)."""
    from support.budget_scenarios import end_bias, reserve
    from support.offline import offline_llm
    from vllm import SamplingParams

    llm = offline_llm(tiny_model)
    args = constraint_args([TOOL], "required")
    bias = {int(k): v for k, v in end_bias(tokenizer).items()}
    max_tokens = reserve(tokenizer, [TOOL], "required") + 8
    params = [
        SamplingParams(
            temperature=1.0, max_tokens=max_tokens, extra_args=args, logit_bias=bias, seed=i,
            skip_special_tokens=False,
        )
        for i in range(8)
    ]  # fmt: skip
    outputs = llm.generate(["<|im_start|>assistant\n"] * len(params), params, use_tqdm=False)
    ended = 0
    for output in outputs:
        out = output.outputs[0]
        assert valid_calls(out.text, [TOOL]), out.text
        if MARK in out.text:
            assert out.finish_reason == "length", (out.finish_reason, out.text)
            ended += len(out.token_ids) < max_tokens  # the model ended its turn: the engine said "stop"
    assert ended, "no reply ended its turn after a call the budget closed: the test proves nothing"


@pytest.mark.parametrize("choice", ["required", "auto"])
@pytest.mark.parametrize("max_tokens", [48, 160])
def test_below_the_calm_bound_the_budget_demands_nothing_whatever_the_text(
    tokenizer: Any, choice: str, max_tokens: int
) -> None:
    """:meth:`TurnBudget.calm_until`: below it, whatever the row writes (a random walk over
    what its masks allow, tags weighed up: spans, calls, free text, split characters), every
    position's plan is nothing, so a hosted row's engine alone reads its tokens there."""
    core = core_for(tokenizer)
    latin1 = core.compiler.vocab.latin1
    tags = [t for t, piece in enumerate(latin1) if "<" in piece or "}" in piece or not piece.isascii()]
    rng = random.Random(max_tokens)
    for _ in range(3):
        state = core.admit(constraint_args([TOOL], choice), [], max_tokens=max_tokens)
        assert state is not None and state.budget is not None
        budget = state.budget
        bound = budget.calm_until()
        assert bound < max_tokens and (bound > 0 or max_tokens < 160)
        plans: list[tuple[int, Any]] = []
        plan = budget.plan

        def planned(consumed: int, plan: Any = plan, plans: list[tuple[int, Any]] = plans) -> Any:
            plans.append((consumed, plan(consumed)))
            return plans[-1][1]

        budget.plan = planned  # type: ignore[method-assign]
        bitmask = torch.zeros((1, (len(tokenizer) + 31) // 32), dtype=torch.int32)
        for _ in range(max_tokens):
            masked, _ = core.fill([(0, state)], len(tokenizer), bitmask=bitmask)
            words = bitmask[0].numpy() if masked else np.full(bitmask.shape[1], -1, np.int32)
            bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: len(tokenizer)]
            allowed = np.flatnonzero(bits)
            favoured = np.intersect1d(allowed, tags)
            pool = favoured if favoured.size and rng.random() < 0.5 else allowed
            token = int(rng.choice(pool))
            core.advance(state, (token,))
            if state.engine.ended or state.failed is not None:
                break
        assert state.failed is None
        below = [(at, made) for at, made in plans if at < bound]
        assert all(made is NOTHING for _, made in below), (below, state.gate.follower.text)
        assert any(made is not NOTHING for _, made in plans) or state.engine.ended


def test_pieces_followed_at_once_are_followed_as_one_by_one(tokenizer: Any) -> None:
    """:meth:`TurnBudget.follow` (a run of pieces that change no tail, taken at once) against
    :meth:`TurnBudget.feed` of each piece: the same text, tail, calls, span counts and split
    character after every random sequence of tags, their parts, JSON and split characters."""
    core = core_for(tokenizer)
    pieces = ["<tool_call>", "</tool_call>", "<think>", "</think>", "<", "tool", "_call>", "</", "think>"]
    pieces += ['{"', "a", " b", "\n", '"}', "}", "\xc3", "\xa9", "\xe2\x82", "\xac", "x\xc3"]
    rng = random.Random(5)
    for _ in range(300):
        text = [rng.choice(pieces) for _ in range(rng.randint(1, 30))]
        one, many = (
            core.admit(constraint_args([TOOL], reasoning_budget=400), [], max_tokens=500) for _ in range(2)
        )
        assert one is not None and many is not None and one.budget is not None and many.budget is not None
        for piece in text:
            one.budget.feed(piece)
        many.budget.follow(text)
        a, b = one.gate.follower, many.gate.follower
        assert (a.text, a.tail, a.calls, a.recent) == (b.text, b.tail, b.calls, b.recent), text
        assert one.budget.progress == many.budget.progress, text


def test_a_dialect_without_reasoning_or_hidden_spans_has_a_calm_bound(tokenizer: Any) -> None:
    """A dialect file may declare no reasoning and no hidden span: its turn's budget is built and
    its calm bound read (the spans' closing tags are only one term of it)."""
    import dataclasses

    from hermes_vllm.budget import TurnBudget
    from hermes_vllm.dialect import get_dialect
    from hermes_vllm.schema import normalize_tools
    from hermes_vllm.spans import TextFollower

    dialect = dataclasses.replace(get_dialect("hermes"), reasoning=(), hidden=())
    assert dialect.free_spans == ()
    (spec,) = normalize_tools([TOOL], check_metaschema=True)
    core = core_for(tokenizer)
    budget = TurnBudget(
        dialect, TextFollower(dialect), CallCompleter(dialect, [(spec.name, spec.parameters)]), core.speller,
        max_tokens=200, reasoning_budget=None, required=False, close=True, margin=4, reserve=30,
    )  # fmt: skip
    assert budget.calm_until() == 200 - budget.alert
    assert budget.plan(0) is NOTHING
