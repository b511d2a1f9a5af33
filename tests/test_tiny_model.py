"""The tiny models on real families' tokenizers: their tags, templates and padded logits."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm.formats.chat_template import chat_template
from hermes_vllm.testing import tiny_model
from hermes_vllm.testing.registry_tokenizers import (
    LLAMA3_PATTERN,
    LLAMA_WHEEL,
    qwen3_chat_template,
    wheel_member,
)
from hermes_vllm.testing.tiny_model import main


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_qwen3_has_its_tags_and_its_own_template(tiny_model_qwen3: Path) -> None:
    tok = _tokenizer(tiny_model_qwen3)
    assert len(tok) == 151669
    ids = tok.convert_tokens_to_ids(["<tool_call>", "</tool_call>", "<think>", "</think>", "<|im_end|>"])
    assert ids == [151657, 151658, 151667, 151668, 151645]
    assert {"<|im_start|>", "<|im_end|>"} <= set(tok.all_special_tokens)
    assert not {"<tool_call>", "</tool_call>", "<think>", "</think>"} & set(tok.all_special_tokens)
    assert tok.eos_token == "<|im_end|>"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_qwen25_lacks_qwen3s_four_tokens(tiny_model_qwen25: Path) -> None:
    tok = _tokenizer(tiny_model_qwen25)
    assert len(tok) == 151665
    assert tok.convert_tokens_to_ids("<tool_call>") == 151657
    assert len(tok("<think>", add_special_tokens=False).input_ids) > 1
    # Qwen 2.5's own template is in no pinned package: ours for the qwen dialect, not Qwen 3's.
    assert tok.chat_template == chat_template("qwen") != qwen3_chat_template()


def test_llama31_tags_are_special_tokens_and_text_encodes_as_tiktoken(tiny_model_llama31: Path) -> None:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    tok = _tokenizer(tiny_model_llama31)
    assert len(tok) == 128256
    tags = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]
    assert all(128012 <= i < 128256 for i in tok.convert_tokens_to_ids(tags))
    assert set(tags) <= set(tok.all_special_tokens)
    text = "Der Fuchs 12345 springt über  den Hund!!\n\n\tdef f(x):\n\treturn x**2  # 日本語"
    ids = tok(text).input_ids
    assert ids[0] == tok.convert_tokens_to_ids("<|begin_of_text|>")
    ranks_file = Path(tok.name_or_path) / "_ranks"
    ranks_file.write_bytes(wheel_member(LLAMA_WHEEL, "llama_models/llama3/tokenizer.model"))
    try:
        meta = tiktoken.Encoding(
            "llama3",
            pat_str=LLAMA3_PATTERN,
            mergeable_ranks=load_tiktoken_bpe(str(ranks_file)),
            special_tokens={},
        )
    finally:
        ranks_file.unlink()
    assert ids[1:] == meta.encode(text)


@pytest.mark.parametrize("name", ["qwen3", "qwen2.5"])
def test_padding_ids_get_no_probability(name: str) -> None:
    """Qwen's head is 151,936 wide; ids past the tokenizer must never be sampled."""
    import torch
    from transformers import LlamaForCausalLM

    from hermes_vllm.testing import tiny_model_path

    path = tiny_model_path(name)  # type: ignore[arg-type]
    tokens = len(_tokenizer(path))
    model = LlamaForCausalLM.from_pretrained(str(path))
    assert model.config.vocab_size == 151936 > tokens
    torch.manual_seed(1)
    with torch.no_grad():
        logits = model(torch.randint(0, tokens, (4, 96))).logits
    assert logits[..., tokens:].max() < logits[..., :tokens].min() - 1000
    assert torch.softmax(logits, dim=-1)[..., tokens:].max() == 0


def test_cli_builds_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="hermes_vllm.testing.tiny_model")
    main([str(tmp_path), "--tokenizer", "qwen3"])
    assert (tmp_path / "model.safetensors").is_file()
    main([str(tmp_path), "--tokenizer", "qwen3"])
    assert "already built" in caplog.text


def _fake_build(path: Path, tokenizer: str, *, seed: int = 0) -> Path:
    """What ``is_built`` reads, without the model (the test is about where the build goes)."""
    path.mkdir(parents=True)
    meta = {"version": tiny_model.BUILD_VERSION, "tokenizer": tokenizer, "seed": seed}
    (path / "hermes_vllm_build.json").write_text(json.dumps(meta), encoding="utf-8")
    return path


def test_a_build_is_published_whole_and_a_concurrent_one_wins_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pytest -n 2`` on a clean machine: both workers build the same model at once. Neither may
    write where the other reads, and the one that finishes second keeps the first one's build."""
    out, raced_out = tmp_path / "tiny", tmp_path / "tiny-raced"

    def first(path: Path, tokenizer: str) -> Path:
        assert path != out and not out.exists(), "the build must not be written where readers look"
        return _fake_build(path, tokenizer)

    monkeypatch.setattr(tiny_model, "build_tiny_model", first)
    assert tiny_model.ensure_tiny_model(out, "mistral-v1") == out and tiny_model.is_built(out, "mistral-v1")

    def raced(path: Path, tokenizer: str) -> Path:
        _fake_build(tmp_path / "rival", tokenizer, seed=1).rename(raced_out)  # the other worker's, first
        return _fake_build(path, tokenizer)

    monkeypatch.setattr(tiny_model, "build_tiny_model", raced)
    assert tiny_model.ensure_tiny_model(raced_out, "mistral-v1") == raced_out
    assert json.loads((raced_out / "hermes_vllm_build.json").read_text())["seed"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["tiny", "tiny-raced"], "staging folders are removed"
