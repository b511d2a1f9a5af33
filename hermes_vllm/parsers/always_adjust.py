"""Have vLLM constrain ``tool_choice="none"`` requests even when no reasoning parser is configured.

vLLM's OpenAI server calls the parsers' ``adjust_request`` (where our tool parser hands the
constraint to the processor) for a ``tool_choice="none"`` request only when a reasoning parser
is configured or the composed parser class says ``always_adjust_request``
(``OnlineRenderer.preprocess_chat``). Without it the model could write a call into the content,
which vLLM would drop: not a schema violation, but not the guarantee either. :func:`install`
wraps ``ParserManager.get_parser`` so that the parser class it composes around one of our tool
parsers says ``always_adjust_request = True``; every other class is returned untouched. If the
vLLM version lacks the method or the switch, nothing is patched and a warning says so.

The same wrapper has a class composed around any of our parsers forward the prompt to them
(:func:`hermes_vllm.parsers.prompt_state.attach`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from hermes_vllm.parsers import prompt_state
from hermes_vllm.vllm_api import touchpoints, wrap_attribute

logger = logging.getLogger(__name__)

_PATCHED = "__hermes_vllm_always_adjust__"
MARK = "hermes_vllm_constrains_none"
"""A tool parser class attribute: true for ours, whose ``adjust_request`` must also see ``"none"``."""
_SKIPPED = "hermes-vllm: %s: %s; tool_choice='none' is constrained only with a --reasoning-parser"


def _wrap(get_parser: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(get_parser)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        parser = get_parser(*args, **kwargs)
        if parser is not None and (
            prompt_state.is_ours(parser.reasoning_parser_cls) or prompt_state.is_ours(parser.tool_parser_cls)
        ):
            prompt_state.attach(parser)
        if parser is not None and getattr(parser.tool_parser_cls, MARK, False):
            if not hasattr(parser, "always_adjust_request"):
                logger.warning(_SKIPPED, parser.__name__, "no always_adjust_request switch")
            parser.always_adjust_request = True
        return parser

    return wrapped


def install() -> bool:
    """Wrap vLLM's parser composition once per process; False if this vLLM has no such hook."""
    # get_parser is a staticmethod: it goes back as one.
    return wrap_attribute(touchpoints.GET_PARSER, _SKIPPED, _wrap, _PATCHED, static=True)
