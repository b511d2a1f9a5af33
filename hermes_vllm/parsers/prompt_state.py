"""Show our parsers the prompt wherever vLLM's composed parser has it, streaming or not.

vLLM 0.32 hands the prompt to a reasoning parser only while streaming, and only when the prompt
has not already ended reasoning (``DelegatingParser.parse_delta`` calls
``adjust_initial_state_from_prompt``). A whole reply goes through ``Parser.set_prompt_token_ids``,
which ``DelegatingParser`` ignores, and a tool parser is never shown the prompt. Both of ours
need it where the generation prompt opens ``<think>``: the output then starts inside the span.
:func:`attach` gives the parser class vLLM composes around one of our parsers a
``set_prompt_token_ids`` and a ``parse_delta`` that forward the prompt to each of ours, once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

HOOK = "adjust_initial_state_from_prompt"
_SHOWN = "_hermes_vllm_prompt_shown"
_ATTACHED = "_hermes_vllm_prompt_attached"


def is_ours(cls: type[Any] | None) -> bool:
    """A parser class of this package; vLLM's own are left as vLLM has them."""
    return cls is not None and cls.__module__.startswith("hermes_vllm.")


def _show(parser: Any, prompt_token_ids: Sequence[int]) -> None:
    if getattr(parser, _SHOWN, False):
        return
    setattr(parser, _SHOWN, True)
    for part in (parser.reasoning_parser, parser.tool_parser):
        if part is not None and is_ours(type(part)):
            getattr(part, HOOK)(prompt_token_ids)


def attach(parser_cls: type[Any]) -> None:
    """Make ``parser_cls`` (a composed vLLM ``Parser`` subclass) show our parsers the prompt."""
    if getattr(parser_cls, _ATTACHED, False):
        return
    set_prompt: Callable[..., None] = parser_cls.set_prompt_token_ids
    parse_delta: Callable[..., Any] = parser_cls.parse_delta

    def set_prompt_token_ids(self: Any, prompt_token_ids: Sequence[int]) -> None:
        set_prompt(self, prompt_token_ids)
        _show(self, prompt_token_ids)

    def parse_delta_shown(self: Any, *args: Any, **kwargs: Any) -> Any:
        prompt = kwargs.get("prompt_token_ids", args[3] if len(args) > 3 else None)
        if prompt is not None:
            _show(self, prompt)
        return parse_delta(self, *args, **kwargs)

    parser_cls.set_prompt_token_ids = set_prompt_token_ids
    parser_cls.parse_delta = parse_delta_shown
    setattr(parser_cls, _ATTACHED, True)
