"""Build a tiny random-weight Llama with a real ChatML tokenizer, for tests and the demo.

No model hub is needed: the tokenizers ship inside ``mistral_common`` (a vLLM dependency).
``mistral-v1`` is the 32k SentencePiece vocabulary Hermes 2 Pro was trained on; ``tekken``
is the 131k byte-level BPE. A random model emits garbage, which is exactly what proves that
the tool-call constraint, not the model, makes every call valid.

Usage: ``python -m hermes_vllm.testing.tiny_model OUT [--tokenizer mistral-v1|tekken]``
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from hermes_vllm.dialect import get_dialect

logger = logging.getLogger(__name__)

TokenizerName = Literal["mistral-v1", "tekken"]
_TOKENIZER_FILES: dict[str, tuple[str, str]] = {
    "mistral-v1": ("tokenizer.model.v1", "tokenizer.model"),
    "tekken": ("tekken_240911.json", "tekken.json"),
}
# Bump when the layout below changes, so cached builds are rebuilt.
BUILD_VERSION = 3


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

    src_name, dst_name = _TOKENIZER_FILES[name]
    data = resources.files("mistral_common").joinpath("data", src_name)
    workdir.mkdir(parents=True, exist_ok=True)
    with resources.as_file(data) as src:
        shutil.copyfile(src, workdir / dst_name)
    if name == "mistral-v1":
        return LlamaTokenizerFast.from_pretrained(str(workdir))
    return AutoTokenizer.from_pretrained(str(workdir))


def build_tiny_model(
    out: Path,
    tokenizer: TokenizerName = "mistral-v1",
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 0,
) -> Path:
    """Write a loadable tiny Llama + ChatML tokenizer to ``out`` and return it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hermes_vllm.formats.chat_template import chat_template

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_base_tokenizer(tokenizer, out / "_base_tokenizer")
    special, plain = chatml_added_tokens()
    tok.add_special_tokens({"additional_special_tokens": special})
    tok.add_tokens(plain, special_tokens=False)
    tok.eos_token = special[1]
    tok.pad_token = special[1]
    tok.chat_template = chat_template("hermes")
    tok.save_pretrained(str(out))
    shutil.rmtree(out / "_base_tokenizer")

    vocab_size = len(tok)
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
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "hermes_vllm_build.json").write_text(
        json.dumps({"version": BUILD_VERSION, "tokenizer": tokenizer, "seed": seed}), encoding="utf-8"
    )
    logger.info("tiny model (%s, vocab %d) written to %s", tokenizer, vocab_size, out)
    return out


def is_built(out: Path, tokenizer: TokenizerName = "mistral-v1") -> bool:
    """Whether ``out`` holds a complete build of the current layout for ``tokenizer``."""
    marker = Path(out) / "hermes_vllm_build.json"
    if not marker.is_file():
        return False
    meta = json.loads(marker.read_text(encoding="utf-8"))
    return bool(meta.get("version") == BUILD_VERSION and meta.get("tokenizer") == tokenizer)


def ensure_tiny_model(out: Path, tokenizer: TokenizerName = "mistral-v1") -> Path:
    """Build the tiny model into ``out`` unless a current build is already there."""
    if not is_built(out, tokenizer):
        build_tiny_model(out, tokenizer)
    return Path(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--tokenizer", choices=sorted(_TOKENIZER_FILES), default="mistral-v1")
    parser.add_argument("--force", action="store_true", help="rebuild even if a current build exists")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.force or not is_built(args.out, args.tokenizer):
        build_tiny_model(args.out, args.tokenizer)
    else:
        logger.info("tiny model already built at %s", args.out)


if __name__ == "__main__":
    main()
