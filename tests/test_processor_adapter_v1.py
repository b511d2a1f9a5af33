"""The V1 runner adapter driven with vLLM's real batch-update objects, where the release still
has the V1 runner (0.34 deleted it; the shared turns and helpers are the V2 tests')."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

pytest.importorskip("vllm.v1.sample.logits_processor", reason="this vLLM has no V1 runner (0.34 deleted it)")

from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from hermes_vllm.processor import ToolCallLogitsProcessor
from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor
from tests.test_processor_adapters import (
    INSIDE,
    OPENED,
    SEARCH,
    TURN_A,
    TURN_B,
    WEATHER,
    Stream,
    allowed,
    params,
    random_logits,
    tokens_of,
)


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
    assert state.engine.matcher is None and not state.gate.pending


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
