"""Model Runner V2's part, played on the CPU: its request-state buffers and the writes it makes.

V2 does not run on vLLM's CPU backend, so the V2 adapter is driven here with vLLM's own buffer
classes (``StagedWriteTensor``, ``UvaBackedTensor``) and batch layout (``LogitsContext``); only the
writes the runner's kernels would make (``postprocess_sampled``) are plain tensor indexing. Used by
the adapter tests and ``benchmarks/v2_slots.py``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import vllm.v1.worker.cpu.shm  # noqa: F401  (what vLLM's CPU worker imports: CPU buffers for V2)
from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor, UvaBackedTensor
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState

_CPU = torch.device("cpu")


class V2Runner:
    """Owns the per-slot buffers a V2 processor reads; admits requests and commits tokens."""

    def __init__(self, max_reqs: int, max_len: int, vocab: int) -> None:
        self.all_token_ids = StagedWriteTensor((max_reqs, max_len), dtype=torch.int32, device=_CPU)
        self.total_len = StagedWriteTensor(max_reqs, dtype=torch.int32, device=_CPU)
        self.prompt_len = UvaBackedTensor(max_reqs, dtype=torch.int32)
        self.prefill_len = UvaBackedTensor(max_reqs, dtype=torch.int32)
        self.state = LogitsProcRequestState(
            device=_CPU,
            max_num_reqs=max_reqs,
            vocab_size=vocab,
            all_token_ids=self.all_token_ids,
            prompt_len=self.prompt_len,
            prefill_len=self.prefill_len,
            total_len=self.total_len,
        )

    def admit(self, slot: int, prompt: Sequence[int], resumed_output: Sequence[int] = ()) -> None:
        """Fill ``slot`` as the runner does at admission (or resumption, with its earlier output)."""
        tokens = [*prompt, *resumed_output]
        self.prompt_len.np[slot] = len(prompt)
        self.prefill_len.np[slot] = len(tokens)
        self.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self.total_len.gpu[slot] = len(tokens)

    def commit(self, slot: int, token: int) -> None:
        """Append one sampled token to ``slot``, as the runner does after sampling."""
        at = int(self.total_len.gpu[slot])
        self.all_token_ids.gpu[slot, at] = token
        self.total_len.gpu[slot] = at + 1


def context(slots: Sequence[int]) -> LogitsContext:
    """The batch layout of one step without drafts: one logits row per slot, in this order."""
    idx = torch.tensor(list(slots), dtype=torch.int32)
    zeros = torch.zeros(len(slots), dtype=torch.int32)
    return LogitsContext(
        expanded_idx_mapping=idx,
        idx_mapping=idx,
        idx_mapping_np=np.array(list(slots), dtype=np.int32),
        expanded_local_pos=zeros,
        input_ids=zeros,
        pos=zeros,
        seq_lens_upper_bound_np=np.zeros(len(slots), dtype=np.int32),
    )
