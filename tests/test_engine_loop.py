"""What the engine's loop may wait for: a hosted row's admission does its cold work (a new tool
set's preparing, its compile) before it takes the host's lock, which every hosted row's fill holds
on the scheduler's thread."""

from __future__ import annotations

import threading
import time
from typing import Any

from hermes_vllm import constraint_args
from hermes_vllm.grammar import ToolGrammarCompiler
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.processor.core import ConstraintCore

TOOL = {
    "name": "book_table",
    "parameters": {
        "type": "object",
        "properties": {"restaurant": {"type": "string"}, "guests": {"type": "integer", "minimum": 1}},
        "required": ["restaurant", "guests"],
    },
}


def test_a_hosted_admission_prepares_and_compiles_without_the_hosts_lock(tokenizer: Any) -> None:
    """While a fill holds the host's lock, a new request on vLLM's compile thread gets its tool
    set prepared and its compile started; only the row's admission itself waits for the lock
    (before, the whole cold admission ran under it and every hosted row's fill waited)."""
    from vllm import SamplingParams

    from hermes_vllm.processor.hosted import RowHost

    width = len(tokenizer)
    core = ConstraintCore(lambda: tokenizer, width)
    cache: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    core.compiler = ToolGrammarCompiler(tokenizer, vocab_size=width, cache=cache)
    host = RowHost(core, window=4)
    params = SamplingParams(max_tokens=40, extra_args=constraint_args([TOOL], "required"))
    admitted: list[Any] = []
    with host.lock:  # a fill in progress on the scheduler's thread
        admission = threading.Thread(target=lambda: admitted.append(host.grammar(params)), daemon=True)
        admission.start()
        deadline = time.monotonic() + 30
        while cache.misses == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cache.misses == 1, "the compile did not start while the lock was held"
        assert not admitted
    admission.join(30)
    assert len(admitted) == 1 and admitted[0].state.failed is None
