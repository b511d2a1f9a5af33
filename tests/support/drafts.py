"""What the speculative-decoding tests and benchmark share: the ngram drafts and a prompt to copy
calls from (greedy sampling on it makes the proposer draft whole calls, and the target accept them)."""

from __future__ import annotations

from typing import Any

NGRAM: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
"""``speculative_config`` of the tests (``json.dumps`` it for ``--speculative-config``)."""

CALL = '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>'

COPYABLE_PROMPT = (
    "<|im_start|>system\nYou call tools. Examples: " + " ".join([CALL] * 4) + "<|im_end|>\n"
    "<|im_start|>user\nPlease help.<|im_end|>\n<|im_start|>assistant\n"
)
"""A raw ChatML prompt holding :data:`CALL` four times (raw: chat messages would be escaped)."""
