#!/usr/bin/env python3
"""GEMM fusion probe (issue 20): the drafter step's narrow GEMMs as it runs them
(one GEMM a weight; the input gradients chained through addmm's beta = 1) against
the same work as one GEMM over concatenated weights, at Qwen3-8B drafter shapes.

  python gpu/dev/gemm_fusion_probe.py [--reps 30] [--rounds 2]

Groups (D 4096, KV 1024, I 12288, 8192 block rows, 3072 context rows, 5 layers):
  block qkv   x [8192, D] by q [D, D], k [KV, D], v [KV, D]
  ctx kv      ctx [3072, D] by the 5 layers' k and v (10 x [KV, D])
  gate/up     x [8192, D] by gate [I, D], up [I, D]
For each: forward, weight gradient (dW = dYᵀ X) and input gradient (dX = Σ dYᵢ Wᵢ),
separate vs fused, medians of CUDA-event timings, interleaved over rounds.  Prints one
JSON line per (group, pass, form) and a summary of the ms a step would save (block qkv
and gate/up x 5 layers, ctx kv once).
"""
import argparse
import json
import statistics
import torch

from gemm_probe import timed  # same folder: python gpu/dev/gemm_fusion_probe.py

D, KV, I, ROWS, CTX, LAYERS = 4096, 1024, 12288, 8192, 3072, 5
GROUPS = {"block_qkv": (ROWS, [D, KV, KV], LAYERS), "ctx_kv": (CTX, [KV] * 10, 1),
          "gate_up": (ROWS, [I, I], LAYERS)}


def cases(rows, outs):
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s: (torch.randn(*s, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    x = r(rows, D)
    ws = [r(n, D) for n in outs]
    w_cat = torch.cat(ws)
    dys = [r(rows, n) for n in outs]
    dy_cat = torch.cat(dys, 1)
    dws = [torch.empty_like(w) for w in ws]
    dw_cat = torch.empty_like(w_cat)
    dx = torch.empty(rows, D, device="cuda", dtype=torch.bfloat16)

    def fwd_sep():
        for w in ws:
            torch.mm(x, w.t())

    def fwd_cat():
        torch.mm(x, w_cat.t())

    def dw_sep():
        for dy, dw in zip(dys, dws):
            torch.mm(dy.t(), x, out=dw)

    def dw_cat_():
        torch.mm(dy_cat.t(), x, out=dw_cat)

    def dx_sep():
        torch.mm(dys[0], ws[0], out=dx)
        for dy, w in zip(dys[1:], ws[1:]):
            dx.addmm_(dy, w)

    def dx_cat():
        torch.mm(dy_cat, w_cat, out=dx)

    # The fused forms' results agree with the separate ones (same sums, other order for dx).
    y = torch.mm(x, w_cat.t())
    assert torch.equal(y[:, :outs[0]], torch.mm(x, ws[0].t()))
    flops = 2 * rows * D * sum(outs)
    return flops, {"fwd": (fwd_sep, fwd_cat), "dw": (dw_sep, dw_cat_), "dx": (dx_sep, dx_cat)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    res = {}
    built = {name: cases(rows, outs) for name, (rows, outs, _) in GROUPS.items()}
    for rnd in range(args.rounds):
        for name, (flops, passes) in built.items():
            for p, (sep, cat) in passes.items():
                for form, fn in (("separate", sep), ("fused", cat)) if rnd % 2 == 0 else (("fused", cat), ("separate", sep)):
                    res.setdefault((name, p, form), []).append(timed(fn, args.reps))
    saved = 0.0
    for (name, p, form), ms in sorted(res.items()):
        flops = built[name][0]
        m = statistics.median(ms)
        print(json.dumps({"group": name, "pass": p, "form": form, "ms": round(m, 4),
                          "rounds": [round(v, 4) for v in ms], "tflops": round(flops / m / 1e9, 1)}))
        if form == "fused":
            saved += (statistics.median(res[(name, p, "separate")]) - m) * GROUPS[name][2]
    print(json.dumps({"summary": "ms a step the fused forms would save (block qkv, gate/up x 5, ctx kv x 1)",
                      "ms": round(saved, 3), "device": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main()
