"""Draft rows under a grammar against the memory-bandwidth floor: torch + xgrammar only, no vLLM.

Under speculative decoding a constrained request needs one mask row per draft position plus the
bonus row. What one step costs at batch 256, 4 draft tokens, on 151,936-wide logits (Qwen's):
  1. host: fill each request's rows the way vLLM's scheduler does (fill, accept the draft, ...,
     fill the bonus row, roll back), xgrammar matchers on a JSON-schema grammar over a synthetic
     vocabulary of that width (the engine our ``auto`` engine uses inside calls);
  2. device: copy the packed bitmask of all ``batch * (drafts + 1)`` rows host->device and apply
     it in place to the target logits of those rows (what vLLM's runner does with it).
The floor is reading and writing those logits once (``logits.add_(0)``). Device figures are
medians of CUDA event timings (GPU) or wall time (CPU), also as ratios to the floor of the same
run; host figures are wall time per step and per row.

Usage: python benchmarks/gpu_specdec.py [--batch 256] [--vocab 151936] [--drafts 4] [--device cuda]
On a machine without a GPU it runs on the CPU; CI runs it there with small sizes.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch
import xgrammar as xgr
from gpu_apply import timed

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}


def vocabulary(size: int) -> list[bytes]:
    """256 single bytes, the JSON punctuation a call needs, then random ASCII pieces."""
    rng = random.Random(0)
    pieces = [bytes([b]) for b in range(256)] + [b'{"', b'":', b'",', b' "', b"city", b"days", b'"}']
    letters = b'abcdefghijklmnopqrstuvwxyz ,:{}"0123456789'
    while len(pieces) < size:
        pieces.append(bytes(rng.choice(letters) for _ in range(rng.randint(2, 8))))
    return pieces[:size]


def first_allowed(mask: torch.Tensor, row: int) -> int:
    words = mask[row].numpy().view("uint32")
    index = int((words != 0).argmax())
    word = int(words[index])
    return index * 32 + (word & -word).bit_length() - 1


def host_fill(batch: int, vocab: int, drafts: int, steps: int) -> dict[str, float]:
    """Per step: every request's draft rows and bonus row, drafts accepted then rolled back."""
    info = xgr.TokenizerInfo(vocabulary(vocab), vocab_size=vocab)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    matchers = [xgr.GrammarMatcher(compiled) for _ in range(batch)]
    mask = xgr.allocate_token_bitmask(batch * (drafts + 1), vocab)
    samples = []
    for _ in range(steps):
        start = time.perf_counter()
        row = 0
        for matcher in matchers:
            accepted = 0
            for _ in range(drafts):
                matcher.fill_next_token_bitmask(mask, row)
                token = first_allowed(mask, row)
                row += 1
                if matcher.is_terminated() or not matcher.accept_token(token):
                    break
                accepted += 1
            matcher.fill_next_token_bitmask(mask, row)
            row += drafts - accepted + 1
            matcher.rollback(accepted)
        samples.append((time.perf_counter() - start) * 1e6)
        for matcher in matchers:  # the step's kept token: one draft
            matcher.fill_next_token_bitmask(mask, 0)
            matcher.accept_token(first_allowed(mask, 0))
    step_us = statistics.median(samples)
    return {
        "host_fill_step_us": round(step_us, 1),
        "host_fill_row_us": round(step_us / (batch * (drafts + 1)), 2),
    }


def device_apply(batch: int, vocab: int, drafts: int, device: torch.device, repeat: int) -> dict[str, float]:
    rows = batch * (drafts + 1)
    pin = device.type == "cuda"
    logits = torch.randn(rows, vocab, device=device)
    words = (vocab + 31) // 32
    host_mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int32)
    if pin:
        host_mask = host_mask.pin_memory()

    def floor() -> None:
        logits.add_(0)

    def apply() -> None:
        mask = host_mask.to(device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask)

    def copy_only() -> None:
        host_mask.to(device, non_blocking=True)

    floor_us = timed(floor, device, repeat)
    apply_us = timed(apply, device, repeat)
    return {
        "floor_rw_logits_us": round(floor_us, 1),
        "mask_copy_us": round(timed(copy_only, device, repeat), 1),
        "apply_us": round(apply_us, 1),
        "apply_x_floor": round(apply_us / floor_us, 2),
        "mask_mib": round(host_mask.numel() * 4 / 2**20, 2),
        "logits_mib": round(logits.numel() * 4 / 2**20, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--drafts", type=int, default=4)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--steps", type=int, default=5, help="host fill steps")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    device = torch.device(args.device)
    result: dict[str, object] = {
        "device": str(device),
        "batch": args.batch,
        "vocab": args.vocab,
        "drafts": args.drafts,
        **device_apply(args.batch, args.vocab, args.drafts, device, args.repeat),
        **host_fill(args.batch, args.vocab, args.drafts, args.steps),
    }
    print(json.dumps(result))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"gpu_specdec-{args.device}.json").write_text(
        json.dumps(result, indent=2) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
