"""The V2 runner adapter driven with vLLM's real request-state buffers and context objects (the V1
adapter's tests, on releases that still have V1, are in ``test_processor_adapter_v1.py``).

The token streams are real tokenizations of valid turns; each step checks that the next token of
the turn is allowed, that a wrong token is masked inside a span, and that unconstrained rows are
bit-for-bit untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hermes_vllm import constraint_args

pytest.importorskip("vllm")

from vllm import SamplingParams

from hermes_vllm.processor import ToolCallLogitsProcessor
from hermes_vllm.testing.v2_runner import CALL_ORDERS, V2Runner, context, play_step

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}
TURN_A = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>'
TURN_B = '<tool_call>{"arguments": {"q": "vllm"}, "name": "search"}</tool_call> done'


def params(
    tools: list[dict[str, Any]] | None, choice: Any = "auto", stop: list[int] | None = None
) -> SamplingParams:
    extra = constraint_args(tools, choice) if tools is not None else None
    p = SamplingParams(max_tokens=1024, extra_args=extra, stop_token_ids=stop or [])
    return p


def allowed(logits: torch.Tensor, row: int, token: int) -> bool:
    return bool(torch.isfinite(logits[row, token]))


def tokens_of(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class Stream:
    """A request's planned output: the tokens it will commit, one per step."""

    def __init__(self, tokens: list[int]) -> None:
        self.plan = tokens
        self.output: list[int] = []

    def next_token(self) -> int:
        return self.plan[len(self.output)]

    def commit(self) -> None:
        self.output.append(self.next_token())


def random_logits(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randn((rows, width), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def v2(vllm_config: Any) -> Iterator[tuple[ToolCallLogitsProcessor, V2Runner, int]]:
    width = vllm_config.model_config.get_vocab_size()
    runner = V2Runner(8, 512, width)
    yield ToolCallLogitsProcessor(vllm_config, runner.state), runner, width


@pytest.mark.parametrize("release", ["0.33", "0.34"])
def test_v2_adapter_rows_reorder_and_slots_recycle(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any, release: str
) -> None:
    """Hooks called in each release's order: 0.34 calls ``apply_staged_writes`` only on the
    steps that admit requests (here the first and the one reusing slot 3)."""
    proc, runner, width = v2
    calls = CALL_ORDERS[release]
    assert isinstance(proc, ToolCallLogitsProcessor)
    prompt = tokens_of(tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    a, b = Stream(tokens_of(tokenizer, TURN_A)), Stream(tokens_of(tokenizer, TURN_B))
    for slot in (3, 5, 6):
        runner.admit(slot, prompt)
    assert proc.add_request(3, params([WEATHER]))
    assert not proc.add_request(5, params(None))
    assert proc.add_request(6, params([SEARCH]))
    streams = {3: a, 6: b}
    for step in range(max(len(a.plan), len(b.plan))):
        order = [6, 5, 3] if step % 2 else [3, 5, 6]  # rows are reordered every step
        logits = random_logits(3, width, step)
        before = logits.clone()
        play_step(proc, calls, step == 0, logits, context(order))
        assert torch.equal(logits[order.index(5)], before[order.index(5)])
        for slot, stream in streams.items():
            if len(stream.output) < len(stream.plan):
                assert allowed(logits, order.index(slot), stream.next_token()), f"step {step} slot {slot}"
                runner.commit(slot, stream.next_token())
                stream.commit()
    play_step(proc, calls, False, random_logits(3, width, 0), context([3, 5, 6]))
    assert proc.slots[3].consumed == len(a.plan) and proc.slots[3].failed is None
    # After its call the turn is in free text again: the gate has switched the engine off.
    assert proc.slots[3].engine.matcher is None and not proc.slots[3].gate.pending

    # Slot 3 finishes; a plain request reuses it and must not be touched.
    runner.admit(3, prompt)
    assert not proc.add_request(3, params(None))
    logits = random_logits(1, width, 1)
    before = logits.clone()
    play_step(proc, calls, True, logits, context([3]))
    assert torch.equal(logits, before)


def test_v2_adapter_replays_resumed_output(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any
) -> None:
    proc, runner, width = v2
    prompt = tokens_of(tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    plan = tokens_of(tokenizer, TURN_A)
    half = plan[: len(plan) // 2]
    runner.admit(2, prompt, half)
    assert proc.add_request(2, params([WEATHER]))
    proc.apply_staged_writes()
    logits = random_logits(1, width, 3)
    proc.apply(logits, context([2]))
    assert proc.slots[2].consumed == len(half)
    assert allowed(logits, 0, plan[len(half)])
    assert not torch.isfinite(logits[0]).all()


OPENED = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
"""A generation prompt that opens the reasoning span (Qwen3-Thinking-2507, DeepSeek-R1 style)."""
INSIDE = "Maybe <tool_call>{not a call</think>\n" + TURN_A[len("Let me check.\n") :]
"""The output after it: a call tag inside the span, then the real call."""


@pytest.mark.parametrize("release", ["0.33", "0.34"])
@pytest.mark.parametrize("choice", ["auto", "required"])
def test_v2_adapter_starts_a_row_inside_the_span_its_prompt_opened(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any, choice: str, release: str
) -> None:
    """The prompt ends with ``<think>``: a call tag before ``</think>`` is reasoning text, not a call."""
    proc, runner, width = v2
    plan = tokens_of(tokenizer, INSIDE)
    runner.admit(1, tokens_of(tokenizer, OPENED))
    assert proc.add_request(1, params([WEATHER], choice))
    for step, token in enumerate(plan):
        logits = random_logits(1, width, step)
        play_step(proc, CALL_ORDERS[release], step == 0, logits, context([1]))
        assert allowed(logits, 0, token), f"step {step}: the turn's own token was masked"
        runner.commit(1, token)
    assert proc.slots[1].failed is None


def test_v2_adapter_gathers_only_live_slots_and_catches_up_a_slot_that_sat_out(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any
) -> None:
    """V2 never says a request finished: a slot absent from a batch is not copied again.

    A finished slot's window is no longer gathered each step; a slot the scheduler left out for a
    step (no token budget left for it) is read back from the device when it returns.
    """
    proc, runner, width = v2
    prompt = tokens_of(tokenizer, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    a, b = Stream(tokens_of(tokenizer, TURN_A)), Stream(tokens_of(tokenizer, TURN_B))
    for slot in (1, 4, 5):
        runner.admit(slot, prompt)
    assert proc.add_request(1, params([WEATHER]))
    assert proc.add_request(4, params([SEARCH]))
    assert not proc.add_request(5, params(None))  # a plain request keeps the batch going
    streams = {1: a, 4: b}
    for step in range(max(len(a.plan), len(b.plan)) + 3):
        # Slot 4 sits out every third step; a slot stops appearing once its turn is done.
        running = [s for s, st in streams.items() if len(st.output) < len(st.plan)]
        batch = [5, *(s for s in running if (s, step % 3) != (4, 2))]
        proc.apply_staged_writes()
        assert set(proc._copied) <= {1, 4}
        logits = random_logits(len(batch), width, step)
        proc.apply(logits, context(batch))
        for row, slot in enumerate(batch[1:], start=1):
            stream = streams[slot]
            assert allowed(logits, row, stream.next_token()), f"step {step} slot {slot}"
            runner.commit(slot, stream.next_token())
            stream.commit()
    proc.apply_staged_writes()
    assert proc._copied == {}, "finished slots are still gathered every step"
    proc.apply(random_logits(3, width, 0), context([5, 1, 4]))
    assert proc.slots[1].consumed == len(a.plan) and proc.slots[4].consumed == len(b.plan)
    assert proc.slots[1].failed is None and proc.slots[4].failed is None
