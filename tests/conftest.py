"""Shared fixtures: one tiny-model build per tokenizer, cached across sessions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm.testing import tiny_model_path


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files that start vLLM servers or engines first, the rest after them, most tests first.

    ``make test`` runs ``--dist loadfile --no-loadscope-reorder``: a file stays on one worker and
    the workers take files in this order. xdist's own order (most tests first) put the files with a
    few slow server tests last, so one of them ran alone at the end while the other worker idled;
    started first, they overlap, and the many quick engine-free files fill the tail. The sort is
    stable: the order inside a file (its module-scoped servers grouped) is left as it is.
    """
    heavy = Counter(
        item.path for item in items if item.get_closest_marker("server") or item.get_closest_marker("engine")
    )
    tests = Counter(item.path for item in items)
    items.sort(key=lambda item: (-heavy[item.path], -tests[item.path], str(item.path)))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """Tiny random Llama with the 32k Mistral v1 (Hermes 2 Pro base) tokenizer + ChatML tokens."""
    return tiny_model_path("mistral-v1")


@pytest.fixture(scope="session")
def tiny_model_131k() -> Path:
    """Tiny random Llama with the 131k tekken tokenizer + ChatML tokens."""
    return tiny_model_path("tekken")


@pytest.fixture(scope="session")
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model))


@pytest.fixture(scope="session")
def tokenizer_131k(tiny_model_131k: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_131k))


@pytest.fixture(scope="session", params=["mistral-v1", "tekken"])
def any_tokenizer(request: pytest.FixtureRequest) -> Any:
    """Both shipped tokenizers, for tests that must hold on each."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_model_path(request.param)))


@pytest.fixture(scope="session", params=["mistral-v1", "tekken"])
def vllm_tokenizer(request: pytest.FixtureRequest) -> Any:
    """Both shipped tokenizers as vLLM's server loads them (vocab and special tokens cached)."""
    from vllm.tokenizers import get_tokenizer

    return get_tokenizer(str(tiny_model_path(request.param)))


@pytest.fixture(scope="session")
def tiny_model_qwen3() -> Path:
    """Tiny random Llama with Qwen 3's tokenizer and chat template, 151,936-wide logits."""
    return tiny_model_path("qwen3")


@pytest.fixture(scope="session")
def tiny_model_qwen25() -> Path:
    """Tiny random Llama with Qwen 2.5's tokenizer (our ``qwen`` template), 151,936-wide logits."""
    return tiny_model_path("qwen2.5")


@pytest.fixture(scope="session")
def tiny_model_llama31() -> Path:
    """Tiny random Llama with Llama 3.1's tokenizer, Hermes 3's tags on special slots (unverified)."""
    return tiny_model_path("llama3.1")


@pytest.fixture(scope="session")
def vllm_config(tiny_model: Path) -> Any:
    """vLLM's engine config for the tiny model, as the runner adapters are built from it."""
    from hermes_vllm.testing.engine import engine_config

    return engine_config(tiny_model)
