"""A call before every step's forward pass on Model Runner V2, whichever hooks the release calls.

vLLM 0.33's V2 runner calls a logits processor's ``apply_staged_writes()`` before every step's
forward; 0.34 only on steps that admit requests. A processor that starts copying its rows' tokens
there (the V2 adapter) then has no copy on the other steps, the most of a busy server's steps, and
its ``apply()`` must gather after the forward has been queued, waiting for it. The runner's
``update_requests`` runs on every step that is not a dummy run, in 0.32, 0.33 and 0.34 alike,
after the step's admissions (and their staged writes) and before its inputs are prepared and its
forward queued (``GPUModelRunner.execute_model``; ``tests/test_vllm_api.py`` reads each release's
source to hold it to that). Wrapping it gives every :class:`BeforeForward` processor of the
runner's sampler that call on every step. Where the method is missing the wrap is left out with a
warning and nothing breaks: ``apply()`` gathers what no hook gathered.

vLLM-free at import; the wrap is installed from the V2 adapter's constructor, in the worker that
builds the runner (whose module is imported by then), never in a process that has no V2 runner.
"""

from __future__ import annotations

import functools
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from hermes_vllm.vllm_api import touchpoints
from hermes_vllm.vllm_api.patching import wrap_attribute

_SKIPPED = (
    "hermes-vllm: %s has %s; the V2 adapter gathers its rows' tokens after the forward on steps "
    "that call no hook of it"
)
_PATCHED = "_hermes_vllm_before_forward"


class BeforeForward(ABC):
    """A V2 logits processor that wants a call on every step, before the forward is queued."""

    @abstractmethod
    def before_forward(self) -> None:
        """Called once a step, after the step's admissions, before its forward pass is queued."""


def notify(runner: Any) -> None:
    """Call :meth:`BeforeForward.before_forward` on each such processor of ``runner``'s sampler
    (none on a pipeline rank without a sampler)."""
    for processor in getattr(getattr(runner, "sampler", None), "logits_processors", ()):
        if isinstance(processor, BeforeForward):
            processor.before_forward()


def wrap_update_requests(update_requests: Callable[..., None]) -> Callable[..., None]:
    """``update_requests``, then :func:`notify`: the wrap the runner's per-step update gets."""

    @functools.wraps(update_requests)
    def update_then_notify(runner: Any, *args: Any, **kwargs: Any) -> None:
        update_requests(runner, *args, **kwargs)
        notify(runner)

    return update_then_notify


def install() -> bool:
    """Wrap the V2 runner's ``update_requests`` once per process; False where this process has
    not imported the V2 runner (no V2 runner runs here) or its release lacks the method."""
    if touchpoints.V2_STEP.module not in sys.modules:
        return False
    return wrap_attribute(touchpoints.V2_STEP, _SKIPPED, wrap_update_requests, _PATCHED)
