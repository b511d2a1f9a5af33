"""The corpora come from pinned registry files: a fresh machine needs no copy beside the checkout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hermes_vllm.testing.artifacts import ARTIFACT_CACHE_ENV, ArtifactError, fetch
from hermes_vllm.testing.corpus import (
    BFCL_FILES,
    BFCL_WHEEL,
    CORPUS_ENV,
    SUITE_DRAFT,
    CorpusMissing,
    corpus_dir,
    load_bfcl,
    registry_corpus,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


def test_the_registry_corpus_has_every_file_the_tests_read() -> None:
    root = registry_corpus()
    for name in BFCL_FILES:
        cases = load_bfcl(root / "bfcl" / name)
        assert cases and all(c.ground_truth is not None for c in cases), name
    suite = sorted((root / "json-schema-test-suite" / "tests" / SUITE_DRAFT).glob("*.json"))
    assert len(suite) >= 40 and any(p.name == "properties.json" for p in suite)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no copy beside the checkout to compare with")
def test_the_registry_corpus_holds_the_shared_copys_files() -> None:
    """BFCL byte for byte; the suite's keyword files by name (the sdist pins an older revision)."""
    root = registry_corpus()
    for name in BFCL_FILES:
        for rel in (Path("bfcl") / name, Path("bfcl") / "possible_answer" / name):
            assert (root / rel).read_bytes() == (SHARED / rel).read_bytes(), rel
    suite = Path("json-schema-test-suite") / "tests" / SUITE_DRAFT
    assert {p.name for p in (root / suite).glob("*.json")} == {
        p.name for p in (SHARED / suite).glob("*.json")
    }


def test_the_corpus_is_the_registry_one_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(CORPUS_ENV, raising=False)
    assert corpus_dir() == registry_corpus()
    monkeypatch.setenv(CORPUS_ENV, str(tmp_path))
    assert corpus_dir() == tmp_path
    monkeypatch.setenv(CORPUS_ENV, str(tmp_path / "absent"))
    with pytest.raises(CorpusMissing, match=CORPUS_ENV):
        corpus_dir()


def test_a_file_that_differs_from_its_pin_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ARTIFACT_CACHE_ENV, str(tmp_path))
    wrong = dataclasses.replace(BFCL_WHEEL, sha256="0" * 64)
    with pytest.raises(ArtifactError, match="does not match the pinned"):
        fetch(wrong)
    assert not (tmp_path / "files" / BFCL_WHEEL.filename).exists()
