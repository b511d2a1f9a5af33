"""The overlay ``make compat`` runs under: vLLM 0.33's Python code over this venv, without its kernels."""

from __future__ import annotations

import json
import subprocess
import sys

from hermes_vllm.testing.overlay import ORJSON_NEEDED, VLLM_WHEEL, overlay_env, vllm_overlay

PROBE = """
import json, orjson, vllm
print(json.dumps({"vllm": vllm.__version__, "file": vllm.__file__, "orjson": orjson.__version__}))
"""


def test_the_overlay_puts_vllm_033s_python_layer_first() -> None:
    overlay = vllm_overlay()
    assert not list((overlay / "vllm").rglob("*.so")), "the compiled parts must stay out"
    assert vllm_overlay() == overlay  # built once
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=overlay_env(),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["vllm"] == VLLM_WHEEL.version
    assert found["file"] == str(overlay / "vllm" / "__init__.py")
    assert tuple(int(p) for p in found["orjson"].split(".")[:3]) >= ORJSON_NEEDED
