"""The wheel ships every package and the grammars/ data, and installs without the source tree."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hermes_vllm").rglob("__init__.py")
    } | {"hermes_vllm.grammars"}
    assert listed == found


def test_wheel_carries_modules_and_data(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("hermes_vllm-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for dialect in ("hermes", "qwen", "chatml-brackets"):
        assert f"hermes_vllm/grammars/dialects/{dialect}.json" in names
    assert "hermes_vllm/grammars/templates/chatml.jinja" in names
    assert "hermes_vllm/py.typed" in names
    sources = {str(p.relative_to(ROOT)) for p in (ROOT / "hermes_vllm").rglob("*.py")}
    assert sources <= names, sorted(sources - names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert "vllm.logits_processors" in text and "vllm.general_plugins" in text
