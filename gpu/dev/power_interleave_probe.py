#!/usr/bin/env python3
"""Does memory-bound work interleaved with GEMMs cost less than the same work in one block, on a
GPU at its power cap?  (issue 20: the graphed drafter step's GEMMs ran at 92.7 ms of kernel time
against 89.9 ms eagerly, where ≈ 4 ms of launch gaps sit between kernels; the step ends with
≈ 11 ms of AdamW in one block.)

  python gpu/dev/power_interleave_probe.py [--gemms 40] [--rounds 4]

CUDA graphs of the same kernels in three orders, replayed alternately (ms a replay, median):
  grouped      every GEMM (8192 × 4096 · 4096 × 12288, bf16), then every memory-bound chunk
               (fp32 a = a * 0.9 + b, 12 bytes an element: AdamW-like traffic)
  interleaved  GEMM, chunk, GEMM, chunk, …
  gemms, chunks  each alone (their sum is the no-interaction figure)
A background `nvidia-smi` samples the SM clock and power every 20 ms into --smi FILE.
"""
import argparse
import statistics
import subprocess

import torch


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gemms", type=int, default=40)
    ap.add_argument("--chunk-mib", type=int, default=128, help="fp32 MiB of a chunk's a (and of b)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--smi", default="")
    args = ap.parse_args()
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(8192, 4096, device=dev, dtype=torch.bfloat16, generator=g)
    w = torch.randn(12288, 4096, device=dev, dtype=torch.bfloat16, generator=g)
    y = torch.empty(8192, 12288, device=dev, dtype=torch.bfloat16)
    n = args.chunk_mib * 2 ** 20 // 4
    a = [torch.randn(n, device=dev, generator=g) for _ in range(args.gemms)]
    b = [torch.randn(n, device=dev, generator=g) for _ in range(args.gemms)]

    def gemm():
        torch.mm(x, w.t(), out=y)

    def chunk(i):
        a[i].mul_(0.9).add_(b[i])  # two kernels: 16 + 12 bytes an element

    orders = {
        "grouped": lambda: ([gemm() for _ in range(args.gemms)], [chunk(i) for i in range(args.gemms)]),
        "interleaved": lambda: [(gemm(), chunk(i)) for i in range(args.gemms)],
        "gemms": lambda: [gemm() for _ in range(args.gemms)],
        "chunks": lambda: [chunk(i) for i in range(args.gemms)],
    }
    graphs = {}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in orders.values():
            f()
    torch.cuda.current_stream().wait_stream(s)
    for name, f in orders.items():
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            f()
        graphs[name] = gr
    smi = None
    if args.smi:
        smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,power.draw", "--format=csv,noheader",
                                "-lms", "20"], stdout=open(args.smi, "w"))
    times = {k: [] for k in graphs}
    for _ in range(3):
        for gr in graphs.values():
            gr.replay()
    torch.cuda.synchronize()
    for _ in range(args.rounds):
        for name, gr in graphs.items():
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(args.reps):
                gr.replay()
            e1.record()
            e1.synchronize()
            times[name].append(e0.elapsed_time(e1) / args.reps)
    if smi:
        smi.terminate()
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:12s} {med[k]:9.3f} ms  ({', '.join(f'{t:.2f}' for t in v)})")
    flop = 2 * 8192 * 4096 * 12288 * args.gemms
    print(f"gemms alone {flop / med['gemms'] / 1e9:.0f} TFLOP/s; sum of parts {med['gemms'] + med['chunks']:.3f} ms; "
          f"grouped - sum {med['grouped'] - med['gemms'] - med['chunks']:+.3f}; "
          f"interleaved - grouped {med['interleaved'] - med['grouped']:+.3f} ms")


if __name__ == "__main__":
    main()
