"""Adapter for the V1 model runner (``vllm.v1.sample.logits_processor.LogitsProcessor``).

Rows are batch indices; ``BatchUpdate`` moves are applied with vLLM's own helper. The output
token lists arrive by reference; under async scheduling their last entries may still be ``-1``
placeholders in ``update_state``, and vLLM fills them in before ``apply`` (which is where the
matchers are advanced) because :mod:`hermes_vllm.processor.output_ids` asks it to.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate
from vllm.v1.sample.logits_processor import LogitsProcessor as V1LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from hermes_vllm.processor import output_ids
from hermes_vllm.processor.config import core_for_config
from hermes_vllm.processor.core import ConstraintCore
from hermes_vllm.processor.row import RowState

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams


class V1ToolCallLogitsProcessor(V1LogitsProcessor):  # type: ignore[misc]
    """Span-gated tool-call constraints on the V1 runner."""

    hermes_vllm_reads_output_ids = True  # see output_ids.MARK

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool) -> None:
        refusal = None
        if vllm_config.scheduler_config.async_scheduling:
            problem = output_ids.install()
            if problem is not None:
                refusal = (
                    f"under async scheduling the V1 runner does not show logits processors the "
                    f"sampled tokens ({problem}); serve with --no-async-scheduling or on Model Runner V2"
                )
        self.core: ConstraintCore | None = core_for_config(vllm_config, "v1", device, refusal)
        self.device = device
        self.rows: dict[int, tuple[RowState, list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def _new_row(
        self, params: SamplingParams, prompt: list[int] | None, output: list[int]
    ) -> tuple[RowState, list[int]] | None:
        assert self.core is not None
        state = self.core.admit_params(params, prompt)
        return None if state is None else (state, output)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if self.core is not None:
            process_dict_updates(self.rows, batch_update, self._new_row)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        if not self.rows or self.core is None:
            return logits
        rows = logits.shape[0]
        updates: list[tuple[int, RowState, Sequence[int]]] = []
        for row, (state, output) in self.rows.items():
            if row < rows:
                consumed = state.consumed
                if len(output) == consumed + 1:  # the common case: one new token, no list copy
                    token = output[consumed]
                    updates.append((row, state, () if token == -1 else (token,)))
                    continue
                new = output[consumed:]
                if new and new[-1] == -1:
                    new = new[: new.index(-1)]
                updates.append((row, state, new))
        return self.core.step(logits, updates)
