#!/usr/bin/env python3
"""Standalone GPU harness for gpu/kernels/norm_rope.cu (no project build needed).

Versions: torch 2.11 (+cu130), nvcc 13.0, sm_90a (H100/H200).

  build:  python tests/gpu/fused_ops_harness.py --build
          compiles the kernels plus a tiny C shim (below) into build-harness/norm_rope/libnorm_rope.so with
          nvcc (static cudart: a library built on a CUDA 13 machine without a GPU loads on the
          H200 host; it is rebuilt there when it does not load).  The shim takes raw pointers,
          so neither it nor the kernels include torch headers; torch.utils.cpp_extension only
          names the CUDA toolkit (CUDA_HOME) and nvcc does the rest, which keeps the build to
          ~12 s instead of a minute of torch-header compilation.
  run:    python tests/gpu/fused_ops_harness.py [--bench]
          checks forward and backward of RMSNorm and RoPE against the composite (the code of
          gpu/models/common.cpp, in PyTorch) in float64, then (--bench) times fused vs
          composite at the target's and the drafter's shapes.

Tolerances (relative Frobenius error ||ours - ref|| / ||ref|| against the float64 composite,
unless said otherwise):
  RMSNorm forward bf16  1e-2 (1 bf16 rounding of n and 1 of y: ~2^-9 each; measured ~3e-3)
  RMSNorm forward fp32  1e-5 (fp32 sum of D squares; measured ~1e-7)
  RMSNorm forward vs the bf16 composite on the GPU: >= 99% of elements bit-equal, the rest
          1 bf16 ulp (the sum of squares is reduced in another order, so rstd can differ in
          its last bit and flip a rounding)
  RMSNorm dx, dw bf16   2e-2 (fp32 math, one rounding; the bf16 composite rounds dn = dy*w
          and the partial sums too, so the float64 reference is the fair one)
  RMSNorm dx, dw fp32   1e-5
  RoPE forward: bit-equal to the composite in the same dtype (each op rounds once, as there)
  RoPE backward bf16 1e-2, fp32 1e-6 (fp32 math, one rounding)
"""
import argparse
import ctypes
import os
import pathlib
import statistics
import sys

import torch

import kernel_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]

SHIM = r'''
#include "gpu/kernels/norm_rope.hpp"
using namespace tandem::gpu::kernels;

static norm_dtype dt(int64_t v) { return v == 0 ? norm_dtype::bf16 : v == 1 ? norm_dtype::fp16 : norm_dtype::fp32; }

// a: rows, dim, dtype, x, w, y, rstd
extern "C" int tandem_rms_fwd(const int64_t* a, float eps, void* stream) {
  rms_norm_fwd_args f;
  f.rows = a[0]; f.dim = int(a[1]); f.dtype = dt(a[2]); f.eps = eps;
  f.x = (const void*)a[3]; f.weight = (const void*)a[4]; f.y = (void*)a[5]; f.rstd = (float*)a[6];
  return int(rms_norm_forward(f, (cudaStream_t)stream));
}

// a: rows, dim, dtype, x, w, rstd, dy, dx, dw, partials, dx_add
extern "C" int tandem_rms_bwd(const int64_t* a, void* stream) {
  rms_norm_bwd_args f;
  f.rows = a[0]; f.dim = int(a[1]); f.dtype = dt(a[2]);
  f.x = (const void*)a[3]; f.weight = (const void*)a[4]; f.rstd = (const float*)a[5];
  f.dy = (const void*)a[6]; f.dx = (void*)a[7]; f.dweight = (void*)a[8]; f.partials = (float*)a[9];
  f.dx_add = (const void*)a[10];
  return int(rms_norm_backward(f, (cudaStream_t)stream));
}

extern "C" long long tandem_rms_partials(long long rows, int dim, int dtype) {
  return rms_norm_bwd_partial_rows(rows, dim, dt(dtype));
}

// a: B, H, T, d, dtype, backward, in(4), out(4), cos, sin, table_batch, table_token
extern "C" int tandem_rope(const int64_t* a, void* stream) {
  rope_args r;
  r.batch = int(a[0]); r.heads = int(a[1]); r.tokens = int(a[2]); r.head_dim = int(a[3]);
  r.dtype = dt(a[4]); r.backward = a[5] != 0;
  r.in = {(void*)a[6], a[7], a[8], a[9]}; r.out = {(void*)a[10], a[11], a[12], a[13]};
  r.cos = (const float*)a[14]; r.sin = (const float*)a[15]; r.table_batch = a[16]; r.table_token = a[17];
  return int(rope_apply(r, (cudaStream_t)stream));
}
'''






_lib = None
_old = None  # --old FILE: the kernels of another norm_rope.cu, for the bench's A/B
SOURCE = ROOT / "gpu/kernels/norm_rope.cu"


def lib(name="norm_rope", source=None):
    global _lib
    if _lib is None or source is not None:
        _lib = kernel_lib.load(name, SHIM, [source or SOURCE])
        _lib.tandem_rms_fwd.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_void_p]
        _lib.tandem_rms_bwd.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
        _lib.tandem_rope.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]
        _lib.tandem_rms_partials.argtypes = [ctypes.c_longlong, ctypes.c_int, ctypes.c_int]
        _lib.tandem_rms_partials.restype = ctypes.c_longlong
        for f in (_lib.tandem_rms_fwd, _lib.tandem_rms_bwd, _lib.tandem_rope):
            f.restype = ctypes.c_int
    return _lib


DT = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def check_rc(rc):
    if rc != 0:
        raise RuntimeError(f"kernel returned cudaError {rc}")


def arr(args):
    return (ctypes.c_int64 * len(args))(*args)


# ---- the kernels through ctypes (what gpu/models/fused_ops.cpp does in C++) ----------------

def fused_norm_fwd(x, w, eps, save=True):
    D = x.shape[-1]
    xc = x.contiguous()
    y = torch.empty_like(xc)
    rows = xc.numel() // D
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device) if save else None
    check_rc(lib().tandem_rms_fwd(arr([rows, D, DT[x.dtype], xc.data_ptr(), w.data_ptr(), y.data_ptr(),
                                       rstd.data_ptr() if save else 0]), ctypes.c_float(eps), stream()))
    return y, rstd


def fused_norm_bwd(x, w, rstd, dy, want_dw=True, add=None, dx=None):
    """add: the other use's gradient, summed into dx before its rounding (dx_add); dx: where
    to write (may be `add` itself, as the model's residual does)."""
    D = x.shape[-1]
    xc, dyc = x.contiguous(), dy.contiguous()
    rows = xc.numel() // D
    if dx is None:
        dx = torch.empty_like(xc)
    dw = torch.empty_like(w) if want_dw else None
    parts = None
    if want_dw:
        p = lib().tandem_rms_partials(rows, D, DT[x.dtype])
        parts = torch.empty(p, D, dtype=torch.float32, device=x.device)
    check_rc(lib().tandem_rms_bwd(arr([rows, D, DT[x.dtype], xc.data_ptr(), w.data_ptr(), rstd.data_ptr(),
                                       dyc.data_ptr(), dx.data_ptr(), dw.data_ptr() if want_dw else 0,
                                       parts.data_ptr() if want_dw else 0,
                                       add.data_ptr() if add is not None else 0]), stream()))
    return dx, dw


def view4(t):
    assert t.stride(-1) == 1
    return [t.data_ptr()] + [0 if t.shape[i] == 1 else t.stride(i) for i in range(3)]


def fused_rope(x, cos, sin, backward=False, out=None):
    B, H, T, d = x.shape
    if out is None:
        out = torch.empty_like(x)  # keeps x's strides ([B, T, H, d] memory stays so)
    tb = 0 if cos.shape[0] == 1 else cos.stride(0)
    check_rc(lib().tandem_rope(arr([B, H, T, d, DT[x.dtype], int(backward)] + view4(x) + view4(out)
                                   + [cos.data_ptr(), sin.data_ptr(), tb, cos.stride(1)]), stream()))
    return out


# ---- the composites (gpu/models/common.cpp, line for line) ---------------------------------

def rms_norm_composite(x, w, eps):
    xf = x.to(torch.float32)
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * normed.to(x.dtype)


def rope_tables(pos, d, theta=1e6):
    exponent = torch.arange(0, d, 2, device=pos.device).float() / d
    inv = 1.0 / torch.pow(theta, exponent)
    freqs = pos.float().unsqueeze(-1) * inv
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rope_composite(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    rot = torch.cat([-x2, x1], -1)
    c = cos.unsqueeze(1).to(x.dtype)
    s = sin.unsqueeze(1).to(x.dtype)
    return x * c + rot * s


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---- checks --------------------------------------------------------------------------------

TOL = {torch.bfloat16: (1e-2, 2e-2), torch.float16: (2e-3, 4e-3), torch.float32: (1e-5, 1e-5)}


def check_norm(name, shape, dtype, eps=1e-6, noncontig=False, want_dw=True):
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    D = shape[-1]
    x = (torch.randn(*shape, generator=gen) * 3).to("cuda", dtype)
    if noncontig:  # a [.., 2D] tensor's first half: rows not contiguous (the wrapper copies)
        x = torch.cat([x, x], -1)[..., :D]
    w = (1 + 0.1 * torch.randn(D, generator=gen)).to("cuda", dtype)
    dy = torch.randn(*shape, generator=gen).to("cuda", dtype)
    y, rstd = fused_norm_fwd(x, w, eps)
    dx, dw = fused_norm_bwd(x, w, rstd, dy, want_dw)
    # float64 reference: the composite's function (no roundings) with autograd.
    xr = x.detach().double().requires_grad_(True)
    wr = w.detach().double().requires_grad_(True)
    yr = rms_norm_composite(xr, wr, eps)
    yr.backward(dy.double())
    same = rms_norm_composite(x, w, eps)  # the composite in x's dtype, on the GPU
    eq = (y == same).float().mean().item()
    ulp = ((y.float() - same.float()).abs() / same.float().abs().clamp_min(1e-30)).max().item()
    tf, tb = TOL[dtype]
    e = {"y": rel(y, yr), "dx": rel(dx, xr.grad)}
    if want_dw:
        e["dw"] = rel(dw, wr.grad)
    ok = e["y"] < tf and e["dx"] < tb and e.get("dw", 0) < tb and (dtype == torch.float32 or eq > 0.99)
    # Determinism: a second backward is bit-equal.
    dx2, dw2 = fused_norm_bwd(x, w, rstd, dy, want_dw)
    det = torch.equal(dx, dx2) and (not want_dw or torch.equal(dw, dw2))
    ok &= det
    print(f"[{'PASS' if ok else 'FAIL'}] rms_norm {name} {list(shape)} {str(dtype)[6:]}: "
          + " ".join(f"{k} {v:.2e}" for k, v in e.items())
          + f"  bit-equal to composite {eq * 100:.2f}% (max rel diff {ulp:.1e})  deterministic {det}",
          flush=True)
    return ok


def check_norm_add(D, dtype, rows=600):
    """dx_add: dx = norm's dx + add with one rounding, into a fresh tensor and in place over add."""
    gen = torch.Generator().manual_seed(D)
    x = (torch.randn(rows, D, generator=gen) * 3).to("cuda", dtype)
    w = (1 + 0.1 * torch.randn(D, generator=gen)).to("cuda", dtype)
    dy = torch.randn(rows, D, generator=gen).to("cuda", dtype)
    add = torch.randn(rows, D, generator=gen).to("cuda", dtype)
    _, rstd = fused_norm_fwd(x, w, 1e-6)
    dx, dw = fused_norm_bwd(x, w, rstd, dy, add=add)
    inplace = add.clone()
    dx2, dw2 = fused_norm_bwd(x, w, rstd, dy, add=inplace, dx=inplace)
    xr = x.detach().double().requires_grad_(True)
    wr = w.detach().double().requires_grad_(True)
    rms_norm_composite(xr, wr, 1e-6).backward(dy.double())
    e = rel(dx, xr.grad + add.double())
    ok = e < TOL[dtype][1] and torch.equal(dx, dx2) and torch.equal(dw, dw2) and rel(dw, wr.grad) < TOL[dtype][1]
    print(f"[{'PASS' if ok else 'FAIL'}] rms_norm dx_add D {D} {str(dtype)[6:]}: dx + add {e:.2e}, "
          f"in place over add bit-equal {torch.equal(dx, dx2)}", flush=True)
    return ok


def check_rope(name, B, H, T, d, dtype, bthd=True, broadcast=False):
    gen = torch.Generator().manual_seed(7)
    if bthd:  # the model's layout: [B, T, H, d] memory seen as [B, H, T, d]
        x = torch.randn(B, T, H, d, generator=gen).to("cuda", dtype).transpose(1, 2)
        dy = torch.randn(B, T, H, d, generator=gen).to("cuda", dtype).transpose(1, 2)
    else:
        x = torch.randn(B, H, T, d, generator=gen).to("cuda", dtype)
        dy = torch.randn(B, H, T, d, generator=gen).to("cuda", dtype)
    pos = torch.randint(0, 40000, (1 if broadcast else B, T), generator=gen).to("cuda")
    cos, sin = rope_tables(pos, d)
    y = fused_rope(x, cos, sin)
    same = apply_rope_composite(x, cos, sin)
    exact = torch.equal(y, same)
    dx = fused_rope(dy, cos, sin, backward=True)
    xr = x.detach().double().requires_grad_(True)
    # float64 reference of the composite's function, with cos/sin rounded to x's dtype as it does
    yr = apply_rope_composite(xr, cos.to(dtype).double(), sin.to(dtype).double())
    yr.backward(dy.double())
    eb = rel(dx, xr.grad)
    tb = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-6}[dtype]
    ok = exact and eb < tb and y.stride() == x.stride()
    print(f"[{'PASS' if ok else 'FAIL'}] rope {name} [{B},{H},{T},{d}] {str(dtype)[6:]}: "
          f"forward bit-equal {exact} (fwd rel vs f64 {rel(y, yr):.2e}), dx {eb:.2e}", flush=True)
    return ok


def run_checks():
    ok = True
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        ok &= check_norm("hidden", (8192, 4096), dt)
        ok &= check_norm("per-head", (2048, 32, 128), dt)
    ok &= check_norm("hidden frozen (no dw)", (1000, 4096), torch.bfloat16, want_dw=False)
    ok &= check_norm("non-contiguous", (300, 4096), torch.bfloat16, noncontig=True)
    ok &= check_norm("odd rows D 8192", (77, 8192), torch.bfloat16)
    ok &= check_norm("D 8192 fp32", (33, 8192), torch.float32)
    ok &= check_norm("D 40", (999, 40), torch.bfloat16)
    ok &= check_norm("D 1024", (513, 1024), torch.bfloat16)
    ok &= check_norm("D 64", (4099, 64), torch.float32)
    # two chunks a thread in fp32 (D 2048), a row with idle lanes (D 3000), dx_add
    ok &= check_norm("D 2048 fp32", (1000, 2048), torch.float32)
    ok &= check_norm("D 3000", (700, 3000), torch.bfloat16)
    for dt, D in ((torch.bfloat16, 4096), (torch.float32, 2048), (torch.bfloat16, 1024)):
        ok &= check_norm_add(D, dt)
    for dt in (torch.bfloat16, torch.float32, torch.float16):
        ok &= check_rope("bthd", 2, 8, 300, 128, dt)
    ok &= check_rope("contiguous", 2, 4, 100, 128, torch.bfloat16, bthd=False)
    ok &= check_rope("broadcast table d64", 3, 4, 50, 64, torch.bfloat16, broadcast=True)
    # graph capture: the forward and backward replay bit-equal
    x = torch.randn(4096, 4096, device="cuda").bfloat16()
    w = torch.ones(4096, device="cuda").bfloat16()
    dy = torch.randn_like(x)
    y0, r0 = fused_norm_fwd(x, w, 1e-6)
    dx0, dw0 = fused_norm_bwd(x, w, r0, dy)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            y1, r1 = fused_norm_fwd(x, w, 1e-6)
            dx1, dw1 = fused_norm_bwd(x, w, r1, dy)
    g.replay()
    torch.cuda.synchronize()
    gok = torch.equal(y0, y1) and torch.equal(dx0, dx1) and torch.equal(dw0, dw1)
    print(f"[{'PASS' if gok else 'FAIL'}] CUDA graph capture + replay bit-equal to eager", flush=True)
    return ok and gok


# ---- benchmark -----------------------------------------------------------------------------

def timed(fn, warmup=3, iters=20, reps=5):
    """Median over `iters` samples of (CUDA-event time of `reps` back-to-back calls) / reps."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            fn()
        b.record(); b.synchronize()
        ms.append(a.elapsed_time(b) / reps)
    return statistics.median(ms)


def bench():
    gen = torch.Generator().manual_seed(3)
    print("bench (median ms; GB/s counts the bytes the fused kernel must move)", flush=True)
    # target: forward only, [12288, 4096] bf16
    x = torch.randn(12288, 4096, generator=gen).to("cuda", torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        tc = timed(lambda: rms_norm_composite(x, w, 1e-6))
        tf = timed(lambda: fused_norm_fwd(x, w, 1e-6, save=False))
    gb = 2 * x.numel() * 2 / 1e9
    print(f"  rms_norm fwd [12288, 4096] bf16: composite {tc:.3f}  fused {tf:.3f}  "
          f"({tc / tf:.1f}x, {gb / tf * 1e3:.0f} GB/s)", flush=True)
    # per-head q norm of the target: [4*3072*32, 128]
    xq = torch.randn(4 * 3072 * 32, 128, generator=gen).to("cuda", torch.bfloat16)
    wq = torch.ones(128, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        tc = timed(lambda: rms_norm_composite(xq, wq, 1e-6))
        tf = timed(lambda: fused_norm_fwd(xq, wq, 1e-6, save=False))
    gb = 2 * xq.numel() * 2 / 1e9
    print(f"  rms_norm fwd [393216, 128] bf16: composite {tc:.3f}  fused {tf:.3f}  "
          f"({tc / tf:.1f}x, {gb / tf * 1e3:.0f} GB/s)", flush=True)
    # drafter: [8192, 4096] forward + backward with a trained weight
    x = torch.randn(8192, 4096, generator=gen).to("cuda", torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, generator=gen)).to("cuda", torch.bfloat16)
    dy = torch.randn(8192, 4096, generator=gen).to("cuda", torch.bfloat16)
    xl, wl = x.clone().requires_grad_(True), w.clone().requires_grad_(True)

    def comp_both():
        y = rms_norm_composite(xl, wl, 1e-6)
        torch.autograd.grad(y, (xl, wl), dy)

    def fused_both():
        y, r = fused_norm_fwd(x, w, 1e-6)
        fused_norm_bwd(x, w, r, dy)

    tc, tf = timed(comp_both), timed(fused_both)
    gb = 5 * x.numel() * 2 / 1e9
    print(f"  rms_norm fwd+bwd [8192, 4096] bf16: composite {tc:.3f}  fused {tf:.3f}  "
          f"({tc / tf:.1f}x, {gb / tf * 1e3:.0f} GB/s)", flush=True)
    # the drafter's hidden-size backward alone, as the step runs it: dweight and the residual's
    # gradient summed in place (reads x, dy, add; writes dx: 4 × 64 MiB)
    _, r = fused_norm_fwd(x, w, 1e-6)
    acc = torch.randn_like(dy)
    forms = kernel_lib.forms("norm_rope", SOURCE, _old)
    if _old:  # whether the two give the same bits (a change meant to keep the math)
        outs, add0 = [], torch.randn_like(dy)
        for name, lib_name, src in forms:
            lib(lib_name, src)
            outs.append(fused_norm_bwd(x, w, r, dy, add=add0))
        print(f"  rms_norm bwd + dx_add, this source against the old: dx bit-equal "
              f"{torch.equal(outs[0][0], outs[1][0])}, dw bit-equal {torch.equal(outs[0][1], outs[1][1])}",
              flush=True)
    for rnd in range(2):
        for name, lib_name, src in forms:
            lib(lib_name, src)
            tb = timed(lambda: fused_norm_bwd(x, w, r, dy, add=acc, dx=acc))
            gb = 4 * x.numel() * 2 / 1e9
            print(f"  rms_norm bwd + dx_add [8192, 4096] bf16 ({name} source, round {rnd + 1}): {tb:.3f} "
                  f"({gb / tb * 1e3:.0f} GB/s)", flush=True)
    lib("norm_rope", SOURCE)
    # RoPE [4, 32, 3072, 128] in the model's layout
    xr = torch.randn(4, 3072, 32, 128, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2)
    pos = torch.arange(3072, device="cuda").unsqueeze(0).expand(4, 3072)
    cos, sin = rope_tables(pos, 128)
    with torch.no_grad():
        tc = timed(lambda: apply_rope_composite(xr, cos, sin))
        tf = timed(lambda: fused_rope(xr, cos, sin))
    gb = 2 * xr.numel() * 2 / 1e9
    print(f"  rope fwd [4, 32, 3072, 128] bf16: composite {tc:.3f}  fused {tf:.3f}  "
          f"({tc / tf:.1f}x, {gb / tf * 1e3:.0f} GB/s)", flush=True)
    xl = xr.detach().clone().requires_grad_(True)
    dyr = torch.randn_like(xr)

    def comp_rope_both():
        torch.autograd.grad(apply_rope_composite(xl, cos, sin), xl, dyr)

    def fused_rope_both():
        fused_rope(xr, cos, sin)
        fused_rope(dyr, cos, sin, backward=True)

    tc, tf = timed(comp_rope_both), timed(fused_rope_both)
    print(f"  rope fwd+bwd [4, 32, 3072, 128] bf16: composite {tc:.3f}  fused {tf:.3f}  "
          f"({tc / tf:.1f}x)", flush=True)
    # copy bandwidth ceiling for reference
    big = torch.empty(12288 * 4096 * 2, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(big)
    tcopy = timed(lambda: out.copy_(big))
    print(f"  copy ceiling: {2 * big.numel() * 2 / 1e9 / tcopy * 1e3:.0f} GB/s", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", action="store_true")
    p.add_argument("--bench", action="store_true")
    p.add_argument("--old", metavar="FILE", help="another norm_rope.cu (e.g. `git show REV:gpu/kernels/"
                   "norm_rope.cu > F`): --bench times its hidden-size backward beside this one's")
    args = p.parse_args()
    global _old
    _old = pathlib.Path(args.old).resolve() if args.old else None
    if args.build:
        lib()  # builds (or reuses, when the sources are unchanged) and loads
        return 0
    ok = run_checks()
    if args.bench:
        bench()
    print("ALL PASS" if ok else "SOME FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
