"""Check a rendered prompt the way the model will see it: as token ids, not as text.

Counting substrings would miss the point of injection safety: what matters is how many real
turn-marker tokens the tokenizer produces when it encodes the text with special tokens enabled,
as vLLM does with a rendered chat template.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypedDict

from hermes_vllm.dialect import Dialect, get_dialect
from hermes_vllm.formats.escape import escapable, escaped_strings


class TokenReport(TypedDict):
    total_tokens: int
    im_start_count: int
    im_end_count: int
    balanced: bool
    open_turn: str | None
    """Role of a final turn left open (``"assistant"`` after a generation prompt), else None."""
    control_tokens: dict[str, int]
    """Each added or special token of the tokenizer found in the prompt, and how often: what the
    rendering put there (turn markers, tags) and nothing a message could spell."""


def control_tokens(tokenizer: Any) -> dict[int, str]:
    """Every token id the tokenizer gives to an added or special token, with its text.

    Text spelling one of these becomes that token when vLLM encodes a rendered prompt.
    """
    decoder = getattr(tokenizer, "added_tokens_decoder", {})
    out = {int(i): str(getattr(t, "content", t)) for i, t in decoder.items()}
    for token in getattr(tokenizer, "all_special_tokens", ()):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int):
            out.setdefault(token_id, token)
    return out


def reserve_tokens(dialect: str | Dialect, tokenizer: Any) -> Dialect:
    """``dialect``, also escaping each string ``tokenizer`` turns into an added or special token.

    The shipped template knows every dialect's tags but no tokenizer (``</s>``, ``[INST]``); render
    with this dialect (``build_hermes_prompt``, ``chat_template``, ``hermes-vllm template
    --tokenizer``) so that no message can spell one of them either. Strings the escape cannot break
    (one character, or overlapping themselves) are left out.
    """
    d = get_dialect(dialect)
    known = set(escaped_strings(d))
    extra = sorted(s for s in set(control_tokens(tokenizer).values()) if s not in known and escapable(s))
    return dataclasses.replace(d, reserved=(*d.reserved, *extra))


def special_token_id(tokenizer: Any, token: str) -> int:
    """The id of ``token`` as one special token; ``ValueError`` if the tokenizer lacks it."""
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise ValueError(f"tokenizer has no single token for {token!r} (encodes to {ids})")
    return int(ids[0])


def validate_prompt_tokens(prompt: str, tokenizer: Any, dialect: str | Dialect = "hermes") -> TokenReport:
    """Token report of ``prompt`` (no BOS added) for a Hugging Face tokenizer."""
    d = get_dialect(dialect)
    start_id = special_token_id(tokenizer, d.turn.begin)
    end_id = special_token_id(tokenizer, d.turn.end)
    ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=False)]
    starts = [i for i, t in enumerate(ids) if t == start_id]
    open_turn = None
    if starts and end_id not in ids[starts[-1] :]:
        header = tokenizer.decode(ids[starts[-1] + 1 :])
        open_turn = header.split("\n", 1)[0].strip()
    im_end_count = ids.count(end_id)
    controls = control_tokens(tokenizer)
    found: dict[str, int] = {}
    for token_id in ids:
        if token_id in controls:
            found[controls[token_id]] = found.get(controls[token_id], 0) + 1
    return {
        "total_tokens": len(ids),
        "im_start_count": len(starts),
        "im_end_count": im_end_count,
        "balanced": len(starts) == im_end_count,
        "open_turn": open_turn,
        "control_tokens": found,
    }
