#!/usr/bin/env python3
"""Standalone GPU harness for gpu/kernels/ce_grad.cu (no project build needed).

Versions: torch 2.11 (+cu130), nvcc 13.0, sm_90a (H100/H200).

  build:  python tests/gpu/ce_grad_harness.py --build
          compiles the kernel plus a tiny C shim (below) into build-harness/ce_grad/libce_grad.so with nvcc
          (static cudart; rebuilt on the GPU host when it does not load there), as
          fused_ops_harness.py does.
  run:    python tests/gpu/ce_grad_harness.py [--bench] [--rows R] [--vocab V]
          checks the kernel against the composite of chunked_ce_fn (gpu/models/dflash_objective.cpp:
          logits.float(), logsumexp, gather, argmax, sub/exp, scatter_add, mul, cast back) on the
          same bf16/fp16/fp32 logits, and against float64, then (--bench) times kernel vs
          composite at [2048, 151936] bf16 (the elementwise part only: the logits are given).

Tolerances (the kernel and the composite see the same logits, so only fp32 rounding differs):
  per-row loss  |ours - f64| <= 1e-5 * |lse| * w + 1e-6   (fp32 sums of V exps in another order;
                the lse of a 152k row is ~12, so 1e-5 is ~100 fp32 ulps; measured in the log)
  hits          exact (argmax of the same values, first index on ties)
  gradient      |ours - f64| <= 2^-8 |f64| + 1e-7 * w  (one rounding to bf16 = 2^-9 relative, plus
                fp32 exp of x - lse with lse off by a few ulps; fp16 2^-10 relative with an absolute
                floor of 2^-25, half of fp16's subnormal step, since exp(x - lse) ~ 1e-7 is
                subnormal there; fp32 1e-5 relative)
  gradient fp32 absolute floor 1e-6 * w (p near 1 at the label: a few ulps of 1)
  vs the composite on the GPU: >= 99% of bf16/fp16 gradient elements bit-equal (lse may differ in the last
                bit, which flips an occasional rounding), loss sums within 1e-6 relative.
"""
import argparse
import ctypes
import pathlib
import statistics
import sys

import torch

import kernel_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]

SHIM = r'''
#include "gpu/kernels/ce_grad.hpp"
using namespace tandem::gpu::kernels;

// a: rows, vocab, row_stride, dtype, logits, labels, weight, mask, row_loss, row_hit, row_lse,
//    write_grad, ctas
extern "C" int tandem_ce_grad(const int64_t* a, void* stream) {
  ce_grad_args c;
  c.rows = a[0]; c.vocab = a[1]; c.row_stride = a[2];
  c.dtype = a[3] == 0 ? ce_dtype::bf16 : a[3] == 1 ? ce_dtype::fp16 : ce_dtype::fp32;
  c.logits = (void*)a[4]; c.labels = (const int64_t*)a[5]; c.weight = (const float*)a[6];
  c.mask = (const float*)a[7]; c.row_loss = (float*)a[8]; c.row_hit = (float*)a[9];
  c.row_lse = (float*)a[10]; c.write_grad = a[11] != 0; c.ctas = int(a[12]);
  return int(ce_grad(c, (cudaStream_t)stream));
}
'''






_lib = None
_old = None  # --old FILE: another ce_grad.cu, for the bench's A/B
SOURCE = ROOT / "gpu/kernels/ce_grad.cu"


def lib(name="ce_grad", source=None):
    global _lib
    if _lib is None or source is not None:
        _lib = kernel_lib.load(name, SHIM, [source or SOURCE])
        _lib.tandem_ce_grad.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
        _lib.tandem_ce_grad.restype = ctypes.c_int
    return _lib


DT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def kernel(logits, labels, weight, mask, write_grad=True, ctas=0):
    """In place on `logits` [rows, >=V] (a row-strided view); returns (row_loss, row_hit, row_lse)."""
    rows, V = logits.shape
    assert logits.stride(1) == 1
    out = torch.empty(3, rows, dtype=torch.float32, device=logits.device)
    a = [rows, V, logits.stride(0), DT[logits.dtype], logits.data_ptr(), labels.data_ptr(),
         weight.data_ptr(), mask.data_ptr(), out[0].data_ptr(), out[1].data_ptr(), out[2].data_ptr(),
         int(write_grad), ctas]
    rc = lib().tandem_ce_grad((ctypes.c_int64 * len(a))(*a),
                              ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"ce_grad returned cudaError {rc}")
    return out[0], out[1], out[2]


def composite(logits, y, w, mask):
    """chunked_ce_fn's composite on one chunk (gpu/models/dflash_objective.cpp), per row."""
    lf = logits.to(torch.float32, copy=True)  # the C++ path's .to(kFloat) is of a temporary
    l = torch.logsumexp(lf, 1)
    picked = lf.gather(1, y.unsqueeze(1)).squeeze(1)
    loss = (l - picked) * w
    hit = (lf.argmax(1) == y).float() * mask
    lf.sub_(l.unsqueeze(1)).exp_()
    lf.scatter_add_(1, y.unsqueeze(1), torch.full((lf.shape[0], 1), -1.0, device=lf.device))
    lf.mul_(w.float().unsqueeze(1))
    return loss, hit, lf.to(logits.dtype)


def reference64(logits, y, w, mask):
    ld = logits.double()
    l = torch.logsumexp(ld, 1)
    loss = (l - ld.gather(1, y.unsqueeze(1)).squeeze(1)) * w.double()
    hit = (ld.argmax(1) == y).double() * mask.double()
    g = torch.exp(ld - l.unsqueeze(1))
    g.scatter_add_(1, y.unsqueeze(1), torch.full((g.shape[0], 1), -1.0, dtype=g.dtype, device=g.device))
    return loss, hit, g * w.double().unsqueeze(1), l


def make_case(rows, V, dtype, gen, scale=3.0, stride_pad=0):
    x = torch.randn(rows, V + stride_pad, generator=gen) * scale
    x = x.to("cuda", dtype)[:, :V]
    y = torch.randint(0, V, (rows,), generator=gen)
    y[0], y[1 % rows] = 0, V - 1                     # labels at both ends
    w = torch.rand(rows, generator=gen) + 0.1
    w[2 % rows] = 0.0                                 # a weight-0 row
    mask = (torch.rand(rows, generator=gen) < 0.8).float()
    y = y.cuda()
    # a few rows labelled with their argmax, so hits are non-trivial
    am = x.float().argmax(1)
    y[3::4] = am[3::4]
    # an exact tie for the max in row 5: the first index must win
    if rows > 5 and V > 10:
        x[5, 7] = x[5].max(); x[5, V - 2] = x[5, 7]; y[5] = 7
    return x, y, w.cuda(), mask.cuda()


def check(name, rows, V, dtype, stride_pad=0, write_grad=True, ctas=0, gen=None):
    x, y, w, mask = make_case(rows, V, dtype, gen, stride_pad=stride_pad)
    cl, ch, cg = composite(x, y, w, mask)
    rl, rh, rg, rlse = reference64(x, y, w, mask)
    buf = x.clone() if stride_pad == 0 else torch.empty(rows, V + stride_pad, device="cuda", dtype=dtype)[:, :V]
    buf.copy_(x)
    kl, kh, klse = kernel(buf, y, w, mask, write_grad=write_grad, ctas=ctas)
    torch.cuda.synchronize()
    wd = w.double()
    loss_err = ((kl.double() - rl).abs() / (rlse.abs() * wd + 1e-30)).max().item()
    loss_ok = bool(((kl.double() - rl).abs() <= 1e-5 * rlse.abs() * wd + 1e-6).all())
    hits_ok = torch.equal(kh, rh.float()) and torch.equal(kh, ch)
    sum_rel = abs(kl.sum().item() - cl.sum().item()) / max(abs(cl.sum().item()), 1e-30)
    ok = loss_ok and hits_ok and sum_rel < 1e-6
    msg = (f"loss max rel {loss_err:.1e}, sum vs composite {sum_rel:.1e}, hits {int(kh.sum().item())}/"
           f"{int(mask.sum().item())} {'exact' if hits_ok else 'DIFFER'}")
    if write_grad:
        rel = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -10, torch.float32: 1e-5}[dtype]
        d = (buf.double() - rg).abs()
        # absolute floor: fp32 exp error, or half a step of fp16's subnormals (2^-25)
        # fp32 (no final rounding): a few ulps of p near 1 at the label, 1e-6 * w.
        floor = 1e-6 if dtype == torch.float32 else 1e-7
        lim = rel * rg.abs() + torch.clamp(floor * wd.unsqueeze(1), min=2.0 ** -25 if dtype == torch.float16 else 0)
        g_ok = bool((d <= lim).all())
        g_rel = ((buf.double() - rg).norm() / rg.norm()).item()
        same = (buf == cg).float().mean().item()
        # bit-equality only means something after a rounding to 16 bits; in fp32 the lse's last
        # bit shows in every element (measured 97% equal)
        ok = ok and g_ok and (same >= 0.99 or dtype == torch.float32)
        msg += f"; grad rel {g_rel:.1e} (elementwise {'ok' if g_ok else 'FAIL'}), bit-equal to composite {same * 100:.3f}%"
    else:
        ok = ok and torch.equal(buf, x)
        msg += "; forward only: logits untouched"
    print(f"[{'PASS' if ok else 'FAIL'}] {name} [{rows}, {V}] {str(dtype)[6:]}: {msg}", flush=True)
    return ok


def run_checks(rows):
    gen = torch.Generator().manual_seed(7)
    ok = True
    ok &= check("qwen3 vocab", rows, 151936, torch.bfloat16, gen=gen)
    ok &= check("qwen3 vocab fp16", 64, 151936, torch.float16, gen=gen)
    ok &= check("qwen3 vocab fp32", 64, 151936, torch.float32, gen=gen)
    ok &= check("forward only", 64, 151936, torch.bfloat16, write_grad=False, gen=gen)
    ok &= check("small V", 300, 1000, torch.bfloat16, gen=gen)
    ok &= check("small V tail", 300, 1003, torch.bfloat16, gen=gen)
    ok &= check("unaligned stride", 100, 999, torch.bfloat16, stride_pad=3, gen=gen)
    ok &= check("tiny V", 50, 5, torch.float32, gen=gen)
    ok &= check("one CTA per row", 300, 151936, torch.bfloat16, ctas=100000, gen=gen)
    ok &= check("aligned rows with a tail", 200, 151939, torch.bfloat16, stride_pad=5, gen=gen)
    ok &= check("unaligned qwen3 vocab", 40, 151936, torch.bfloat16, stride_pad=3, gen=gen)
    ok &= check("fewer rows than CTAs", 5, 151936, torch.bfloat16, gen=gen)
    ok &= check("7 CTAs", 100, 151936, torch.bfloat16, ctas=7, gen=gen)
    # forward only: the training call's loss, hits and lse bits
    x, y, w, mask = make_case(64, 151936, torch.bfloat16, gen)
    a = kernel(x.clone(), y, w, mask)
    f = kernel(x.clone(), y, w, mask, write_grad=False)
    same = all(torch.equal(u, v) for u, v in zip(a, f))
    print(f"[{'PASS' if same else 'FAIL'}] forward only: loss, hits and lse bit-equal to the training call's",
          flush=True)
    ok &= same
    # determinism and CUDA-graph capture: replay bit-equal to eager
    x, y, w, mask = make_case(256, 151936, torch.bfloat16, gen)
    b0 = x.clone(); l0, h0, _ = kernel(b0, y, w, mask)
    b1 = x.clone(); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            l1, h1, _ = kernel(b1, y, w, mask)
    b1.copy_(x); g.replay(); torch.cuda.synchronize()
    gok = torch.equal(b0, b1) and torch.equal(l0, l1) and torch.equal(h0, h1)
    print(f"[{'PASS' if gok else 'FAIL'}] CUDA graph capture + replay bit-equal to eager", flush=True)
    return ok and gok


def timed(fn, warmup=3, iters=15):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize()
        ms.append(a.elapsed_time(b))
    med = statistics.median(ms)
    mad = statistics.median(abs(m - med) for m in ms)
    return med, mad


def bench(rows, V):
    gen = torch.Generator().manual_seed(3)
    x, y, w, mask = make_case(rows, V, torch.bfloat16, gen)
    work = x.clone()
    nbytes = rows * V * 2
    print(f"bench [{rows}, {V}] bf16 (median ms ± MAD; GB/s counts 2 reads + 1 write of the logits)", flush=True)
    tc, mc = timed(lambda: composite(x, y, w, mask))
    print(f"  composite elementwise: {tc:.3f} ± {mc:.3f}", flush=True)
    forms = kernel_lib.forms("ce_grad", SOURCE, _old)
    if _old:  # how close the two are on the same logits
        outs = []
        for name, lib_name, src in forms:
            lib(lib_name, src)
            b = x.clone()
            outs.append((b,) + kernel(b, y, w, mask))
        (g0, l0, h0, s0), (g1, l1, h1, s1) = outs
        print(f"  this source against the old: gradient bit-equal {(g0 == g1).float().mean().item() * 100:.3f}%, "
              f"hits equal {torch.equal(h0, h1)}, lse max rel diff "
              f"{((s0 - s1).abs() / s1.abs()).max().item():.1e}, loss sum rel diff "
              f"{abs(l0.sum().item() - l1.sum().item()) / abs(l1.sum().item()):.1e}", flush=True)
    for rnd in range(2 if _old else 1):
        for name, lib_name, src in forms:
            lib(lib_name, src)
            for ctas in ((0,) if _old else (0, 132, 264, 396, 100000)):
                tk, mk = timed(lambda: kernel(work, y, w, mask, ctas=ctas))
                print(f"  kernel ({name} source) ctas={ctas or 'default'}: {tk:.3f} ± {mk:.3f}  ({tc / tk:.1f}x, "
                      f"{3 * nbytes / tk / 1e6:.0f} GB/s)", flush=True)
            tf, _ = timed(lambda: kernel(work, y, w, mask, write_grad=False))
            print(f"  kernel ({name} source) forward only: {tf:.3f} ({nbytes / tf / 1e6:.0f} GB/s)", flush=True)
    lib("ce_grad", SOURCE)
    out = torch.empty_like(x)
    tcp, _ = timed(lambda: out.copy_(x))
    print(f"  copy ceiling: {2 * nbytes / tcp / 1e6:.0f} GB/s", flush=True)
    # the two GEMMs around it, for scale (D 4096)
    h = torch.randn(rows, 4096, generator=gen).to("cuda", torch.bfloat16)
    head = (torch.randn(V, 4096, generator=gen) * 0.02).to("cuda", torch.bfloat16)
    tg, _ = timed(lambda: torch.mm(torch.mm(h, head.t()), head))
    print(f"  two GEMMs (logits, dh) at D 4096: {tg:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--rows", type=int, default=300)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--old", metavar="FILE", help="another ce_grad.cu (e.g. `git show REV:gpu/kernels/"
                   "ce_grad.cu > F`): --bench compares it and times it beside this one, interleaved")
    args = p.parse_args()
    global _old
    _old = pathlib.Path(args.old).resolve() if args.old else None
    if args.build:
        lib()  # builds (or reuses, when the sources are unchanged) and loads
        return 0
    ok = run_checks(args.rows)
    if args.bench:
        bench(2048, args.vocab)
    print("ALL PASS" if ok else "SOME FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
