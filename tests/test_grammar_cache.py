"""The compiled-grammar cache: byte bound, LRU order, one compile for identical concurrent requests,
failures cached, and the compile timeout turned into a readable error."""

from __future__ import annotations

import copy
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from hermes_vllm.constraint import constraint_args, parse_constraint
from hermes_vllm.grammar import GrammarCompileError, ToolGrammarCompiler
from hermes_vllm.grammar.cache import GrammarCache
from hermes_vllm.grammar.compiler import PreparedTurn, prepare_constraint
from hermes_vllm.settings import Limits


def tool(name: str, props: int = 1) -> dict[str, Any]:
    properties = {f"p{i}": {"type": "integer"} for i in range(props)}
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": properties}},
    }


def test_identical_concurrent_compiles_run_once() -> None:
    calls = []
    release = threading.Event()

    def compile_fn() -> str:
        calls.append(1)
        release.wait(5)
        return "grammar"

    cache: GrammarCache[str] = GrammarCache(1 << 20, threads=2, size_of=len)
    futures = [cache.get("same", compile_fn) for _ in range(8)]
    release.set()
    assert {f.result(5) for f in futures} == {"grammar"}
    assert len(calls) == 1 and cache.misses == 1 and cache.hits == 7


def test_byte_bound_evicts_least_recently_used() -> None:
    cache: GrammarCache[str] = GrammarCache(max_bytes=10, threads=1, size_of=len)
    for key in ("a", "b"):
        cache.get(key, lambda k=key: k * 4).result(5)  # 4 bytes each
    cache.get("a", lambda: "unused").result(5)  # touch a: b is now the oldest
    cache.get("c", lambda: "cccc").result(5)
    time.sleep(0.05)  # the done-callback runs on the pool thread
    assert cache.bytes <= 10 and len(cache) == 2
    assert cache.get("a", lambda: "recompiled").result(5) == "aaaa"
    assert cache.get("b", lambda: "recompiled").result(5) == "recompiled"


def test_failures_are_cached_too() -> None:
    calls = []

    def broken() -> str:
        calls.append(1)
        raise ValueError("no")

    cache: GrammarCache[str] = GrammarCache(1 << 20, threads=1, size_of=len)
    first: Future[str] = cache.get("k", broken)
    with pytest.raises(ValueError):
        first.result(5)
    time.sleep(0.05)
    with pytest.raises(ValueError):
        cache.get("k", broken).result(5)
    assert len(calls) == 1


def test_compiler_shares_the_cache_and_times_out_readably(tokenizer: Any) -> None:
    limits = Limits(compile_timeout_s=0.0)
    cache: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    compiler = ToolGrammarCompiler(tokenizer, limits=limits, cache=cache)
    with pytest.raises(GrammarCompileError, match="longer than 0 s"):
        compiler.compile([tool("slow", 40)])
    patient = ToolGrammarCompiler(tokenizer, cache=cache)
    first = patient.compile([tool("t")])
    second = patient.compile([tool("t")])
    assert first.grammar is second.grammar, "an identical tool set must come from the cache"
    other = patient.compile([tool("t")], tool_choice="required")
    assert other.grammar is not first.grammar, "tool_choice is part of the key"


def test_tokenizers_differing_only_in_special_tags_share_no_grammar(tiny_model: Any) -> None:
    """Hermes 2 Pro has its call tags as plain added tokens, Hermes 3 as special ones: the same
    strings and ids, detokenized differently, so the fingerprint must tell them apart."""
    from tokenizers import AddedToken
    from transformers import AutoTokenizer

    from hermes_vllm.dialect import get_dialect

    plain = AutoTokenizer.from_pretrained(str(tiny_model))
    special = AutoTokenizer.from_pretrained(str(tiny_model))
    tags = get_dialect("hermes").added_tokens
    special.add_special_tokens(
        {"additional_special_tokens": [AddedToken(t, special=True, normalized=False) for t in tags]},
        replace_extra_special_tokens=False,
    )
    assert special.get_vocab() == plain.get_vocab()
    assert set(tags) <= set(special.all_special_tokens) and not set(tags) & set(plain.all_special_tokens)
    cache: GrammarCache[Any] = GrammarCache(64 << 20, threads=1, size_of=lambda g: g.memory_bytes)
    for tok in (plain, special):
        compiler = ToolGrammarCompiler(tok, cache=cache)
        compiler.compile([tool("t")])
    assert cache.misses == 2 and cache.hits == 0


def test_a_tool_set_prepared_before_is_not_normalised_again(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Agents resend their tools every turn: an equal constraint (as the request's JSON, decoded
    once at admission) reuses the prepared turn and its grammar."""
    import hermes_vllm.grammar.compiler as compiler_module

    calls = []
    normalize = compiler_module.read_tools

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return normalize(*args, **kwargs)

    monkeypatch.setattr(compiler_module, "read_tools", counting)
    compiler = ToolGrammarCompiler(tokenizer)
    engine, limits = type(compiler.engine), compiler.limits

    def prepared(tools: list[dict[str, Any]], choice: str = "auto") -> PreparedTurn:
        request = parse_constraint(constraint_args(tools, choice))
        assert request is not None
        return prepare_constraint(request, engine, limits, admitted=True)

    tools = [tool("prepared_once", 3)]
    first = prepared(tools)
    again = prepared(copy.deepcopy(tools))
    assert len(calls) == 1 and again is first
    compile_ = compiler.submit(first)
    assert compiler.submit(again) is compile_
    compiler.result(first, compile_)  # not left running at exit
    prepared(tools, "required")
    changed = copy.deepcopy(tools)
    changed[0]["function"]["parameters"]["properties"]["p0"]["type"] = "string"
    assert prepared(changed) != first
    assert len(calls) == 3, "tool_choice and the schemas are part of the key"
