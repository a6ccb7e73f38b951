#!/usr/bin/env python3
"""GEMM probe (issue 20): the drafter's and the target's GEMM shapes at Qwen3-8B sizes,
timed under PyTorch's default BLAS path, with cuBLASLt preferred, and with TunableOp
(every cuBLAS / cuBLASLt algorithm tried, the fastest kept).  Same process, same GPU.

  python gpu/dev/gemm_probe.py [--reps 20]

Prints one line per (shape, path): ms and TFLOP/s.  A shape is (name, M, K, N, layout):
'nn' y = x @ W.T (forward, x [M, K], W [N, K]), 'dx' dx = dy @ W (dy [M, N] -> [M, K]),
'dw' dW = dy.T @ x ([N, M] @ [M, K]).
"""
import argparse
import os
import statistics
import torch

SHAPES = [
    # drafter (5 layers, 8192 block rows, 3072 context rows)
    ("d.q/o fwd", 8192, 4096, 4096, "nn"), ("d.q/o dx", 8192, 4096, 4096, "dx"),
    ("d.q/o dw", 8192, 4096, 4096, "dw"),
    ("d.gate/up fwd", 8192, 4096, 12288, "nn"), ("d.gate/up dx", 8192, 4096, 12288, "dx"),
    ("d.gate/up dw", 8192, 4096, 12288, "dw"),
    ("d.down fwd", 8192, 12288, 4096, "nn"), ("d.down dx", 8192, 12288, 4096, "dx"),
    ("d.down dw", 8192, 12288, 4096, "dw"),
    ("d.ctx kv fwd", 3072, 4096, 10240, "nn"),
    ("d.lm-head fwd", 2048, 4096, 151936, "nn"), ("d.lm-head dx", 2048, 4096, 151936, "dx"),
    # target (4 x 3072 rows)
    ("t.qkv", 12288, 4096, 6144, "nn"), ("t.o", 12288, 4096, 4096, "nn"),
    ("t.gate/up", 12288, 4096, 24576, "nn"), ("t.down", 12288, 12288, 4096, "nn"),
]


def make(m, k, n, layout, dev="cuda"):
    g = torch.Generator(device=dev).manual_seed(0)
    r = lambda *s: (torch.randn(*s, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    if layout == "nn":
        x, w = r(m, k), r(n, k)
        return lambda: torch.mm(x, w.t())
    if layout == "dx":
        dy, w = r(m, n), r(n, k)
        return lambda: torch.mm(dy, w)
    dy, x = r(m, n), r(m, k)
    return lambda: torch.mm(dy.t(), x)


def shapes(args):
    return [s for s in SHAPES if s[0].startswith(args.only)]


def timed(fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--paths", default="default,cublaslt,tunable")
    ap.add_argument("--ab", type=int, default=0,
                    help="instead: tune every shape, then N interleaved rounds of default / tuned")
    ap.add_argument("--only", default="", help="shapes whose names start with this (d. / t.)")
    args = ap.parse_args()
    if args.ab:
        return ab(args)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    total = {}
    for path in args.paths.split(","):
        if path == "cublaslt":
            torch.backends.cuda.preferred_blas_library("cublaslt")
        elif path == "default":
            torch.backends.cuda.preferred_blas_library("cublas")
        elif path == "tunable":
            torch.backends.cuda.preferred_blas_library("cublas")
            torch.cuda.tunable.enable(True)
            torch.cuda.tunable.tuning_enable(True)
            torch.cuda.tunable.set_filename(os.path.join(os.environ.get("OUT", "/tmp"), "tunableop.csv"))
        for name, m, k, n, layout in shapes(args):
            fn = make(m, k, n, layout)
            if path == "tunable":
                fn(); torch.cuda.synchronize()  # tunes
            t = timed(fn, args.reps)
            tf = 2.0 * m * k * n / t / 1e9
            total[path] = total.get(path, 0.0) + t
            print(f"{path:9s} {name:15s} M{m:6d} K{k:6d} N{n:6d} {t:8.3f} ms {tf:6.1f} TFLOP/s", flush=True)
    for p, t in total.items():
        print(f"total {p}: {t:.3f} ms")


def ab(args):
    """Tunes every shape with TunableOp, then alternates default (cuBLAS) and tuned per
    shape and round, so that clocks and heat fall on both alike."""
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    torch.backends.cuda.preferred_blas_library("cublas")
    torch.cuda.tunable.enable(True)
    torch.cuda.tunable.tuning_enable(True)
    torch.cuda.tunable.set_max_tuning_duration(200)
    fns = {s[0]: make(*s[1:]) for s in shapes(args)}
    for name in fns:
        fns[name](); torch.cuda.synchronize()
    torch.cuda.tunable.tuning_enable(False)
    for r in torch.cuda.tunable.get_results():
        print("tuned", r)
    sums = {"default": [0.0] * args.ab, "tuned": [0.0] * args.ab}
    for rnd in range(args.ab):
        for name, m, k, n, layout in shapes(args):
            for path in ("default", "tuned") if rnd % 2 == 0 else ("tuned", "default"):
                torch.cuda.tunable.enable(path == "tuned")
                t = timed(fns[name], args.reps)
                sums[path][rnd] += t
                print(f"round {rnd} {path:8s} {name:15s} {t:8.3f} ms {2.0 * m * k * n / t / 1e9:6.1f} TFLOP/s",
                      flush=True)
    for p, v in sums.items():
        print(f"total {p}: " + " / ".join(f"{x:.3f}" for x in v) + " ms")


if __name__ == "__main__":
    main()
