"""The batch core's promises that do not depend on a runner.

Tensor-parallel workers each build the processor and must mask identically, although their
compiles finish at different times: here one worker's grammar is ready at once and the other's
compile is held back until its row's call begins.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from hermes_vllm import constraint_args
from hermes_vllm.dialect import get_dialect
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.processor.core import ConstraintCore

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TURN = (
    "Let me look that up. <think>maybe <tool_call> is text here</think> Now:\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call> Done, bye.'
)


def worker(tokenizer: Any, cache: GrammarCache[Any]) -> ConstraintCore:
    core = ConstraintCore(lambda: tokenizer, len(tokenizer), engine="auto")
    core.compiler = ToolGrammarCompiler(tokenizer, engine="auto", vocab_size=len(tokenizer), cache=cache)
    return core


def test_two_workers_mask_identically_whatever_their_compile_timing(tiny_model: Path, tokenizer: Any) -> None:
    fast: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    slow: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    gate = threading.Event()
    slow.get("occupy the only compile thread", lambda: gate.wait(30))
    a, b = worker(tokenizer, fast), worker(tokenizer, slow)
    args = constraint_args([TOOL])
    state_a, state_b = a.admit(args, []), b.admit(args, [])
    assert state_a is not None and state_b is not None
    state_a.future.result(30)  # worker A: grammar ready before the first step

    tokens = tokenizer.encode(TURN, add_special_tokens=False)
    call_starts = len(tokenizer.encode(TURN[: TURN.index("\n<tool_call>")], add_special_tokens=False))
    timer = threading.Timer(0.2, gate.set)  # worker B's compile may start only now...
    masked_steps = 0
    for step in range(len(tokens) + 1):
        if step == call_starts:
            assert not state_b.future.done(), "the test must hold worker B's compile back until here"
            timer.start()  # ...and B blocks on it when its call begins
        logits = torch.randn((1, len(tokenizer)), generator=torch.Generator().manual_seed(step))
        out_a, out_b = logits.clone(), logits.clone()
        new = tokens[step - 1 : step] if step else []
        a.step(out_a, [(0, state_a, new)])
        b.step(out_b, [(0, state_b, new)])
        assert torch.equal(out_a, out_b), f"workers diverged at step {step}"
        if step < len(tokens):
            assert torch.isfinite(out_a[0, tokens[step]]), f"step {step}: the turn's own token was masked"
        masked_steps += int(not torch.isfinite(out_a).all())
    assert masked_steps >= 10, "the call must have been masked"
    assert state_a.failed is None and state_b.failed is None


def test_a_closing_tag_inside_an_unfinished_argument_keeps_the_call_constrained(tokenizer: Any) -> None:
    """``</tool_call>`` inside a JSON string does not end the call: the row stays masked."""
    core = worker(tokenizer, GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes))
    state = core.admit(constraint_args([TOOL]), [])
    assert state is not None
    text = 'Sure. <tool_call>{"name": "get_weather", "arguments": {"city": "a</tool_call>'
    for token in tokenizer.encode(text, add_special_tokens=False):
        core.step(torch.zeros((1, len(tokenizer))), [(0, state, [token])])
    logits = torch.zeros((1, len(tokenizer)))
    core.step(logits, [(0, state, [])])
    assert state.engine.matcher is not None and state.failed is None
    assert not torch.isfinite(logits[0, tokenizer.eos_token_id]), "the call is unfinished: no end of turn"


OPENED_PROMPT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
"""A generation prompt that opens the reasoning span, as Qwen3-Thinking-2507 and DeepSeek-R1 write."""
INSIDE = (
    'maybe <tool_call>{"name": nothing valid</think>\n\n'
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
)
"""The output after it: a call tag inside the still-open span is text, then the real call."""


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_prompt_that_opens_reasoning_starts_the_row_inside_the_span(tokenizer: Any, choice: str) -> None:
    """The gate and the engine read the output as the span's body; the budget counts from the tag."""
    core = worker(tokenizer, GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes))
    prompt = tokenizer.encode(OPENED_PROMPT, add_special_tokens=False)
    state = core.admit(constraint_args([TOOL], tool_choice=choice), [], max_tokens=512, thinking_budget=64)
    assert state is not None and state.budget is not None
    core.open_from_prompt(state, prompt)
    # vLLM's thinking budget counts the prompt's tokens after the tag too ("\n" here).
    tag_at = len(
        tokenizer.encode(OPENED_PROMPT[: OPENED_PROMPT.rindex("<think>") + 7], add_special_tokens=False)
    )
    assert state.budget.progress.span_tokens == len(prompt) - tag_at
    tokens = tokenizer.encode(INSIDE, add_special_tokens=False)
    for step in range(len(tokens) + 1):
        logits = torch.zeros((1, len(tokenizer)))
        core.step(logits, [(0, state, tokens[step - 1 : step] if step else [])])
        if step < len(tokens):
            assert torch.isfinite(logits[0, tokens[step]]), f"step {step}: the turn's own token was masked"
    assert state.failed is None


def test_cores_on_one_tokenizer_share_the_vocabularys_token_tables(tokenizer: Any) -> None:
    """The tables the step reads over the vocabulary (which tokens hold a text, or a byte a gate
    watches; the masks a budget narrows a row's by) are the vocabulary's, built once per tokenizer:
    each core once built and kept its own (a test process's hundreds of cores, each a 131k-token
    index and its arrays)."""
    first, second = (ConstraintCore(lambda: tokenizer, len(tokenizer)) for _ in range(2))
    words = (len(tokenizer) + 31) // 32
    dialect = get_dialect("hermes")
    assert first.index is second.index
    assert first.index.holding_any(b"<") is second.index.holding_any(b"<")
    vocab, other = first.compiler.vocab, second.compiler.vocab
    assert vocab.no_call_words(dialect, words) is other.no_call_words(dialect, words)
    assert vocab.whole_words(words) is other.whole_words(words)
