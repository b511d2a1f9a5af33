"""Report ``finish_reason: "length"`` for a non-streaming reply that ``max_tokens`` cut.

vLLM's non-streaming chat path (``OpenAIServingChat.chat_completion_full_generator``) replaces the
engine's finish reason with ``"tool_calls"`` whenever the parser returned a call under
``tool_choice="auto"``, so a reply cut inside its second call claimed to have finished its calls,
while the streaming path of the same request said ``"length"``. A parser cannot reach that field,
so :func:`install` wraps the method: it notes the engine's finish reason of each choice as the
outputs stream by and puts ``"length"`` back on the choices that vLLM relabelled. Only requests
our tool parser constrained are touched (their ``vllm_xargs`` carry our key); if a vLLM version
lacks the method, nothing is patched and a warning says so.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from hermes_vllm.constraint import has_constraint

logger = logging.getLogger(__name__)

_MODULE = "vllm.entrypoints.openai.chat_completion.serving"
_PATCHED = "__hermes_vllm_finish_reason__"
_SKIPPED = "hermes-vllm: %s: %s; a cut non-streaming reply keeps vLLM's finish_reason"


async def _noting(outputs: AsyncIterator[Any], reasons: dict[int, str | None]) -> AsyncIterator[Any]:
    async for result in outputs:
        for output in result.outputs:
            reasons[output.index] = output.finish_reason
        yield result


def restore_length(response: Any, reasons: dict[int, str | None]) -> None:
    """Put the engine's ``"length"`` back on every choice vLLM relabelled ``"tool_calls"``."""
    for choice in getattr(response, "choices", None) or ():
        if choice.finish_reason == "tool_calls" and reasons.get(choice.index) == "length":
            choice.finish_reason = "length"


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(method)

    @functools.wraps(method)
    async def full_generator(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        if not has_constraint(getattr(bound.arguments["request"], "vllm_xargs", None)):
            return await method(self, *args, **kwargs)
        reasons: dict[int, str | None] = {}
        bound.arguments["result_generator"] = _noting(bound.arguments["result_generator"], reasons)
        response = await method(*bound.args, **bound.kwargs)
        restore_length(response, reasons)
        return response

    setattr(full_generator, _PATCHED, True)
    return full_generator


def install() -> bool:
    """Wrap vLLM's non-streaming chat method once per process; False if it is not there."""
    try:
        module = __import__(_MODULE, fromlist=["OpenAIServingChat"])
        serving = module.OpenAIServingChat
        method = serving.chat_completion_full_generator
    except (ImportError, AttributeError):
        logger.warning(_SKIPPED, _MODULE, "no OpenAIServingChat.chat_completion_full_generator")
        return False
    if getattr(method, _PATCHED, False):
        return True
    parameters = inspect.signature(method).parameters
    if not {"request", "result_generator"} <= parameters.keys():
        logger.warning(_SKIPPED, _MODULE, "chat_completion_full_generator has another signature")
        return False
    serving.chat_completion_full_generator = _wrap(method)
    return True
