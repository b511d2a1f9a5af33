"""The public test tools, shipped with the package: the worst-case samplers and the runner drivers
they play through (:mod:`.adversary`, :mod:`.v2_runner`, :mod:`.engine`), and the tiny-model builder
(:mod:`.tiny_model`, on the registry tokenizers of :mod:`.registry_tokenizers`) with its cache."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from hermes_vllm.testing.tiny_model import BUILD_VERSION, TokenizerName, ensure_tiny_model

CACHE_ENV = "HERMES_VLLM_TEST_CACHE"


def cache_dir() -> Path:
    """Where tiny-model builds are cached: ``$HERMES_VLLM_TEST_CACHE`` or a fixed temp dir."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "hermes-vllm-test-cache")


def tiny_model_path(tokenizer: TokenizerName = "mistral-v1") -> Path:
    """The cached tiny model for ``tokenizer``, built on first use."""
    return ensure_tiny_model(cache_dir() / f"tiny-{tokenizer}-v{BUILD_VERSION}", tokenizer)
