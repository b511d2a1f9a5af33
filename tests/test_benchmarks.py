"""The benchmark scripts stay runnable: each runs here with small sizes (the figures are not checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run(script: str, *args: str, out: Path, env: dict[str, str] | None = None) -> None:
    """Run a benchmark; on a timeout stop it with SIGTERM first, so that the vLLM servers it
    started stop with it (a SIGKILL left them running, orphaned, for the rest of the suite)."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args, "--out", str(out)]
    with subprocess.Popen(command, env={**os.environ, **(env or {})}, start_new_session=True) as proc:
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            proc.terminate()  # its servers stop on the way out (testing.server.openai_server)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise
    if code:
        raise subprocess.CalledProcessError(code, command)


def test_gpu_apply_runs_on_the_cpu(tmp_path: Path) -> None:
    run("gpu_apply.py", "--batch", "8", "--vocab", "4096", "--repeat", "3", "--device", "cpu", out=tmp_path)
    result = json.loads((tmp_path / "gpu_apply-cpu.json").read_text())
    assert result["batch"] == 8 and result["floor_rw_logits_us"] > 0 and result["apply_100pct_us"] > 0


def test_v2_slots_runs(tmp_path: Path) -> None:
    run("v2_slots.py", "--tokenizer", "mistral-v1", "--finished", "0", "8", "--steps", "5", out=tmp_path)
    result = json.loads((tmp_path / "v2_slots.json").read_text())
    assert set(result["after"]) == {"0", "8"} and (tmp_path / "v2_slots.png").exists()


def test_v2_order_runs(tmp_path: Path) -> None:
    run(
        "v2_order.py",
        "--tokenizer",
        "mistral-v1",
        "--batch",
        "2",
        "--steps",
        "4",
        "--repeats",
        "1",
        out=tmp_path,
    )
    result = json.loads((tmp_path / "v2_order-mistral-v1.json").read_text())
    kinds = {"v2 (0.33 order)", "v2 (0.34 order)", "v2 (0.34 order, no step hook)"}
    assert set(result["us_per_step"]) == {*kinds, "hosted"}
    late = result["late_gathers"]
    # The step hook copies the rows' tokens before the forward on every step of both orders.
    assert {
        kind: late[kind]["gathered_after_forward"] for kind in kinds - {"v2 (0.34 order, no step hook)"}
    } == {
        "v2 (0.33 order)": 0,
        "v2 (0.34 order)": 0,
    }
    assert late["v2 (0.34 order, no step hook)"]["gathered_after_forward"] > 0
    assert (tmp_path / "v2_order-mistral-v1.png").exists()


def test_processor_per_step_runs(tmp_path: Path) -> None:
    pytest.importorskip(
        "vllm.v1.sample.logits_processor", reason="the benchmark drives the V1 adapter (0.34 has no V1)"
    )
    run(
        "processor.py",
        "--tokenizer",
        "mistral-v1",
        "--batch",
        "2",
        "--share",
        "0",
        "1",
        "--steps",
        "2",
        out=tmp_path,
    )
    report = json.loads((tmp_path / "processor-mistral-v1.json").read_text())
    assert {r["span_share"] for r in report["per_step"]} == {0.0, 1.0}
    assert (tmp_path / "processor-mistral-v1.png").stat().st_size > 0


@pytest.mark.server
def test_processor_required_offline_and_end_to_end_run(tmp_path: Path) -> None:
    """The offline ``required`` comparison and the three-server run, on a tokenizer whose name
    holds a dot (``--e2e`` had broken at import once; the file was named ``processor-llama3``)."""
    run(
        "processor.py",
        *("--tokenizer", "llama3.1", "--batch", "2", "--share", "0", "--steps", "2"),
        *("--required-offline", "--e2e", "--passes", "1", "--concurrency", "2", "--rounds", "1"),
        *("--max-tokens", "8", "--offline-max-tokens", "32"),
        out=tmp_path,
    )
    report = json.loads((tmp_path / "processor-llama3.1.json").read_text())
    offline = report["required_offline"]
    spent = offline["constraint_us_per_token_median"]
    assert set(spent) == {"hermes_vllm", "vllm_structural_tag", "unconstrained"}
    assert spent["hermes_vllm"] > 0 and spent["vllm_structural_tag"] > 0 and spent["unconstrained"] == 0
    assert all(v > 0 for v in offline["sampler_us_per_token_median"].values())
    assert report["end_to_end"]


def test_compile_agent_scale_runs(tmp_path: Path) -> None:
    """Both sides compile, walk the same call and report each target at a small size (whether a
    target is met is the benchmark's finding, not the test's: a loaded machine misses it)."""
    out = tmp_path / "agents.json"
    args = ("--agent-scale", "--sizes", "1,3", "--repeats", "1", "--tokenizers", "mistral-v1")
    run("compile.py", *args, out=out)
    report = json.loads(out.read_text())
    assert set(report["medians"]) == {"hermes_vllm", "vllm_structural_tag"}
    for side in report["medians"].values():
        assert all(side[n]["mask_in_us"] > 0 and side[n]["cold_ms"] > 0 for n in ("1", "3"))
    assert (
        isinstance(report["targets"]["again_us"]["met"], bool) and out.with_suffix(".png").stat().st_size > 0
    )


def test_compile_against_raw_xgrammar_runs(tmp_path: Path) -> None:
    """Each set's cold compile is split into xgrammar's share and the rest, compiled by raw
    xgrammar as vLLM builds it too (``--peer``), and the engine's hit on it timed."""
    out = tmp_path / "compile.json"
    run(
        "compile.py", "--engines", "xgrammar", "--tokenizers", "mistral-v1", "--limit", "3", "--peer", out=out
    )
    (row,) = json.loads(out.read_text())["runs"]
    raw = row["against_raw_xgrammar"]
    assert raw["sets"] == row["compiled"] and raw["peer_sets"] >= 1
    assert 0 < raw["xgrammar_share_ms"]["p50"] <= raw["cold_ms"]["p50"] and raw["peer_ms"]["p50"] > 0
    assert row["hit_us"]["n"] > 0 and row["first_admission_us"]["n"] == row["compiled"]


def test_budget_cache_trace_runs(tmp_path: Path) -> None:
    run("budget.py", "--cache", out=tmp_path)
    cache = json.loads((tmp_path / "budget-cache.json").read_text())["cache"]
    assert (
        cache["processor_counts"]
        > cache["grammar_holds_span_budget"]
        > cache["grammar_holds_budget_and_reserve"]
    )


def test_memory_compile_mode_runs(tmp_path: Path) -> None:
    env_off = {"HERMES_VLLM_CACHE_BYTES": "0", "HERMES_VLLM_XGRAMMAR_CACHE_BYTES": "0"}
    args = ("memory.py", "--mode", "compile", "--phases", "2", "--per-phase", "5", "--sets", "10")
    run(*args, out=tmp_path, env=env_off)
    run(*args, out=tmp_path)
    report = json.loads((tmp_path / "memory-compile.json").read_text())
    assert [s["compiles"] for s in report["samples"]] == [0, 5, 10, 15, 20]
    assert report["cache_limit_mb"] == 32 and report["growth_with_caches_off_mb"] >= 0
    assert "growth_within_limits" in report and (tmp_path / "memory-compile.png").stat().st_size > 0


@pytest.mark.engine  # --mode tools serves the batches from an offline engine
def test_memory_runs(tmp_path: Path) -> None:
    run("memory.py", "--mode", "tools", "--long", "--phases", "2", "--per-phase", "4", out=tmp_path)
    report = json.loads((tmp_path / "memory-tools-long.json").read_text())
    assert len(report["rss_mb"]) == 3 and report["per_phase"] == 4


def test_gpu_specdec_runs_on_the_cpu(tmp_path: Path) -> None:
    run(
        "gpu_specdec.py",
        *(
            "--batch",
            "4",
            "--vocab",
            "4096",
            "--drafts",
            "2",
            "--repeat",
            "2",
            "--steps",
            "1",
            "--device",
            "cpu",
        ),
        out=tmp_path,
    )
    result = json.loads((tmp_path / "gpu_specdec-cpu.json").read_text())
    assert result["floor_rw_logits_us"] > 0 and result["apply_us"] > 0 and result["host_fill_row_us"] > 0


@pytest.mark.engine
def test_specdec_runs(tmp_path: Path) -> None:
    run("specdec.py", "--requests", "2", "--max-tokens", "32", "--passes", "1", out=tmp_path)
    report = json.loads((tmp_path / "specdec-mistral-v1.json").read_text())
    assert set(report["tokens_per_s"]) == {"hermes_vllm", "vllm_structural_tag", "unconstrained"}
    assert (tmp_path / "specdec-mistral-v1.png").stat().st_size > 0


@pytest.mark.engine  # the batches run on offline engines with ngram drafts
def test_grammar_drafts_runs(tmp_path: Path) -> None:
    run("grammar_drafts.py", "--concurrency", "2", "--max-tokens", "64", out=tmp_path)
    report = json.loads((tmp_path / "grammar-drafts-ws1.json").read_text())
    kinds = {r["kind"] for r in report["runs"]}
    assert kinds == {"hermes_vllm", "hermes_vllm_no_grammar_drafts", "vllm_structural_tag"}
    assert (tmp_path / "grammar-drafts-ws1.png").stat().st_size > 0


@pytest.mark.parametrize("runner", ["core", "v2-0.34"])
def test_worstcase_sweep_runs(tmp_path: Path, runner: str) -> None:
    args = ["--sets", "0", "--shapes", "1", "--stride", "64", "--engines", "xgrammar", "--samplers", "random"]
    run("worstcase.py", *args, "--runner", runner, out=tmp_path / "worstcase.json")
    result = json.loads((tmp_path / "worstcase.json").read_text())
    assert result["total"]["runs"] == 6 and (tmp_path / "worstcase.png").exists()
    assert result["meta"]["runner"] == runner


def test_worstcase_resume_plays_only_missing_or_failed_tasks(tmp_path: Path) -> None:
    """``--resume`` keeps a done task's rows, plays a task the file lacks, and plays again a task
    it holds a failure of (its old rows replaced)."""
    out = tmp_path / "worstcase.json"
    args = ["--sets", "0", "--shapes", "2", "--stride", "64", "--engines", "xgrammar", "--samplers", "random"]
    run("worstcase.py", *args, out=out)
    first = json.loads(out.read_text())
    shapes = list(first["by"]["shape"])
    assert len(shapes) == 2 and first["total"]["runs"] == 12
    kept = [r for r in first["rows"] if r["shape"] == shapes[0]]
    failed = {**kept[0], "kept": False, "text": "played before the fix"}
    first["rows"] = [failed, *kept[1:]]  # shape 0 holds a failure, shape 1 was never played
    out.write_text(json.dumps(first))
    run("worstcase.py", *args, "--resume", out=out)
    second = json.loads(out.read_text())
    assert second["total"] == {"kept": 12, "runs": 12, "rate": 1.0}
    assert sorted({r["shape"] for r in second["rows"]}) == sorted(shapes)
    assert not any(r["text"] == "played before the fix" for r in second["rows"])
    with pytest.raises(subprocess.CalledProcessError):  # other plays than the file's
        run("worstcase.py", *args[:-1], "late", "--resume", out=out)


@pytest.mark.server
def test_quality_runs(tmp_path: Path) -> None:
    """Three held-out items (one of several calls) through our server's modes, first turn and after
    tool results, and the bracket dialect's server with our template, on the random model: the
    report's shape (the rates of a random model are not checked, only that they are rates)."""
    from hermes_vllm.testing import tiny_model_path

    model = str(tiny_model_path("qwen3"))
    run(
        "quality.py",
        "--items",
        "3",
        "--model",
        model,
        "--servers",
        "ours,ours_brackets",
        "--max-tokens",
        "64",
        out=tmp_path,
    )
    report = json.loads((tmp_path / "quality.json").read_text())
    assert len(report["items"]) == 3 and report["sampling"].startswith("temperature 0")
    assert set(report["configs"]) == {
        *("ours auto", "ours required", "ours named"),
        *("ours auto + response_format", "ours required + response_format", "ours none + response_format"),
        *("ours auto, after all results", "ours auto, after the first of several"),
        "ours auto + response_format, after all results",
        *("no parser, brackets", "ours brackets auto", "ours brackets required"),
    }
    for summary in report["configs"].values():
        assert summary["items"] >= 1 and summary["tokens_per_reply"] > 0
        assert all(0 <= summary[k] <= 1 for k in ("parse", "valid", "right_tool", "exact"))
    for required in ("ours required", "ours brackets required", "ours required + response_format"):
        assert report["configs"][required]["valid"] == 1.0  # the constraint's promise, even here
    typed = report["configs"]["ours auto + response_format"]  # a call or the answer, never neither
    assert typed["neither"] == 0 and typed["http_errors"] == 0
    answering = report["configs"]["ours none + response_format"]  # the answer, whole, every time
    assert answering["answered"] == answering["items"] and answering["http_errors"] == 0
    after = report["configs"]["ours auto + response_format, after all results"]  # the same after results
    assert after["items"] == 3 and after["neither"] == 0 and after["http_errors"] == 0
    assert report["configs"]["ours auto, after the first of several"]["items"] == 1
    table = (tmp_path / "quality.md").read_text()
    assert "| ours auto + response_format | 3 |" in table
    assert "| ours auto + response_format, after all results | 3 |" in table
    assert (tmp_path / "quality.png").stat().st_size > 0 and (tmp_path / "quality.md").exists()


def test_unique_cost_runs(tmp_path: Path) -> None:
    run("unique_cost.py", "--tokenizer", "mistral-v1", "--repeat", "3", out=tmp_path / "unique.json")
    result = json.loads((tmp_path / "unique.json").read_text())
    assert set(result["points"]) == {
        "inside a string item",
        "between items",
        "inside an integer item",
        "outside the sets",
    }
