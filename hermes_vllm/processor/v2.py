"""Adapter for Model Runner V2, and the one entry-point class that serves both runners.

Rows are persistent request slots. Committed tokens live on the device (``all_token_ids``,
``total_len``); each ``apply()`` needs every constrained row's tokens since its last step. They are
gathered on the device (each slot's ``total_len`` and last few tokens, one small tensor) and copied
to pinned host memory without blocking, before the step's forward pass is queued: the copy has
finished by the time ``apply()`` runs on the CPU, so the masks are filled while the GPU still runs
the forward. The gather starts in whichever comes first of the release's ``apply_staged_writes()``
(0.33: every step; 0.34: only steps that admit requests) and the runner's per-step update
(:mod:`hermes_vllm.vllm_api.step_hook`, every step of every release), once a step. A copy serves
the first ``apply()`` after it and no other (tokens change only after sampling, which follows
``apply()``); an ``apply()`` that finds none (the step hook missing) gathers the rows itself and
waits for the copy (after the forward, on a GPU), counted in ``late_gathers``. Each row's tokens are
thus exact at every ``apply()`` whichever hooks a release calls and how often
(``docs/architecture.md``, "Model Runner V2 across releases").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor as V2LogitsProcessor

from hermes_vllm.processor.config import core_for_config
from hermes_vllm.processor.core import PROMPT_TAIL, RowState
from hermes_vllm.processor.frontend import FRONTEND
from hermes_vllm.vllm_api import step_hook

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState

# Tokens copied back per slot each step; a step commits at most one token per request without
# speculative decoding (served by vLLM's structured outputs instead), the rest is headroom.
_WINDOW = 4


def _is_v1_construction(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """V1 builds ``cls(vllm_config, device, is_pin_memory)``, V2 ``cls(vllm_config, req_states)``."""
    return len(args) + len(kwargs) == 3


class ToolCallLogitsProcessor(V2LogitsProcessor, step_hook.BeforeForward):  # type: ignore[misc]
    """Span-gated tool-call constraints; registered under ``vllm.logits_processors``.

    It is a V2 subclass, so the V2 loader (which type-checks entry points) accepts it; when the
    V1 loader constructs it with the V1 signature, ``__new__`` hands over to the V1 adapter. One
    install thus works on whichever runner vLLM picks, with no flag.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if _is_v1_construction(args, kwargs):
            from hermes_vllm.processor.v1 import V1ToolCallLogitsProcessor

            return V1ToolCallLogitsProcessor(*args, **kwargs)
        return super().__new__(cls)

    def __init__(self, vllm_config: VllmConfig, req_states: LogitsProcRequestState) -> None:
        self.core = core_for_config(vllm_config, "v2", req_states.device)
        self.req_states = req_states
        self.device = req_states.device
        self.slots: dict[int, RowState] = {}
        self._resumed: set[int] = set()
        # Slots of the latest batch and those added since: the only ones gathered. V2 tells a
        # processor nothing when a request finishes, so a finished slot's state stays in ``slots``
        # until the slot is reused (at most ``max_num_reqs`` of them), but it is not copied each step.
        self._live: set[int] = set()
        pin = self.device.type == "cuda"
        self._host = torch.zeros((req_states.max_num_reqs, 1 + _WINDOW), dtype=torch.int32, pin_memory=pin)
        self._copied: dict[int, int] = {}
        self._slots: list[int] = []
        """The slots of the last gather, in order, and their index on the device (a column)."""
        self._index = torch.zeros((0, 1), dtype=torch.long, device=self.device)
        self._back = torch.arange(_WINDOW, 0, -1, device=self.device)
        """How far back each copied token lies from a slot's end."""
        self._fresh = False
        """Whether ``_host`` holds a copy no ``apply()`` has used yet (made after the last sample)."""
        self._event: torch.cuda.Event | None = None
        self.late_gathers = 0
        """Steps whose ``apply()`` found no copy and gathered after the forward (0 where the step
        hook runs: the replays and ``benchmarks/v2_order.py`` count them)."""
        step_hook.install()

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        FRONTEND.validate(sampling_params)

    def add_request(self, req_idx: int, sampling_params: SamplingParams) -> bool:
        self.slots.pop(req_idx, None)
        self._resumed.discard(req_idx)
        if self.core is None:
            return False
        state = self.core.admit_params(sampling_params)
        if state is None:
            return False
        self.slots[req_idx] = state
        self._resumed.add(req_idx)
        self._live.add(req_idx)
        return True

    def apply_staged_writes(self) -> None:
        """Start the gather before the forward pass, where a release calls this hook."""
        self._gather_ahead()

    def before_forward(self) -> None:
        """Start the gather before the forward pass: the runner's per-step update calls this on
        every step (:mod:`hermes_vllm.vllm_api.step_hook`)."""
        self._gather_ahead()

    def _gather_ahead(self) -> None:
        """Gather unless this step's copy is made already and no slot was admitted since: both
        hooks run on 0.33's steps and on 0.34's admitting ones (an optimisation only:
        :meth:`apply` gathers whatever no hook gathered)."""
        if self.slots and self.core is not None and (self._resumed or not self._fresh):
            self._gather(self._live)

    def _gather(self, live: set[int]) -> None:
        """Catch up newly admitted slots, then gather ``live``'s lengths and last tokens on the
        device and start their copy to ``_host``."""
        assert self.core is not None
        prompt_len = self.req_states.prompt_len.np
        tokens = self.req_states.all_token_ids.gpu
        for slot in self._resumed:
            # A new row starts inside a span its prompt left open (one small blocking read a
            # request); resumed after preemption, it replays the outputs it already had (rare).
            start, end = int(prompt_len[slot]), int(self.req_states.prefill_len.np[slot])
            self.core.open_from_prompt(
                self.slots[slot], tokens[slot, max(0, start - PROMPT_TAIL) : start].tolist()
            )
            if end > start:
                self.core.advance(self.slots[slot], tokens[slot, start:end].tolist())
        slots = sorted((live | self._resumed) & self.slots.keys())
        self._resumed.clear()
        self._fresh = True
        self._event = None
        if slots != self._slots:  # most steps gather the same slots as the last: kept
            self._slots = slots
            self._copied = {slot: i for i, slot in enumerate(slots)}
            self._index = (
                torch.tensor(slots, dtype=torch.long).to(self.device, non_blocking=True).unsqueeze(1)
            )
        if not slots:
            return
        index = self._index
        total = self.req_states.total_len.gpu[index].long()
        positions = (total - self._back).clamp_(min=0)
        window = tokens[index, positions]
        packed = torch.cat([total.to(window.dtype), window], dim=1)
        self._host[: len(slots)].copy_(packed, non_blocking=True)
        if self.device.type == "cuda":
            self._event = torch.cuda.Event()
            self._event.record()

    def _new_tokens(self, slot: int, state: RowState, host: list[list[int]], prompt: int) -> list[int]:
        """The slot's tokens since the last step, from ``host`` (this step's copy, as lists), its
        prompt being ``prompt`` tokens long.

        A slot missing from the copy sat out the previous step (the scheduler ran out of token
        budget for it): its length is read from the device, a blocking read that is rare.
        """
        i = self._copied.get(slot)
        total = host[i][0] if i is not None else int(self.req_states.total_len.gpu[slot])
        fresh = total - prompt - state.consumed
        if fresh <= 0:
            return []
        if i is not None and fresh <= _WINDOW:
            return host[i][1 + _WINDOW - fresh :]
        # More than the window since the last look (e.g. a long pause): a blocking read, rare.
        start = prompt + state.consumed
        return [int(t) for t in self.req_states.all_token_ids.gpu[slot, start:total].tolist()]

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        if not self.slots or self.core is None:
            return logits
        batch = ctx.idx_mapping_np.tolist()
        if not self._fresh or self._resumed:  # no hook gathered since the last sample or admission
            self.late_gathers += 1
            self._gather({slot for slot in batch if slot in self.slots})
        self._fresh = False
        if self._event is not None:
            self._event.synchronize()
        # One conversion each, not one per row.
        host = self._host[: len(self._copied)].tolist()
        prompts = self.req_states.prompt_len.np[ctx.idx_mapping_np].tolist()
        slots, new_tokens = self.slots, self._new_tokens
        updates = []
        live = self._live = set()
        for row, slot in enumerate(batch):
            state = slots.get(slot)
            if state is not None:
                updates.append((row, state, new_tokens(slot, state, host, prompts[row])))
                live.add(slot)
        return self.core.step(logits, updates)
