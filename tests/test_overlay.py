"""The overlays ``make compat`` runs under: each GPU release's Python code over this venv, without
its kernels."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.overlay import ORJSON_NEEDED, OVERLAY_ENV, VLLM_WHEELS, overlay_env, vllm_overlay

PROBE = """
import json, orjson, vllm
import os
print(json.dumps({"vllm": vllm.__version__, "file": vllm.__file__, "orjson": orjson.__version__,
                  "overlay": os.environ.get("HERMES_VLLM_OVERLAY")}))
"""


@pytest.mark.parametrize("version", sorted(VLLM_WHEELS))
def test_the_overlay_puts_the_releases_python_layer_first(version: str) -> None:
    overlay = vllm_overlay(version)
    assert not list((overlay / "vllm").rglob("*.so")), "the compiled parts must stay out"
    assert vllm_overlay(version) == overlay  # built once
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=overlay_env(version),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["vllm"] == version and found["overlay"] == version, OVERLAY_ENV
    assert found["file"] == str(overlay / "vllm" / "__init__.py")
    assert tuple(int(p) for p in found["orjson"].split(".")[:3]) >= ORJSON_NEEDED
