"""What the tool parser and the reasoning parser share: special tags, deltas from releases, and
which requests carry a constraint of their client's own."""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage, DeltaToolCall

from hermes_vllm.constraint import has_constraint, special_tags
from hermes_vllm.dialect import Dialect
from hermes_vllm.parsers.span_stream import Released


def keep_special_tags(request: Any, tokenizer: Any, dialect: Dialect) -> None:
    """Set ``skip_special_tokens=False`` on ``request`` if one of the tags is a special token.

    Otherwise the detokenizer would drop the tags and the parsers could not find the spans.
    Tags that are plain added tokens (as in Hermes 2 Pro) survive detokenization either way, and
    the request keeps its own setting: ``True`` by default in vLLM 0.32, ``None`` in 0.33, which
    ``to_sampling_params`` resolves to the model's default (skipping, unless its generation config
    says otherwise).
    """
    if special_tags(tokenizer, dialect):
        request.skip_special_tokens = False


def delta_message(released: Released, tool_calls: list[DeltaToolCall] | None = None) -> DeltaMessage | None:
    """A stream delta of what was released, ``None`` when nothing was."""
    if not (released.content or released.reasoning or tool_calls):
        return None
    return DeltaMessage(
        content=released.content or None, reasoning=released.reasoning or None, tool_calls=tool_calls or []
    )


def own_constraint(request: Any) -> bool:
    """A request without tools that carries its own constraint in ``vllm_xargs``.

    Its client built the constraint (in any dialect: the bracket one on a hermes server, say) and
    reads the text itself, so the call markup is left in the content, as written: read in the
    server's dialect, a hermes tag the model wrote inside a bracket call's string cut that
    content short. vLLM hands such a request to the tool parser as ``tool_choice="none"``.
    """
    return not getattr(request, "tools", None) and has_constraint(getattr(request, "vllm_xargs", None))
