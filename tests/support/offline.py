"""An offline vLLM engine on the tiny model with the fast, quiet CPU settings tests use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hermes_vllm.testing.engine import CPU_ENV


def offline_llm(model: Path | str, **overrides: Any) -> Any:
    """``vllm.LLM`` on ``model`` with a 64 MiB KV cache; ``overrides`` go to ``LLM(...)``."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    from vllm import LLM

    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": True,
        "kv_cache_memory_bytes": 64 << 20,
        "distributed_executor_backend": "uni",
        "max_model_len": 2048,
        "seed": 0,
    }
    kwargs.update(overrides)
    return LLM(model=str(model), **kwargs)
