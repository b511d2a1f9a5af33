"""Both runner adapters driven with vLLM's real batch-update and context objects.

The token streams are real tokenizations of valid turns; each step checks that the next token of
the turn is allowed, that a wrong token is masked inside a span, and that unconstrained rows are
bit-for-bit untouched.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from hermes_vllm import constraint_args

pytest.importorskip("vllm")

from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from hermes_vllm.processor import ToolCallLogitsProcessor
from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor
from hermes_vllm.testing.v2_runner import V2Runner, context

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


def test_entry_point_class_builds_the_v1_adapter_under_the_v1_signature(vllm_config: Any) -> None:
    proc = ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    assert isinstance(proc, V1ToolCallLogitsProcessor)
    assert not proc.is_argmax_invariant()


def test_v1_adapter_add_move_swap_remove_and_slot_reuse(vllm_config: Any, tokenizer: Any) -> None:
    proc = ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    width = vllm_config.model_config.get_vocab_size()
    a, b, plain = Stream(tokens_of(tokenizer, TURN_A)), Stream(tokens_of(tokenizer, TURN_B)), Stream([])
    proc.update_state(
        BatchUpdate(
            batch_size=3,
            removed=[],
            added=[
                (0, params([WEATHER]), None, a.output),
                (1, params(None), None, plain.output),
                (2, params([SEARCH, WEATHER]), None, b.output),
            ],
            moved=[],
        )
    )
    rows = {0: a, 2: b}
    masked_steps = 0
    for step in range(max(len(a.plan), len(b.plan))):
        if step == 5:
            # Swap rows 0 and 2: the streams travel with their matchers.
            proc.update_state(BatchUpdate(3, [], [], [(0, 2, MoveDirectionality.SWAP)]))
            rows = {0: b, 2: a}
        logits = random_logits(3, width, step)
        before = logits.clone()
        proc.apply(logits)
        assert torch.equal(logits[1], before[1]), "an unconstrained row was modified"
        for row, stream in rows.items():
            if len(stream.output) < len(stream.plan):
                assert allowed(logits, row, stream.next_token()), f"step {step}: planned token masked"
        masked_steps += int(not torch.isfinite(logits[[0, 2]]).all())
        for stream in rows.values():
            if len(stream.output) < len(stream.plan):
                stream.commit()
    assert masked_steps > 10, "inside the spans the rows must have been masked"

    # Remove the SEARCH request (now row 0), then reuse its slot for a forced-choice request.
    proc.update_state(BatchUpdate(batch_size=2, removed=[0], added=[], moved=[]))
    assert 0 not in proc.rows
    c = Stream(tokens_of(tokenizer, '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'))
    forced = params([WEATHER, SEARCH], {"type": "function", "function": {"name": "search"}})
    proc.update_state(BatchUpdate(batch_size=3, removed=[], added=[(0, forced, None, c.output)], moved=[]))
    logits = random_logits(3, width, 99)
    proc.apply(logits)
    weather_call = tokens_of(tokenizer, '<tool_call>{"name": "get_weather"')
    assert allowed(logits, 0, c.next_token())
    # Forced choice: free text cannot start the turn, and the other tool's name is refused.
    assert not allowed(logits, 0, tokens_of(tokenizer, "Hello")[0])
    for token in c.plan:
        logits = random_logits(3, width, token)
        proc.apply(logits)
        assert allowed(logits, 0, token)
        c.output.append(token)
    probe = Stream(weather_call)
    check = V1ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    check.update_state(BatchUpdate(1, [], [(0, forced, None, probe.output)], []))
    refused = False
    for _ in probe.plan:
        logits = random_logits(1, width, 7)
        check.apply(logits)
        if not allowed(logits, 0, probe.next_token()):
            refused = True
            break
        probe.commit()
    assert refused, "a call to a tool other than the named one must be masked"


def test_v1_adapter_waits_for_async_placeholders(vllm_config: Any, tokenizer: Any) -> None:
    proc = V1ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    width = vllm_config.model_config.get_vocab_size()
    plan = tokens_of(tokenizer, TURN_A)
    output: list[int] = []
    proc.update_state(BatchUpdate(1, [], [(0, params([WEATHER]), None, output)], []))
    for token in plan:
        output.append(-1)  # async scheduling: the slot exists before the token is known
        proc.update_state(None)
        output[-1] = token  # vLLM fills placeholders in before sampling
        logits = random_logits(1, width, token)
        proc.apply(logits)
    state, _ = proc.rows[0]
    assert state.consumed == len(plan) and state.failed is None
    # The turn ends after the call, in free text: the engine is off again, at a clean point.
    assert state.matcher is None and not state.pending


def test_v1_adapter_replays_a_resumed_request(vllm_config: Any, tokenizer: Any) -> None:
    """Preemption: the request comes back with its earlier output; the matcher is rebuilt."""
    proc = V1ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    width = vllm_config.model_config.get_vocab_size()
    plan = tokens_of(tokenizer, TURN_A)
    half = plan[: len(plan) // 2]
    output = list(half)
    proc.update_state(BatchUpdate(1, [], [(0, params([WEATHER]), None, output)], []))
    logits = random_logits(1, width, 1)
    proc.apply(logits)
    assert allowed(logits, 0, plan[len(half)])
    assert not torch.isfinite(logits[0]).all(), "mid-call, the row must be masked"


@pytest.fixture
def v2(vllm_config: Any) -> Iterator[tuple[ToolCallLogitsProcessor, V2Runner, int]]:
    width = vllm_config.model_config.get_vocab_size()
    runner = V2Runner(8, 512, width)
    yield ToolCallLogitsProcessor(vllm_config, runner.state), runner, width


def test_v2_adapter_rows_reorder_and_slots_recycle(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any
) -> None:
    proc, runner, width = v2
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
        proc.apply_staged_writes()
        logits = random_logits(3, width, step)
        before = logits.clone()
        proc.apply(logits, context(order))
        assert torch.equal(logits[order.index(5)], before[order.index(5)])
        for slot, stream in streams.items():
            if len(stream.output) < len(stream.plan):
                assert allowed(logits, order.index(slot), stream.next_token()), f"step {step} slot {slot}"
                runner.commit(slot, stream.next_token())
                stream.commit()
    proc.apply_staged_writes()
    proc.apply(random_logits(3, width, 0), context([3, 5, 6]))
    assert proc.slots[3].consumed == len(a.plan) and proc.slots[3].failed is None
    # After its call the turn is in free text again: the gate has switched the engine off.
    assert proc.slots[3].matcher is None and not proc.slots[3].pending

    # Slot 3 finishes; a plain request reuses it and must not be touched.
    runner.admit(3, prompt)
    assert not proc.add_request(3, params(None))
    proc.apply_staged_writes()
    logits = random_logits(1, width, 1)
    before = logits.clone()
    proc.apply(logits, context([3]))
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


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_v1_adapter_starts_a_row_inside_the_span_its_prompt_opened(
    vllm_config: Any, tokenizer: Any, choice: str
) -> None:
    proc = ToolCallLogitsProcessor(vllm_config, torch.device("cpu"), False)
    width = vllm_config.model_config.get_vocab_size()
    stream = Stream(tokens_of(tokenizer, INSIDE))
    added = [(0, params([WEATHER], choice), tokens_of(tokenizer, OPENED), stream.output)]
    proc.update_state(BatchUpdate(batch_size=1, removed=[], added=added, moved=[]))
    for step, token in enumerate(stream.plan):
        logits = random_logits(1, width, step)
        proc.apply(logits)
        assert allowed(logits, 0, token), f"step {step}: the turn's own token was masked"
        stream.commit()
        proc.update_state(None)
    assert proc.rows[0][0].failed is None


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_v2_adapter_starts_a_row_inside_the_span_its_prompt_opened(
    v2: tuple[ToolCallLogitsProcessor, V2Runner, int], tokenizer: Any, choice: str
) -> None:
    """The prompt ends with ``<think>``: a call tag before ``</think>`` is reasoning text, not a call."""
    proc, runner, width = v2
    plan = tokens_of(tokenizer, INSIDE)
    runner.admit(1, tokens_of(tokenizer, OPENED))
    assert proc.add_request(1, params([WEATHER], choice))
    for step, token in enumerate(plan):
        proc.apply_staged_writes()
        logits = random_logits(1, width, step)
        proc.apply(logits, context([1]))
        assert allowed(logits, 0, token), f"step {step}: the turn's own token was masked"
        runner.commit(1, token)
    assert proc.slots[1].failed is None


def _async_batch(vllm_config: Any) -> Any:
    """A V1 ``InputBatch`` built as the GPU runner builds it for entry-point processors only."""
    from vllm.v1.sample.logits_processor import build_logitsprocs
    from vllm.v1.worker.gpu_input_batch import InputBatch

    config = copy.deepcopy(vllm_config)
    config.scheduler_config.async_scheduling = True
    cpu = torch.device("cpu")
    return InputBatch(
        max_num_reqs=4,
        max_model_len=1024,
        max_num_batched_tokens=1024,
        device=cpu,
        vocab_size=config.model_config.get_vocab_size(),
        block_sizes=[16],
        max_num_blocks_per_req=[64],
        logitsprocs=build_logitsprocs(config, cpu, False, False, ()),
        logitsprocs_need_output_token_ids=False,  # bool(--logits-processors): none given
    )


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_v1_runner_under_async_scheduling_shows_us_the_sampled_tokens(
    vllm_config: Any, tokenizer: Any, choice: str
) -> None:
    """vLLM's real ``InputBatch``, stepped as the V1 runner steps it under async scheduling.

    After each step the runner appends a ``-1`` placeholder and hands the batch the sampled ids
    (``set_async_sampled_token_ids``); before the next sampling it repairs the lists
    (``update_async_output_token_ids``), then applies the processors. The planned turn must stay
    allowed token by token, and our rows must have read every token.
    """
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    batch = _async_batch(vllm_config)
    ours = [p for p in batch.logitsprocs.all if isinstance(p, V1ToolCallLogitsProcessor)]
    assert len(ours) == 1 and ours[0].core is not None
    turn = TURN_A if choice == "auto" else TURN_A[TURN_A.index("<tool_call>") :]  # required: no text first
    plan = tokens_of(tokenizer, turn)
    request = CachedRequestState(
        req_id="r",
        prompt_token_ids=[1, 2, 3],
        mm_features=[],
        sampling_params=params([WEATHER], choice),
        generator=None,
        block_ids=([0],),
        num_computed_tokens=0,
        output_token_ids=[],
    )
    batch.add_request(request)
    batch.refresh_metadata()
    width = vllm_config.model_config.get_vocab_size()
    for step, token in enumerate(plan):
        batch.update_async_output_token_ids()
        logits = random_logits(1, width, step)
        for proc in batch.logitsprocs.non_argmax_invariant:
            logits = proc.apply(logits)
        assert allowed(logits, 0, token), f"step {step}: the turn's next token is masked"
        # What the runner does after sampling under async scheduling.
        request.output_token_ids.append(-1)
        batch.prev_req_id_to_index = {"r": 0}
        event = torch.Event()
        event.record()
        batch.set_async_sampled_token_ids(torch.tensor([[token]]), event)
    batch.update_async_output_token_ids()
    for proc in batch.logitsprocs.non_argmax_invariant:
        proc.apply(random_logits(1, width, 0))
    state, _ = ours[0].rows[0]
    assert request.output_token_ids == plan
    assert state.consumed == len(plan) and state.failed is None


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
