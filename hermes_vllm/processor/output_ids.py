"""Have the V1 runner fill in the sampled token ids our processor reads, under async scheduling.

Under async scheduling (the GPU default) the V1 runner appends a ``-1`` placeholder to each
request's output list every step; the real ids stay on the device, and ``InputBatch`` copies them
into the lists before sampling only when ``logitsprocs_need_output_token_ids`` is set (or
penalties, bad words, a thinking budget ask for them). The runner sets that flag only for
processors passed with ``--logits-processors``, not for entry-point ones like ours (vllm#52461),
so our rows would never see what was sampled: ``required`` rows stuck on their opening tokens,
``auto`` rows never gated. :func:`install` wraps ``InputBatch.__init__`` once per process so that
a batch holding an active processor of ours is built with the flag on; it runs when the V1 adapter
is built, which is while the runner evaluates the arguments of that very ``InputBatch(...)``. The
price is vLLM's own: one wait per step for the previous step's ids to reach the host, as with
penalties. If this vLLM lacks the flag or the repair, :func:`install` returns the reason and the
processor refuses constrained requests instead of serving them unconstrained.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any

from hermes_vllm.vllm_api import touchpoints

logger = logging.getLogger(__name__)

_MODULE = touchpoints.V1_INPUT_BATCH.module
_FLAG = "logitsprocs_need_output_token_ids"
_PATCHED = "__hermes_vllm_output_ids__"
MARK = "hermes_vllm_reads_output_ids"
"""An attribute of our V1 adapter: its rows read the values of the output token lists."""


def _reads_output_ids(logitsprocs: Any) -> bool:
    return any(
        getattr(p, MARK, False) and getattr(p, "core", None) is not None
        for p in getattr(logitsprocs, "all", ())
    )


def _wrap(init: Callable[..., None]) -> Callable[..., None]:
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(self, *args, **kwargs)
        if _reads_output_ids(bound.arguments.get("logitsprocs")):
            bound.arguments[_FLAG] = True
        init(*bound.args, **bound.kwargs)

    setattr(__init__, _PATCHED, True)
    return __init__


def install() -> str | None:
    """Wrap ``InputBatch.__init__`` once per process; the reason it cannot be done, else ``None``."""
    try:
        module = __import__(_MODULE, fromlist=["InputBatch"])
        batch = module.InputBatch
    except (ImportError, AttributeError):
        return f"{_MODULE}.InputBatch is missing"
    init = batch.__init__
    if getattr(init, _PATCHED, False):
        return None
    missing = [
        name
        for name, present in (
            (f"InputBatch({_FLAG}=...)", _FLAG in inspect.signature(init).parameters),
            ("InputBatch(logitsprocs=...)", "logitsprocs" in inspect.signature(init).parameters),
            ("InputBatch.update_async_output_token_ids", hasattr(batch, "update_async_output_token_ids")),
        )
        if not present
    ]
    if missing:
        return f"this vLLM's V1 runner has no {', '.join(missing)}"
    batch.__init__ = _wrap(init)
    return None
