#!/usr/bin/env python3
"""PyTorch reference for one GPU shared by the target and the drafter (docs/bench.md).

What `bench/pipeline.py --target-device cuda:0 --drafter-device cuda:0` times
in Tandem, done the way a Python stack on one GPU does it: back to back in one
process, the target's forward of a batch (`transformers` Qwen3 up to its
deepest tap, bench/reference_target.py, one document a row: its strongest
case) and then, for each of its rows, one drafter training step
(bench/reference_step.py) on that row's tokens and the target's real taps.
Random weights at the size's shapes, bf16.

Variants (one JSON line each; a line with "error" when one fails):
  eager         target eager (SDPA causal), drafter `eager` (dense SDPA)
  compiled      target torch.compile (default mode), drafter `flex-compiled`
                (FlexAttention inside torch.compile): the strongest setup a
                user runs without minutes of autotuning
  max-autotune  both with mode="max-autotune" (compiles for many minutes)
Per iteration: `rows` samples (--rows, Tandem's pipeline uses 1 row a batch).
`sample_ms_median` = median over iterations of (target + drafter steps) / rows,
the figure to set beside Tandem's `step_ms_median`; `target_ms_median` and
`drafter_ms_median` split it (a device sync between them, which a Python loop
pays anyway when it reads the loss back).
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_step  # noqa: E402
import reference_target  # noqa: E402

VARIANTS = {  # name: (target torch.compile mode or None, reference_step variant)
    "eager": (None, "eager"),
    "compiled": ("default", "flex-compiled"),
    "max-autotune": ("max-autotune", "flex-max-autotune"),
}


def run_variant(name, size, dev, args):
    target_mode, step_variant = VARIANTS[name]
    cuda = dev.type == "cuda"
    tsh, dsh = reference_target.SHAPES[size], reference_step.SHAPES[size]
    S = dsh["S"]
    if tsh["D"] != dsh["D"] or tsh["V"] > dsh["V"]:
        raise ValueError(f"size {size}: the target's and the drafter's shapes disagree")
    model, taps = reference_target.build(dict(tsh, S=S), dev)
    target = torch.compile(model, mode=target_mode) if target_mode else model
    step, info = reference_step.make_step(step_variant, dsh, dev)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    def one():
        ids = torch.randint(tsh["V"], (args.rows, S), device=dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            hs = target(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
            feats = torch.cat([hs[i + 1] for i in taps], dim=-1)
        sync()
        t1 = time.perf_counter()
        for r in range(args.rows):
            loss = step(ids[r], feats[r])
            loss.item()  # read-back, as Tandem's step
        sync()
        t2 = time.perf_counter()
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    t0 = time.perf_counter()
    for _ in range(max(args.warmup, 2)):  # compilation happens here
        one()
    warm_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    tgt, dft = [], []
    for _ in range(args.iters):
        a, b = one()
        tgt.append(a / args.rows)
        dft.append(b / args.rows)
    tot = [a + b for a, b in zip(tgt, dft)]
    med = statistics.median(tot)
    return dict(case="pipeline_reference", variant=name, size=size, rows=args.rows, seq=S,
                samples_ms=tot, sample_ms_median=med, mad_ms=statistics.median(abs(x - med) for x in tot),
                target_ms_median=statistics.median(tgt), drafter_ms_median=statistics.median(dft),
                tokens_per_s=S / (med / 1e3), warmup_s=warm_s, iters=args.iters,
                peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else 0.0,
                target=f"transformers Qwen3 to layer {max(taps)}, sdpa causal, one document a row, "
                       f"torch.compile {target_mode or 'off'}",
                drafter=f"reference_step {step_variant}", torch=torch.__version__, **info)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(reference_step.SHAPES), default="8b")
    ap.add_argument("--device", default="cuda:0" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rows", type=int, default=1, help="rows a target forward (Tandem's pipeline: 1)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variants", default="compiled", help="comma-separated, of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    if args.rows < 1:
        ap.error("--rows must be at least 1")
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    for name in args.variants.split(","):
        try:
            if name not in VARIANTS:
                raise ValueError(f"unknown variant '{name}' (one of {', '.join(VARIANTS)})")
            line = run_variant(name, args.size, dev, args)
        except Exception as e:  # noqa: BLE001 — reported as a JSON line, then the next variant
            line = dict(case="pipeline_reference", variant=name, error=f"{type(e).__name__}: {e}"[-2000:])
        print(json.dumps(line), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
