"""The Model Runner V2 apply path against the memory-bandwidth floor: torch + xgrammar only, no vLLM.

What one step of the processor does on the device, at batch 256 on Qwen's 151,936-wide logits:
  1. gather each constrained slot's total length and last tokens, copy them to pinned host memory
     without blocking (``apply_staged_writes``), and
  2. copy the filled packed bitmask host->device and apply it in place (``apply``).
The floor is reading and writing the logits once (``logits.add_(0)``). Figures are medians of CUDA
event timings (GPU) or wall time (CPU), reported as ratios to that floor measured in the same run.

Usage: python benchmarks/gpu_apply.py [--batch 256] [--vocab 151936] [--device cuda] [--out DIR]
On a machine without a GPU it runs on the CPU; CI runs it there with small sizes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import xgrammar as xgr


def timed(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    """Median microseconds of ``fn`` over ``repeat`` runs, after a warm-up run."""
    fn()
    samples = []
    for _ in range(repeat):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e3)
        else:
            t = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t) * 1e6)
    return statistics.median(samples)


def measure(
    batch: int, vocab: int, device: torch.device, repeat: int, max_len: int = 4096
) -> dict[str, object]:
    pin = device.type == "cuda"
    logits = torch.randn(batch, vocab, device=device)
    words = (vocab + 31) // 32
    host_mask = (
        torch.randint(-(2**31), 2**31 - 1, (batch, words), dtype=torch.int32).pin_memory()
        if pin
        else (torch.randint(-(2**31), 2**31 - 1, (batch, words), dtype=torch.int32))
    )
    all_tokens = torch.randint(0, vocab, (batch, max_len), dtype=torch.int32, device=device)
    total_len = torch.randint(16, max_len, (batch,), dtype=torch.int32, device=device)
    slots = torch.arange(batch, device=device)
    host_tokens = torch.zeros((batch, 5), dtype=torch.int32, pin_memory=pin)

    def floor() -> None:
        logits.add_(0)

    def staged_copy() -> None:
        total = total_len[slots].long()
        window = all_tokens[
            slots.unsqueeze(1), (total.unsqueeze(1) - torch.arange(4, 0, -1, device=device)).clamp(min=0)
        ]
        host_tokens.copy_(torch.cat([total.unsqueeze(1).to(window.dtype), window], 1), non_blocking=True)

    def apply(rows: list[int]) -> Callable[[], None]:
        def run() -> None:
            mask = host_mask[: max(rows) + 1].to(device, non_blocking=True)
            xgr.apply_token_bitmask_inplace(logits, mask, indices=rows)

        return run

    result: dict[str, object] = {"device": str(device), "batch": batch, "vocab": vocab}
    floor_us = timed(floor, device, repeat)
    result["floor_rw_logits_us"] = round(floor_us, 1)
    result["staged_copy_us"] = round(timed(staged_copy, device, repeat), 1)
    for share in (0.25, 1.0):
        rows = list(range(0, batch, round(1 / share)))
        us = timed(apply(rows), device, repeat)
        result[f"apply_{int(share * 100)}pct_us"] = round(us, 1)
        result[f"apply_{int(share * 100)}pct_x_floor"] = round(us / floor_us, 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    result = measure(args.batch, args.vocab, torch.device(args.device), args.repeat)
    print(json.dumps(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_apply-{args.device}.json").write_text(
        json.dumps(result, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
