"""The corpora come from pinned registry files: a fresh machine needs no copy beside the checkout."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.corpus import (
    CORPUS_ENV,
    SUITE_DRAFT,
    CorpusMissing,
    bfcl_dir,
    load_bfcl,
    registry_suite,
    suite_dir,
)

from hermes_vllm.demo.bfcl import BFCL_FILES, BFCL_WHEEL, registry_bfcl
from hermes_vllm.testing.artifacts import ARTIFACT_CACHE_ENV, ArtifactError, fetch

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


def test_the_registry_corpus_has_every_file_the_tests_read() -> None:
    for name in BFCL_FILES:
        cases = load_bfcl(registry_bfcl() / name)
        assert cases and all(c.ground_truth is not None for c in cases), name
    suite = sorted(registry_suite().glob("*.json"))
    assert len(suite) >= 40 and any(p.name == "properties.json" for p in suite)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no copy beside the checkout to compare with")
def test_the_registry_corpus_holds_the_shared_copys_files() -> None:
    """BFCL byte for byte; the suite's keyword files by name (the sdist pins an older revision)."""
    for name in BFCL_FILES:
        for rel in (Path(name), Path("possible_answer") / name):
            assert (registry_bfcl() / rel).read_bytes() == (SHARED / "bfcl" / rel).read_bytes(), rel
    shared_suite = SHARED / "json-schema-test-suite" / "tests" / SUITE_DRAFT
    assert {p.name for p in registry_suite().glob("*.json")} == {p.name for p in shared_suite.glob("*.json")}


def test_the_corpus_is_the_registry_one_unless_the_environment_names_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(CORPUS_ENV, raising=False)
    assert (bfcl_dir(), suite_dir()) == (registry_bfcl(), registry_suite())
    monkeypatch.setenv(CORPUS_ENV, str(tmp_path))
    assert bfcl_dir() == tmp_path / "bfcl"
    assert suite_dir() == tmp_path / "json-schema-test-suite" / "tests" / SUITE_DRAFT
    monkeypatch.setenv(CORPUS_ENV, str(tmp_path / "absent"))
    with pytest.raises(CorpusMissing, match=CORPUS_ENV):
        bfcl_dir()


def test_a_file_that_differs_from_its_pin_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(ARTIFACT_CACHE_ENV, str(tmp_path))
    wrong = dataclasses.replace(BFCL_WHEEL, sha256="0" * 64)
    with pytest.raises(ArtifactError, match="does not match the pinned"):
        fetch(wrong)
    assert not (tmp_path / "files" / BFCL_WHEEL.filename).exists()


def _slow_build(folder: Path) -> None:
    """A build that takes a while and leaves a trace of each run beside the cache."""
    import time

    with open(folder.parent.parent / "builds.log", "a", encoding="utf-8") as log:
        log.write("built\n")
    time.sleep(1.0)
    (folder / "weights").write_text("w", encoding="utf-8")


def _build_in(cache: str) -> str:
    import os

    from hermes_vllm.testing.artifacts import unpacked

    os.environ[ARTIFACT_CACHE_ENV] = cache
    return str(unpacked("model", _slow_build))


def test_concurrent_builders_of_one_artifact_build_it_once(tmp_path: Path) -> None:
    """`make demo`'s training and a test worker asking for the same model at once: the second
    waits for the first's build and gets it, instead of training it again beside it."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    cache = tmp_path / "cache"
    with ProcessPoolExecutor(3, mp_context=get_context("spawn")) as pool:
        paths = set(pool.map(_build_in, [str(cache)] * 3))
    assert paths == {str(cache / "model")}
    assert (cache / "model" / "weights").read_text(encoding="utf-8") == "w"
    assert (tmp_path / "builds.log").read_text(encoding="utf-8").count("built") == 1
