"""Activation across hosts: the frontend asks the engines through vLLM's own ``collective_rpc``.

The handshake directory (:mod:`hermes_vllm.processor.handshake`) is local to a host. A frontend
with no engine of its own (``--data-parallel-size-local 0``, engines started ``--headless`` on
other hosts) finds no note there, and would refuse every constrained request. So each worker
where a processor of ours was built answers a ``collective_rpc`` named :data:`METHOD` with its
own host's handshake status (:func:`expose`; a worker without our processor has no such method,
and the call fails, which reads as "not active"). On the frontend, :func:`install` wraps
``AsyncLLM.generate`` once: the first constrained request that finds no local note asks the
engine before vLLM validates it, and records the answer as a local note, so ``validate_params``
accepts or refuses it (and every later one) as if the engine were local. Requests without a
constraint, and every request once a note exists, pass with one dict lookup.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from hermes_vllm.constraint import has_constraint
from hermes_vllm.processor import handshake

logger = logging.getLogger(__name__)

METHOD = "hermes_vllm_handshake_status"
"""The worker method the frontend calls; present only in processes that built our processor."""
_PATCHED = "__hermes_vllm_remote__"
_TIMEOUT_S = 60.0
_SKIPPED = "hermes-vllm: %s; engines on other hosts are not asked, their requests are refused"
_confirmed = False
"""Whether some processor of ours was confirmed active (then nothing is asked again)."""


def _status(_worker: Any) -> tuple[bool, str]:
    return handshake.status()


def expose() -> None:
    """Worker side: answer :data:`METHOD` with this host's handshake status (idempotent)."""
    try:
        from vllm.v1.worker.worker_base import WorkerBase
    except ImportError:
        logger.warning(_SKIPPED, "vllm.v1.worker.worker_base.WorkerBase is missing")
        return
    setattr(WorkerBase, METHOD, _status)


async def ask_engines(engine: Any) -> tuple[bool, str]:
    """What the engine's workers report; ``(False, reason)`` when they cannot answer."""
    try:
        answers = await engine.collective_rpc(METHOD, timeout=_TIMEOUT_S)
    except Exception as err:  # any failure means: not confirmed active
        return False, f"the engine did not confirm a hermes-vllm logits processor ({err})"
    errors = [str(detail) for active, detail in answers if not active]
    if answers and not errors:
        return True, ""
    return False, errors[0] if errors else "the engine reported no workers"


def _wrap(generate: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    @functools.wraps(generate)
    async def wrapped(self: Any, prompt: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
        global _confirmed
        if not _confirmed and has_constraint(getattr(sampling_params, "extra_args", None)):
            active = handshake.status()[0]
            if not active:
                active, detail = await ask_engines(self)
                handshake.announce("remote", None if active else detail)
            _confirmed = active
        async for output in generate(self, prompt, sampling_params, *args, **kwargs):
            yield output

    setattr(wrapped, _PATCHED, True)
    return wrapped


def install() -> bool:
    """Frontend side: wrap ``AsyncLLM.generate`` once per process; False if it is not there."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM

        generate = AsyncLLM.generate
    except (ImportError, AttributeError):
        logger.warning(_SKIPPED, "no vllm.v1.engine.async_llm.AsyncLLM.generate")
        return False
    if getattr(generate, _PATCHED, False):
        return True
    if not hasattr(AsyncLLM, "collective_rpc"):
        logger.warning(_SKIPPED, "AsyncLLM has no collective_rpc")
        return False
    AsyncLLM.generate = _wrap(generate)
    return True
