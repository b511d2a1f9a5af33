"""Constrained tool calls under speculative decoding, through vLLM's own structured outputs.

With a speculative config the V1 runner builds no entry-point logits processor, and Model Runner
V2 runs one on every draft row with the unverified drafts as input and no word of which were
accepted. vLLM's structured outputs, on the other hand, constrain drafts on both runners, in the
scheduler: drafts are cut to their grammar-valid prefix, one mask row is filled per draft position
plus the bonus row, and the grammar is rolled back to what was accepted. So a constrained request
is made a structured-output request whose grammar is our row
(:class:`~hermes_vllm.processor.hosted.HostedGrammar`):

- the frontend (``validate_params``, once the engine announced itself as ``"speculative"``) gives
  the request the marker ``structured_outputs`` :data:`MARKER`;
- in the engine process, four methods of ``StructuredOutputManager`` are wrapped
  (:func:`install`, from the general plugin): ``__init__`` announces the engine when a
  speculative config is set; ``grammar_init`` gives a marked request vLLM's configured backend
  (vLLM keeps one backend per engine, and it still allocates the bitmask) and tells it the
  request's reasoning is ours to read (our turn grammar covers reasoning spans and their budget,
  so vLLM's reasoning gate must not hold the grammar back until ``</think>``);
  ``_create_grammar`` builds our grammar for a marked request; ``grammar_bitmask`` (the step's
  masks) is timed for the step metrics where it fills hosted rows.

vLLM offers no hook for this; each target is looked up by name, and where one is missing nothing
is patched and constrained requests are refused under speculative decoding, naming what this vLLM
lacks. Requests without our constraint never reach our code.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hermes_vllm.constraint import has_constraint
from hermes_vllm.processor import forced_drafts
from hermes_vllm.vllm_api import TouchPoint, touchpoints, vllm_attribute

if TYPE_CHECKING:
    from vllm.sampling_params import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

logger = logging.getLogger(__name__)

RUNNER = "speculative"
"""The handshake name of an engine that constrains through its structured outputs."""
MARKER = "hermes-vllm tool-call constraint"
"""The one choice of the marker ``structured_outputs``; never compiled by a vLLM backend."""

_PATCHED = "__hermes_vllm_speculative__"
_HOST = "_hermes_vllm_host"
_SKIPPED = "hermes-vllm: %s: %s; constrained requests are refused under speculative decoding"
_lock = threading.Lock()
_missing: str | None = None


def route(params: SamplingParams) -> None:
    """Frontend: make a constrained request a structured-output request our grammar serves.

    Admission refused any other structured outputs already (a ``response_format`` beside tools
    is in the turn grammar by then), so the request holds none or the marker itself."""
    from vllm.sampling_params import StructuredOutputsParams

    if params.structured_outputs is None:
        params.structured_outputs = StructuredOutputsParams(choice=[MARKER])


def _is_marker(outputs: Any) -> bool:
    """The marker, also as vLLM rewrites it when a params object is sent again (its xgrammar
    check turns a ``choice`` into the equivalent ``grammar``)."""
    grammar = outputs.grammar
    return bool(outputs.choice == [MARKER] or (isinstance(grammar, str) and MARKER in grammar))


def is_marked(params: SamplingParams | None) -> bool:
    """Whether the request was routed by :func:`route` and carries our constraint."""
    outputs = params.structured_outputs if params is not None else None
    return outputs is not None and _is_marker(outputs) and has_constraint(params.extra_args)  # type: ignore[union-attr]


def missing() -> str | None:
    """What this vLLM lacks for :func:`install`, named with its version; ``None`` when installed."""
    return _missing


def host(manager: Any) -> RowHost:
    """The :class:`RowHost` of a ``StructuredOutputManager`` (one core per engine process, built
    on first use); ``benchmarks/specdec.py`` replays outputs through it."""
    from hermes_vllm.processor.config import new_core
    from hermes_vllm.processor.hosted import RowHost

    with _lock:
        found: RowHost | None = getattr(manager, _HOST, None)
        if found is None:
            config = manager.vllm_config
            found = RowHost(new_core(config, pin_memory=False), config.num_speculative_tokens + 1)
            setattr(manager, _HOST, found)
        return found


def _served_backend(vllm_config: Any) -> str:
    backend = str(vllm_config.structured_outputs_config.backend)
    return "xgrammar" if backend == "auto" else backend


def _wrap_init(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def __init__(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        method(self, vllm_config, *args, **kwargs)
        if vllm_config.speculative_config is not None and not vllm_config.model_config.skip_tokenizer_init:
            from hermes_vllm.processor.config import announce_active

            announce_active(vllm_config, RUNNER)
            host(self)  # the core and its tables built at start-up, not on a first request
            logger.info("hermes-vllm tool-call constraints active (speculative decoding, structured outputs)")

    return __init__


def _wrap_grammar_init(method: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(method)
    def grammar_init(self: Any, request: Any) -> None:
        if request.structured_output_request is not None and is_marked(request.sampling_params):
            outputs = request.sampling_params.structured_outputs
            if outputs._backend is None:
                outputs._backend = _served_backend(self.vllm_config)
            request.structured_output_request.reasoning_ended = True
        method(self, request)

    return grammar_init


def _wrap_create(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def _create_grammar(self: Any, request: Any) -> Any:
        if not is_marked(request.sampling_params):
            return method(self, request)
        return host(self).grammar(request.sampling_params)

    return _create_grammar


def _wrap_bitmask(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def grammar_bitmask(self: Any, *args: Any, **kwargs: Any) -> Any:
        found: RowHost | None = getattr(self, _HOST, None)
        if found is None:
            return method(self, *args, **kwargs)
        with found.step():
            return method(self, *args, **kwargs)

    return grammar_bitmask


_WRAPPERS: dict[TouchPoint, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    touchpoints.MANAGER_INIT: _wrap_init,
    touchpoints.MANAGER_GRAMMAR_INIT: _wrap_grammar_init,
    touchpoints.MANAGER_CREATE: _wrap_create,
    touchpoints.MANAGER_BITMASK: _wrap_bitmask,
}


def install() -> bool:
    """Wrap the manager's methods once per process (idempotent); False where a target is missing."""
    global _missing
    found = {}
    for point in _WRAPPERS:
        target = vllm_attribute(point, _SKIPPED)
        if target is None:
            import vllm

            _missing = f"vLLM {vllm.__version__} has no {point.module}.{'.'.join(point.path)}"
            return False
        found[point] = target
    for point, (cls, method) in found.items():
        if not getattr(method, _PATCHED, False):
            wrapped = _WRAPPERS[point](method)
            setattr(wrapped, _PATCHED, True)
            setattr(cls, point.path[-1], wrapped)
    _missing = None
    forced_drafts.install()  # it asks Limits.grammar_drafts at every step
    return True
