"""vLLM's engine config on the tiny model with the fast, quiet CPU settings, for the runner drivers."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# Single-threaded, in-process, eager float32: the quickest start on the tiny model.
CPU_ENV = {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


def engine_config(model: Path | str) -> Any:
    """vLLM's engine config for ``model`` (float32, eager, a 64 MiB KV cache), as the runner adapters
    are built from it (tests and ``benchmarks/v2_slots.py`` drive the adapters without an engine)."""
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    from vllm.engine.arg_utils import EngineArgs

    args = EngineArgs(
        model=str(model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        kv_cache_memory_bytes=64 << 20,
    )
    with triton_assumed():
        return args.create_engine_config()


@contextmanager
def triton_assumed() -> Iterator[None]:
    """vLLM 0.34's CPU platform refuses an x86 config without Triton, and its CPU worker gives
    Model Runner V2 host buffers only where Triton is (its runner's kernels need triton-cpu,
    which no registry has). Tests that build a config or the runner's buffers only to drive the
    adapters run no kernel, so vLLM is told Triton is there while they are made."""
    try:
        import vllm.triton_utils as triton_utils
    except ImportError:
        yield
        return
    had = triton_utils.HAS_TRITON
    loaded = set(sys.modules)
    triton_utils.HAS_TRITON = True
    try:
        yield
    finally:
        triton_utils.HAS_TRITON = had
        # A vLLM module first imported meanwhile copied the flag (``from vllm.triton_utils import
        # HAS_TRITON``): left so, a later engine in the process takes Triton for there and fails.
        for name in set(sys.modules) - loaded:
            module = sys.modules[name]
            if name.split(".")[0] == "vllm" and getattr(module, "HAS_TRITON", had) is not had:
                setattr(module, "HAS_TRITON", had)  # noqa: B010 (mypy knows no such attribute)
