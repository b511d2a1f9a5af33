"""What the tool parser and the reasoning parser share: special tags, deltas from releases,
which requests carry a constraint of their client's own, and the span a prompt leaves open."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from vllm.entrypoints.generate.base.protocol import DeltaMessage, DeltaToolCall

from hermes_vllm.constraint import has_constraint, special_tags
from hermes_vllm.dialect import Dialect, TagPair, get_dialect
from hermes_vllm.parsers.span_stream import Released
from hermes_vllm.spans import open_at_end

logger = logging.getLogger(__name__)


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


def turn_text(tokenizer: Any, vocab: dict[str, int], ids: Sequence[int], dialect: Dialect) -> str:
    """The text of the last turn of ``ids`` (after the last turn marker; all of it without one).

    Decoded, so tags that are special tokens and tags that are plain text read alike.
    """
    ids = list(ids)
    marker = vocab.get(dialect.turn.begin)
    if marker in ids:
        ids = ids[len(ids) - ids[::-1].index(marker) :]
    return str(tokenizer.decode(ids))


def prompt_opened(
    tokenizer: Any, vocab: dict[str, int], prompt_ids: Sequence[int], dialect: Dialect
) -> TagPair | None:
    """The tags of the span the prompt leaves open (see :func:`~hermes_vllm.spans.open_at_end`)."""
    span = open_at_end(turn_text(tokenizer, vocab, prompt_ids, dialect), dialect)
    return None if span is None else span.tags


@functools.lru_cache(maxsize=16)
def template_opened(tokenizer: Any, dialect_name: str, enable_thinking: bool | None) -> TagPair | None:
    """The span the tokenizer's own chat template opens in its generation prompt, if any.

    The state a parser starts in until it is shown the prompt itself (vLLM shows it through
    ``adjust_initial_state_from_prompt`` and ``set_prompt_token_ids``, see
    :mod:`hermes_vllm.parsers.prompt_state`); parsers are built per request, so it is rendered
    once per tokenizer. A tokenizer without a template, or whose template wants more than one
    user message, opens nothing.
    """
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    try:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False, **kwargs
        )
    except Exception as err:  # any template error means: no generation prompt to read
        logger.debug("hermes-vllm: no generation prompt to read from the chat template: %s", err)
        return None
    span = open_at_end(prompt, get_dialect(dialect_name)) if isinstance(prompt, str) else None
    return None if span is None else span.tags
