"""The composed matcher (many tools on xgrammar) against its oracle, the grammar of every tool.

At every step of BFCL ground-truth calls (either key order, with broken copies, with a closing
tag inside a string) and of random walks over the allowed tokens, the composed mask equals the
monolithic mask bit for bit, both accept the same token, and both agree on whether the output
may end.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from support.soundness import distinct_tools

from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.engines.base import EngineMatcher, allocate_bitmask
from hermes_vllm.grammar.engines.composed import ComposedGrammar
from hermes_vllm.grammar.engines.xgrammar import XGrammarGrammar
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.settings import get_limits
from hermes_vllm.testing.adversary import Scenario, run

TOOLS = get_limits().compose_min_tools


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def bfcl() -> tuple[list[dict[str, Any]], dict[str, str]]:
    return distinct_tools(TOOLS, lambda tool: True)


def _pair(
    tokenizer: Any, dialect: str, tools: list[dict[str, Any]], mode: str = "auto", parallel: bool = True
) -> tuple[ToolGrammarCompiler, ComposedGrammar, XGrammarGrammar]:
    """A composed grammar of ``tools`` and, its oracle, the grammar of every tool."""
    compiler = ToolGrammarCompiler(
        tokenizer,
        dialect=dialect,
        coverage="lenient",
        cache=GrammarCache(1 << 30, 2, lambda g: g.memory_bytes),
    )
    spec = compiler.prepare(tools, mode, parallel).spec
    composed = compiler.engine.compile(spec)
    assert isinstance(composed, ComposedGrammar)
    return compiler, composed, XGrammarGrammar(composed.monolithic())


def _differences(masks: torch.Tensor) -> list[int]:
    diff = np.unpackbits((masks[0] ^ masks[1]).numpy().view(np.uint8), bitorder="little")
    return [int(i) for i in np.flatnonzero(diff)[:8]]


def _compare(composed: EngineMatcher, oracle: EngineMatcher, masks: torch.Tensor, where: str) -> None:
    composed.fill_bitmask(masks, 0)
    oracle.fill_bitmask(masks, 1)
    assert not _differences(masks), (where, _differences(masks))


def _step(
    composed: EngineMatcher, oracle: EngineMatcher, masks: torch.Tensor, token: int, where: str
) -> bool:
    _compare(composed, oracle, masks, where)
    return _accept(composed, oracle, token, where)


def _accept(composed: EngineMatcher, oracle: EngineMatcher, token: int, where: str) -> bool:
    accepted = composed.accept_token(token)
    assert accepted == oracle.accept_token(token), where
    assert composed.can_end() == oracle.can_end(), where
    return accepted


def _texts(calls: dict[str, str], begin: str, end: str) -> list[str]:
    texts = []
    for text in list(calls.values())[:12]:
        call = text.replace("<tool_call>", begin).replace("</tool_call>", end)
        at = call.index('"arguments": ')
        head, args = call[:at], call[at + 13 : -len(end) - 1]
        arguments_first = begin + '{"arguments": ' + args + ", " + head[len(begin) + 1 : -2] + "}" + end
        broken = call.replace('"arguments": {"', '"arguments": {["', 1)
        texts += [
            f"Sure. {call} and {call}",
            f"{arguments_first} ok",
            f"x {broken}",
            call.replace('"', '"zz', 2),
        ]
        tagged = args.replace(': "', ': "' + end + '\\"}', 1)  # a closing tag and a quote in a string
        if tagged != args:
            texts.append(call.replace(args, tagged, 1) + " done")
    return texts


CASES = [("tekken", "hermes"), ("tekken", "qwen"), ("qwen3", "qwen")]


@pytest.fixture(scope="module", params=CASES, ids=["-".join(c) for c in CASES])
def case(request: pytest.FixtureRequest, tiny_model_131k: Path, tiny_model_qwen3: Path) -> tuple[Any, str]:
    vocab, dialect = request.param
    return _tokenizer(tiny_model_131k if vocab == "tekken" else tiny_model_qwen3), dialect


def test_composed_masks_equal_the_monolithic_ones_over_bfcl_calls(
    case: tuple[Any, str], bfcl: tuple[list[dict[str, Any]], dict[str, str]]
) -> None:
    tokenizer, dialect = case
    tools, calls = bfcl
    compiler, composed, oracle = _pair(tokenizer, dialect, tools)
    d = compiler.dialect
    masks = allocate_bitmask(2, compiler.vocab.vocab_size)
    stops = list(compiler.vocab.stop_token_ids)
    rejected = 0
    for text in _texts(calls, d.tool_call.begin, d.tool_call.end):
        ours, theirs = composed.matcher(stops), oracle.matcher(stops)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        for i, token in enumerate(tokens):
            if not _step(ours, theirs, masks, token, f"{text!r} at {i}"):
                rejected += 1
                break
        else:
            ours.rollback(len(tokens) // 2)  # replays from the start
            theirs.rollback(len(tokens) // 2)
            _step(ours, theirs, masks, tokens[len(tokens) // 2], f"{text!r} after a rollback")
    assert rejected >= 12  # every broken copy, and arguments first where the dialect has no such order


@pytest.mark.parametrize(("mode", "parallel"), [("auto", True), ("auto", False), ("required", True)])
def test_composed_masks_equal_the_monolithic_ones_on_random_walks(
    case: tuple[Any, str], bfcl: tuple[list[dict[str, Any]], dict[str, str]], mode: str, parallel: bool
) -> None:
    """Random allowed tokens after an opened call tag (and a partly written one), so the walks
    cross the head's states at odd token boundaries: names, gaps, the colon, later calls."""
    tokenizer, dialect = case
    compiler, composed, oracle = _pair(tokenizer, dialect, bfcl[0], mode, parallel)
    begin = compiler.dialect.tool_call.begin
    masks = allocate_bitmask(2, compiler.vocab.vocab_size)
    stops = list(compiler.vocab.stop_token_ids)
    for seed in range(4):
        rng = random.Random(seed)
        ours, theirs = composed.matcher(stops), oracle.matcher(stops)
        lead = "" if mode == "required" else "Hi "
        forced = tokenizer.encode(lead + (begin if seed % 2 else begin[:-1]), add_special_tokens=False)
        for step in range(60):
            where = f"seed {seed} step {step}"
            _compare(ours, theirs, masks, where)
            allowed = np.flatnonzero(np.unpackbits(masks[1].numpy().view(np.uint8), bitorder="little"))
            token = forced.pop(0) if forced else int(rng.choice(list(allowed)))
            assert _accept(ours, theirs, token, where)
            if theirs.is_terminated():
                break


@pytest.mark.parametrize(
    ("sampler", "engine"),
    [("random", "xgrammar"), ("longest", "xgrammar"), ("late", "xgrammar"), ("random", "auto")],
)
def test_required_replies_over_many_tools_hold_their_call_through_the_processor(
    tokenizer: Any, bfcl: tuple[list[dict[str, Any]], dict[str, str]], sampler: str, engine: str
) -> None:
    """End to end through the processor core (budgets and the completer ask the composed matcher
    for masks only): a worst-case model over 64 BFCL tools still gets its owed call, valid; under
    ``auto``, composed rows are filled in xgrammar's batch."""
    tools = bfcl[0]
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine=engine)
    assert isinstance(
        core.compiler.engine.compile(core.compiler.prepare(tools, "required").spec), ComposedGrammar
    )
    for max_tokens in (120, 400):
        outcome = run(core, tokenizer, Scenario(tools, "required", max_tokens), sampler, seed=max_tokens)
        assert outcome.kept(None) and outcome.calls >= 1, outcome


def test_the_engine_sorts_its_vocabulary_ahead_of_a_first_many_tool_request(tiny_model_131k: Path) -> None:
    """The sorted vocabulary (about 0.5 s on 131k tokens) is built in the background when the
    engine starts, not inside the first composed compile a request waits for."""
    import threading

    from hermes_vllm.grammar.engines import composed
    from hermes_vllm.grammar.engines.xgrammar import XGrammarEngine
    from hermes_vllm.vocabulary import Vocabulary

    vocab = Vocabulary.from_tokenizer(_tokenizer(tiny_model_131k))  # a fresh tokenizer: no tables yet
    assert not vocab.has_table(composed._SORTED)
    XGrammarEngine(vocab)
    for thread in threading.enumerate():
        if thread.name == "hermes-vllm-sort-vocab":
            thread.join()
    assert vocab.has_table(composed._SORTED)
