"""Check a rendered prompt the way the model will see it: as token ids, not as text.

Counting substrings would miss the point of injection safety: what matters is how many real
turn-marker tokens the tokenizer produces when it encodes the text with special tokens enabled,
as vLLM does with a rendered chat template.
"""

from __future__ import annotations

from typing import Any, TypedDict

from hermes_vllm.dialect import Dialect, get_dialect


class TokenReport(TypedDict):
    total_tokens: int
    im_start_count: int
    im_end_count: int
    balanced: bool
    open_turn: str | None
    """Role of a final turn left open (``"assistant"`` after a generation prompt), else None."""


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
    return {
        "total_tokens": len(ids),
        "im_start_count": len(starts),
        "im_end_count": im_end_count,
        "balanced": len(starts) == im_end_count,
        "open_turn": open_turn,
    }
