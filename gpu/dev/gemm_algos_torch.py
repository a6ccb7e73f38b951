#!/usr/bin/env python3
"""The shapes of gpu/dev/gemm_algos.cu through torch (ATen's own choice of kernel), timed the same
way (a sustained run of back-to-back GEMMs, median of 3), to say which of the heuristic's
algorithms the step actually runs.  python gpu/dev/gemm_algos_torch.py"""
import statistics
import torch

SHAPES = [  # name, row-major operation on x [rows, k] etc.: (M, N, K) of C = A·B in row-major terms
    ("fwd gate/up   x·Wᵀ", "tn", 8192, 12288, 4096),
    ("fwd down      x·Wᵀ", "tn", 8192, 4096, 12288),
    ("fwd q/o       x·Wᵀ", "tn", 8192, 4096, 4096),
    ("lm-head fwd   x·Wᵀ", "tn", 2048, 151936, 4096),
    ("lm-head dx    g·W", "nn", 2048, 4096, 151936),
    ("dx of down    g·W", "nn", 8192, 12288, 4096),
    ("dW gate/up    gᵀ·x", "nt", 12288, 4096, 8192),
    ("dW down       gᵀ·x", "nt", 4096, 12288, 8192),
]
for name, kind, M, N, K in SHAPES:
    u = lambda *s: torch.rand(*s, device="cuda", dtype=torch.bfloat16) * 2 - 1
    if kind == "tn":
        a, b = u(M, K), u(N, K).t()
    elif kind == "nn":
        a, b = u(M, K), u(K, N)
    else:
        a, b = u(K, M).t(), u(K, N)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b, out=out)
    ms = []
    for _ in range(3):
        for _ in range(3):
            torch.mm(a, b, out=out)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(30):
            torch.mm(a, b, out=out)
        e1.record(); e1.synchronize()
        ms.append(e0.elapsed_time(e1) / 30)
    med = statistics.median(ms)
    print(f"{name}: {med:.3f} ms, {2 * M * N * K / med / 1e9:.1f} TFLOP/s ({', '.join(f'{t:.3f}' for t in ms)})", flush=True)
