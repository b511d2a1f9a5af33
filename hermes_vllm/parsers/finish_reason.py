"""Report ``finish_reason: "length"`` for a reply that ``max_tokens`` cut, and for one that holds a
call the budget closed.

A call the budget closed (steered to its shortest valid completion and followed by
:data:`~hermes_vllm.budget.MARK`) may carry cut arguments, and the model may well end its
turn right after it, so the engine says ``"stop"`` and vLLM says ``"tool_calls"``. Agent clients
read truncation from ``finish_reason`` alone, so :func:`install` also wraps the engine client's
``generate`` (``AsyncLLM.generate``, which every OpenAI door calls: chat and Responses, streaming
and not): an output of a constrained request whose text holds the call's closing tag followed by
the mark finishes with ``"length"`` (vLLM then keeps it, and the Responses API reports the reply
``incomplete``). The mark stays in the content. The offline ``vllm.LLM`` (``generate``, ``chat``)
runs ``LLMEngine`` instead: :func:`install_offline` wraps its ``add_request`` and ``step`` the same
way, and the general plugin installs it in every process.

The same wrappers are the door :mod:`hermes_vllm.metrics` counts at: a finished output's calls by
how each ended (``calls_total``, :func:`call_outcomes`), and a request our admission refused
(``refused_requests_total`` and its log line, with the request's id, which ``validate_params``
is not told).

vLLM's non-streaming chat path (``OpenAIServingChat.chat_completion_full_generator``) replaces the
engine's finish reason with ``"tool_calls"`` whenever the parser returned a call under
``tool_choice="auto"``, so a reply cut inside its second call claimed to have finished its calls,
while the streaming path of the same request said ``"length"``. A parser cannot reach that field,
so :func:`install` wraps the method: it notes the engine's finish reason of each choice as the
outputs stream by and puts ``"length"`` back on the choices that vLLM relabelled. Only requests
our tool parser constrained are touched (their ``vllm_xargs`` carry our key); if a vLLM version
lacks the method, nothing is patched and a warning says so.

vLLM 0.33 keeps a cut reply's ``"length"`` itself: the method maps each choice's reason through
``resolve_finish_reason``. The wrapper is installed only where vLLM still relabels, found by
asking the function the method calls about a cut reply with calls (the behaviour, not the
version number).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from hermes_vllm.budget import MARK
from hermes_vllm.constraint import has_constraint, parse_constraint
from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.metrics import CALLS, refused
from hermes_vllm.spans import split_spans
from hermes_vllm.vllm_api import touchpoints, vllm_attribute, wrap_attribute

logger = logging.getLogger(__name__)

_PATCHED = "__hermes_vllm_finish_reason__"
_RESOLVER = "resolve_finish_reason"
_SKIPPED = "hermes-vllm: %s: %s; a cut non-streaming reply keeps vLLM's finish_reason"
_REPLIES = "_hermes_vllm_replies"
_CLOSED_SKIPPED = "hermes-vllm: %s: %s; a reply holding a call the budget closed keeps its finish_reason"


def _reply(sampling_params: Any) -> _Reply | None:
    """The :class:`_Reply` of a request we constrain; ``None`` for one we do not (or one our
    admission refuses: vLLM's ``validate_params`` then raises, with the reason)."""
    extra_args = getattr(sampling_params, "extra_args", None)
    if not has_constraint(extra_args):
        return None
    try:
        request = parse_constraint(extra_args)
    except ValueError:
        return None
    if request is None:
        return None
    deltas = getattr(getattr(sampling_params, "output_kind", None), "name", "") == "DELTA"
    return _Reply(get_dialect(request.dialect), deltas)


def call_outcomes(text: str, dialect: Dialect) -> list[str]:
    """How each call in a finished reply ended (:data:`hermes_vllm.metrics.OUTCOMES`): closed by
    its tag (``complete``), closed by the budget's completer (its tag followed by :data:`MARK`:
    ``budget_closed``), or left open when the reply ended (``cut``). Tags inside reasoning spans
    are text, as the grammar reads them."""
    return [
        "cut" if not span.closed else "budget_closed" if text.startswith(MARK, span.end) else "complete"
        for span in split_spans(text, dialect, strict=True)
        if span.kind == "call"
    ]


class _Reply:
    """Follows one constrained request's outputs: an output whose text came to hold the mark of a
    call the budget closed finishes with ``"length"`` where the engine said ``"stop"``; a finished
    output's calls are counted (``calls_total``), once per output."""

    def __init__(self, dialect: Dialect, deltas: bool) -> None:
        self.dialect = dialect
        self.mark = dialect.tool_call.end + MARK
        self.deltas = deltas
        self.pieces: dict[int, list[str]] = {}
        """Per output index, the text so far (deltas only; other outputs carry it whole)."""
        self.closed: set[int] = set()
        """The output indexes whose text holds :attr:`mark`."""

    def see(self, result: Any) -> None:
        for output in result.outputs:
            index = output.index
            if self.deltas:
                self.pieces.setdefault(index, []).append(output.text)
            if output.finish_reason is None:
                continue
            text = "".join(self.pieces.pop(index, ())) if self.deltas else output.text
            if self.mark in text:
                self.closed.add(index)
            if output.finish_reason == "stop" and index in self.closed:
                output.finish_reason = "length"
                output.stop_reason = None
            for outcome in call_outcomes(text, self.dialect):
                CALLS.inc(outcome)


async def _followed(outputs: AsyncIterator[Any], reply: _Reply | None, request_id: Any) -> AsyncIterator[Any]:
    try:
        async with contextlib.aclosing(outputs):  # type: ignore[type-var]
            async for result in outputs:
                if reply is not None:
                    reply.see(result)
                yield result
    except Exception as err:
        refused(err, str(request_id))
        raise


def _wrap_generate(generate: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(generate)
    def wrapped(self: Any, prompt: Any, sampling_params: Any, *args: Any, **kwargs: Any) -> Any:
        outputs = generate(self, prompt, sampling_params, *args, **kwargs)
        if not has_constraint(getattr(sampling_params, "extra_args", None)):
            return outputs
        request_id = args[0] if args else kwargs.get("request_id")
        return _followed(outputs, _reply(sampling_params), request_id)

    return wrapped


def _wrap_add_request(add_request: Callable[..., Any]) -> Callable[..., Any]:
    """The offline engine's ``add_request``: a refusal of ours is counted and logged under the
    request's id; a constrained request's outputs are followed by the :class:`_Reply` noted under
    its id (the id its outputs carry)."""

    @functools.wraps(add_request)
    def wrapped(self: Any, request_id: str, prompt: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            added = add_request(self, request_id, prompt, params, *args, **kwargs)
        except Exception as err:
            refused(err, request_id)
            raise
        reply = _reply(getattr(prompt, "params", None) or params)
        if reply is not None:
            self.__dict__.setdefault(_REPLIES, {})[request_id] = reply
        return added

    return wrapped


def _wrap_step(step: Callable[..., Any]) -> Callable[..., Any]:
    """The offline engine's ``step``: each output of a noted request passes its :class:`_Reply`."""

    @functools.wraps(step)
    def wrapped(self: Any) -> Any:
        outputs = step(self)
        replies: dict[str, _Reply] = self.__dict__.get(_REPLIES, {})
        if replies:
            for result in outputs:
                request_id = getattr(result, "request_id", None)
                if not isinstance(request_id, str) or request_id not in replies:
                    continue
                replies[request_id].see(result)
                if getattr(result, "finished", False):
                    del replies[request_id]
        return outputs

    return wrapped


def install_offline() -> bool:
    """Wrap the offline engine (``LLMEngine``, behind ``vllm.LLM.generate`` and ``chat``) as
    :func:`install` wraps ``AsyncLLM.generate`` (idempotent; the general plugin calls it in every
    process). False where this vLLM lacks either method (a warning says so)."""
    added = wrap_attribute(touchpoints.OFFLINE_ADD, _CLOSED_SKIPPED, _wrap_add_request, _PATCHED)
    return added and wrap_attribute(touchpoints.OFFLINE_STEP, _CLOSED_SKIPPED, _wrap_step, _PATCHED)


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


def _keeps_length(method: Callable[..., Any]) -> bool:
    """Whether ``method`` reports ``"length"`` for a cut reply that carries calls.

    True when it maps the engine's reason through a ``resolve_finish_reason`` of its module that,
    asked about such a reply, answers ``"length"``; vLLM 0.32 relabels inline and has none.
    """
    code = getattr(method, "__code__", None)
    if code is None or _RESOLVER not in code.co_names:
        return False
    resolve = getattr(method, "__globals__", {}).get(_RESOLVER)
    try:
        return callable(resolve) and resolve("length", None, True) == "length"
    except (TypeError, AttributeError):  # another signature: assume it relabels, the wrapper is harmless
        return False


def install() -> bool:
    """Wrap vLLM's non-streaming chat method once per process where it relabels a cut reply, and
    the engine client's ``generate`` (idempotent).

    Returns whether the chat wrapper is in place: False where vLLM keeps ``"length"`` itself, or
    where the method is not there or has another signature (a warning then says so).
    """
    wrap_attribute(touchpoints.ASYNC_GENERATE, _CLOSED_SKIPPED, _wrap_generate, _PATCHED)
    found = vllm_attribute(touchpoints.CHAT_FULL, _SKIPPED)
    if found is None:
        return False
    serving, method = found
    if getattr(method, _PATCHED, False):
        return True
    if _keeps_length(method):
        return False
    parameters = inspect.signature(method).parameters
    if not {"request", "result_generator"} <= parameters.keys():
        logger.warning(
            _SKIPPED, touchpoints.CHAT_FULL.module, "chat_completion_full_generator has another signature"
        )
        return False
    serving.chat_completion_full_generator = _wrap(method)
    return True
