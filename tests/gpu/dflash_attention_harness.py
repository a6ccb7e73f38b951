#!/usr/bin/env python3
"""Standalone GPU harness for gpu/kernels/dflash_attention.cu (no project build needed).

Versions: torch 2.11 (+cu130), nvcc 13.0, sm_90a (H100/H200).

  build:  python tests/gpu/dflash_attention_harness.py --build
          compiles the kernel plus a tiny C shim (below) into build-harness/dflash_attn/libdflash_attn.so
          (static cudart, so it runs wherever a CUDA 13 driver is).
  run:    python tests/gpu/dflash_attention_harness.py [--bench] [--flex] [--docs N]
          loads the library through ctypes (building it if missing), checks forward output,
          log-sum-exp and all five gradients against a float32 dense PyTorch reference on
          several shapes, then (--bench) times forward and backward at the Qwen3-8B shape
          (N documents a row, default 4) against dense-mask SDPA (and FlexAttention with
          --flex).
  A/B:    --source OLD.cu builds another version of the kernel file (for example
          `git show REV:gpu/kernels/dflash_attention.cu > /tmp/old.cu`) into its own library;
          run --bench --no-checks once with it and once without, in one session.

Tolerances (relative Frobenius error ||ours - ref|| / ||ref||, bf16/fp16 inputs, fp32
reference on the same rounded inputs): output 1e-2, LSE 1e-3, gradients 2e-2.  bf16 has an
8-bit mantissa (2^-9 ~ 2e-3 per rounding); P and dS are rounded to bf16 before the second
matmul of each pair, so ~5e-3 is typical and 1e-2 / 2e-2 leave margin while still failing
any indexing or masking error (those give O(1)).
"""
import argparse
import ctypes
import pathlib
import statistics
import sys

import torch

import kernel_lib

ROOT = pathlib.Path(__file__).resolve().parents[2]
BS = 16

SHIM = r'''
#include "gpu/kernels/dflash_attention.hpp"
using namespace tandem::gpu::kernels;

static attn_in in_at(const int64_t* a) { return {reinterpret_cast<const void*>(a[0]), a[1], a[2], a[3]}; }
static attn_out out_at(const int64_t* a) { return {reinterpret_cast<void*>(a[0]), a[1], a[2], a[3]}; }
static dflash_attention_shape shape_at(const int64_t* a, float scale) {
  dflash_attention_shape s;
  s.batch = int(a[0]); s.heads = int(a[1]); s.kv_heads = int(a[2]); s.ctx_len = int(a[3]);
  s.blocks = int(a[4]); s.block_size = int(a[5]); s.head_dim = int(a[6]); s.scale = scale;
  s.dtype = a[7] == 0 ? attn_dtype::bf16 : attn_dtype::fp16;
  return s;
}
static dflash_ranges ranges_at(const int64_t* a) {
  return {reinterpret_cast<const int32_t*>(a[0]), reinterpret_cast<const int32_t*>(a[1]),
          reinterpret_cast<const uint8_t*>(a[2])};
}

// a: shape[9] (last: variant), q, kc, vc, kb, vb (4 each), ranges[3], out[4], lse
extern "C" int tandem_attn_fwd(const int64_t* a, float scale, void* stream) {
  dflash_attention_fwd_args f;
  f.shape = shape_at(a, scale); f.variant = int(a[8]);
  f.q = in_at(a + 9); f.k_ctx = in_at(a + 13); f.v_ctx = in_at(a + 17);
  f.k_blk = in_at(a + 21); f.v_blk = in_at(a + 25); f.ranges = ranges_at(a + 29);
  f.out = out_at(a + 32); f.lse = reinterpret_cast<float*>(a[36]);
  return int(dflash_attention_forward(f, static_cast<cudaStream_t>(stream)));
}

// a: shape[9], q, kc, vc, kb, vb, out, dout (4 each), lse, ranges[3], delta, dq, dkc, dvc, dkb, dvb
extern "C" int tandem_attn_bwd(const int64_t* a, float scale, void* stream) {
  dflash_attention_bwd_args f;
  f.shape = shape_at(a, scale); f.variant = int(a[8]);
  f.q = in_at(a + 9); f.k_ctx = in_at(a + 13); f.v_ctx = in_at(a + 17);
  f.k_blk = in_at(a + 21); f.v_blk = in_at(a + 25); f.out = in_at(a + 29); f.dout = in_at(a + 33);
  f.lse = reinterpret_cast<const float*>(a[37]); f.ranges = ranges_at(a + 38);
  f.delta = reinterpret_cast<float*>(a[41]);
  f.dq = out_at(a + 42); f.dk_ctx = out_at(a + 46); f.dv_ctx = out_at(a + 50);
  f.dk_blk = out_at(a + 54); f.dv_blk = out_at(a + 58);
  return int(dflash_attention_backward(f, static_cast<cudaStream_t>(stream)));
}
'''




_lib = None
SOURCE = ROOT / "gpu/kernels/dflash_attention.cu"  # --source: another version, for an A/B


def lib():
    global _lib
    if _lib is None:
        name = "dflash_attn" if SOURCE == ROOT / "gpu/kernels/dflash_attention.cu" else "dflash_attn_alt"
        _lib = kernel_lib.load(name, SHIM, [SOURCE])
        for f in (_lib.tandem_attn_fwd, _lib.tandem_attn_bwd):
            f.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_void_p]
            f.restype = ctypes.c_int
    return _lib


def view4(t):
    assert t.stride(-1) == 1
    return [t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)]


def shape_args(q, kc, variant):
    B, H, Q, d = q.shape
    return [B, H, kc.shape[1], kc.shape[2], Q // BS, BS, d,
            0 if q.dtype == torch.bfloat16 else 1, variant]


def empty_bqhd(B, H, T, d, dtype, device):
    """[B, H, T, d] view over [B, T, H, d] memory (the layout dflash.cpp hands out)."""
    return torch.empty(B, T, H, d, dtype=dtype, device=device).transpose(1, 2)


def call(fn, args, scale):
    arr = (ctypes.c_int64 * len(args))(*args)
    rc = fn(arr, ctypes.c_float(scale), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"kernel returned cudaError {rc}")


def kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale, variant=0, poison=False):
    B, H, Q, d = q.shape
    out = empty_bqhd(B, H, Q, d, q.dtype, q.device)
    lse = torch.empty(B, H, Q, dtype=torch.float32, device=q.device)
    if poison:
        out.fill_(float("nan")); lse.fill_(float("nan"))
    args = shape_args(q, kc, variant) + view4(q) + view4(kc) + view4(vc) + view4(kb) + view4(vb) \
        + [lo.data_ptr(), hi.data_ptr(), keep.data_ptr()] + view4(out) + [lse.data_ptr()]
    call(lib().tandem_attn_fwd, args, scale)
    return out, lse


def kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout, variant=0, poison=False):
    B, H, Q, d = q.shape
    Hkv, S = kc.shape[1], kc.shape[2]
    delta = torch.empty(B, H, Q, dtype=torch.float32, device=q.device)
    dq = empty_bqhd(B, H, Q, d, q.dtype, q.device)
    dkc = empty_bqhd(B, Hkv, S, d, q.dtype, q.device)
    dvc = empty_bqhd(B, Hkv, S, d, q.dtype, q.device)
    dkb = empty_bqhd(B, Hkv, Q, d, q.dtype, q.device)
    dvb = empty_bqhd(B, Hkv, Q, d, q.dtype, q.device)
    if poison:
        for t in (delta, dq, dkc, dvc, dkb, dvb):
            t.fill_(float("nan"))
    args = shape_args(q, kc, variant) + view4(q) + view4(kc) + view4(vc) + view4(kb) + view4(vb) \
        + view4(out) + view4(dout) + [lse.data_ptr(), lo.data_ptr(), hi.data_ptr(), keep.data_ptr(),
                                      delta.data_ptr()] \
        + view4(dq) + view4(dkc) + view4(dvc) + view4(dkb) + view4(dvb)
    call(lib().tandem_attn_bwd, args, scale)
    return dq, dkc, dvc, dkb, dvb


# ---- reference ---------------------------------------------------------------------------

def dense_mask(lo, hi, keep, S, N):
    """[B, 1, Q, S+Q] bool: the layout of gpu/models/dflash_objective.cpp with keep applied to
    the whole row (a padding block sees nothing)."""
    dev = lo.device
    Q = N * BS
    j = torch.arange(Q, device=dev) // BS
    lo_q, hi_q, keep_q = lo.long()[:, j], hi.long()[:, j], keep.bool()[:, j]  # [B, Q]
    c = torch.arange(S, device=dev)
    ctx = (c[None, None, :] >= lo_q[:, :, None]) & (c[None, None, :] < hi_q[:, :, None])
    blk = (j[:, None] == j[None, :]).unsqueeze(0).expand(lo.shape[0], Q, Q)
    return ((torch.cat([ctx, blk], 2)) & keep_q[:, :, None]).unsqueeze(1)


def reference(q, kc, vc, kb, vb, lo, hi, keep, scale, dout):
    """float32 dense attention with autograd: out, lse, and the five gradients."""
    B, H, Q, d = q.shape
    Hkv, S = kc.shape[1], kc.shape[2]
    leaves = [t.detach().float().requires_grad_(True) for t in (q, kc, vc, kb, vb)]
    qf, kcf, vcf, kbf, vbf = leaves
    G = H // Hkv
    k = torch.cat([kcf, kbf], 2).repeat_interleave(G, 1)
    v = torch.cat([vcf, vbf], 2).repeat_interleave(G, 1)
    mask = dense_mask(lo, hi, keep, S, Q // BS)
    s = (qf @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1))
    out = p @ v
    out.backward(dout.float())
    return out.detach(), lse.detach(), [t.grad for t in leaves]


def rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


# ---- inputs --------------------------------------------------------------------------------

def make_ranges(B, S, N, docs, gen, device, padding=0, sorted_anchors=True):
    """Anchors as the objective draws them: per row `docs` documents, loss mask on the second
    half of each, N anchors sorted ascending, `padding` trailing blocks with keep = 0.  A few
    anchors sit at a document's first token (empty context range)."""
    lo = torch.zeros(B, N, dtype=torch.int32)
    hi = torch.zeros(B, N, dtype=torch.int32)
    keep = torch.zeros(B, N, dtype=torch.uint8)
    for b in range(B):
        cuts = sorted(torch.randperm(S - 1, generator=gen)[: docs - 1].add(1).tolist())
        bounds = [0] + cuts + [S]
        starts, cands = [], []
        for a0, a1 in zip(bounds[:-1], bounds[1:]):
            cands += list(range((a0 + a1) // 2, min(a1 - 1, S - BS + 1)))
            cands.append(a0)  # an anchor at a document start: empty context
            starts.append(a0)
        n = N - padding
        pick = torch.randperm(len(cands), generator=gen)[:n]
        anchors = sorted(cands[i] for i in pick.tolist())
        if not sorted_anchors:
            anchors = [anchors[i] for i in torch.randperm(len(anchors), generator=gen).tolist()]
        for j, a in enumerate(anchors):
            start = max(s for s in starts if s <= a)
            lo[b, j], hi[b, j], keep[b, j] = start, a, 1
    return lo.to(device), hi.to(device), keep.to(device)


def make_inputs(B, H, Hkv, S, N, d, dtype, gen, device):
    Q = N * BS
    # The drafter's layout: [B, T, heads, d] memory seen as [B, heads, T, d].
    def r(heads, T):
        return torch.randn(B, T, heads, d, generator=gen).to(device, dtype).transpose(1, 2)
    return r(H, Q), r(Hkv, S), r(Hkv, S), r(Hkv, Q), r(Hkv, Q)


# ---- checks --------------------------------------------------------------------------------

TOL = {"out": 1e-2, "lse": 1e-3, "grad": 2e-2}

# Kernel variants (dflash_attention.cu, bf16 d=128 only): bit 0 eight-warp CTAs, bit 1
# separate backward launches, bit 2 one head per key-major item, bit 3 64-key dq tiles,
# bits 4 / 5 (with 1) skip the key-major / query-major role (timing only), bit 6 mma.sync
# everywhere instead of wgmma (d 128, G a multiple of 4), bit 7 the query-major role with mma.sync,
# bit 8 the one-launch backward's key-major CTAs longest first, bit 9 the key-major role with
# a CTA barrier an item instead of a full and an empty barrier a stage (the scheme before),
# bit 11 the forward's former wgmma form (one block a CTA, a CTA barrier a tile) instead of
# the staged one (stage barriers, three blocks a CTA sharing each K/V tile at G 4; at G 8 a
# block's two warpgroups), bit 12 the staged forward with two blocks a CTA.
VARIANTS = [0, 1, 2, 4, 8, 2 | 16, 2 | 32, 64, 128, 256, 512, 2 | 512, 2 | 16 | 64, 2 | 32 | 64, 2 | 4 | 32 | 64,
            2048, 4096]


def check(name, B, H, Hkv, S, N, d, docs, padding, dtype=torch.bfloat16, variant=0,
          sorted_anchors=True, seed=0):
    dev = "cuda"
    gen = torch.Generator().manual_seed(seed)
    q, kc, vc, kb, vb = make_inputs(B, H, Hkv, S, N, d, dtype, gen, dev)
    lo, hi, keep = make_ranges(B, S, N, docs, gen, dev, padding, sorted_anchors)
    dout = torch.randn(B, N * BS, H, d, generator=gen).to(dev, dtype).transpose(1, 2)
    scale = d ** -0.5
    out, lse = kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale, variant, poison=True)
    grads = kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout, variant, poison=True)
    grads2 = kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout, variant)
    torch.cuda.synchronize()
    r_out, r_lse, r_grads = reference(q, kc, vc, kb, vb, lo, hi, keep, scale, dout)
    fails = []
    pad_rows = (~keep.bool()).repeat_interleave(BS, 1)  # [B, Q]
    finite = torch.isfinite(r_lse)
    res = {"out": rel(out, r_out)}
    if not torch.equal(torch.isfinite(lse), finite):
        fails.append("lse: -inf pattern differs")
    res["lse"] = rel(lse[finite], r_lse[finite])
    for n_, g_, rg in zip(("dq", "dk_ctx", "dv_ctx", "dk_blk", "dv_blk"), grads, r_grads):
        res[n_] = rel(g_, rg)
        if not torch.isfinite(g_).all():
            fails.append(f"{n_}: non-finite")
    for key, e in res.items():
        tol = TOL["out"] if key == "out" else TOL["lse"] if key == "lse" else TOL["grad"]
        if not e <= tol:
            fails.append(f"{key} rel {e:.2e} > {tol:.0e}")
    if not torch.isfinite(out).all():
        fails.append("out: non-finite")
    if pad_rows.any():
        pad_out = out.transpose(1, 2)[pad_rows]  # [rows, H, d]
        if pad_out.abs().max().item() != 0:
            fails.append("padding rows not exactly 0")
        if grads[0].transpose(1, 2)[pad_rows].abs().max().item() != 0:
            fails.append("padding dq not exactly 0")
    if not all(torch.equal(a, b) for a, b in zip(grads, grads2)):
        fails.append("backward not deterministic")
    status = "PASS" if not fails else "FAIL"
    print(f"[{status}] {name}: " + " ".join(f"{k} {v:.2e}" for k, v in res.items())
          + ("" if not fails else "  <- " + "; ".join(fails)), flush=True)
    return not fails


def check_graph():
    """Forward + backward captured in one CUDA graph, replayed: bit-equal to eager."""
    gen = torch.Generator().manual_seed(3)
    q, kc, vc, kb, vb = make_inputs(2, 8, 2, 1000, 64, 128, torch.bfloat16, gen, "cuda")
    lo, hi, keep = make_ranges(2, 1000, 64, 3, gen, "cuda", 5)
    dout = torch.randn(2, 1024, 8, 128, generator=gen).to("cuda", torch.bfloat16).transpose(1, 2)
    scale = 128 ** -0.5

    def step():
        out, lse = kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale)
        return (out, lse) + kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout)

    eager = step()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    torch.cuda.synchronize()
    ok = all(torch.equal(a, b) for a, b in zip(eager, captured))
    print(f"[{'PASS' if ok else 'FAIL'}] CUDA graph capture + replay bit-equal to eager", flush=True)
    return ok


def run_checks():
    ok = True
    ok &= check_graph()
    ok &= check("small B1 H4/2 d64 S77 N6 (1 padding)", 1, 4, 2, 77, 6, 64, 2, 1)
    ok &= check("mid B2 H8/2 d128 S1000 N64 (3 docs, 5 padding)", 2, 8, 2, 1000, 64, 128, 3, 5)
    for v in VARIANTS[1:]:
        if not v & 48:  # 16 / 32 skip a role (timing only)
            ok &= check(f"mid variant {v}", 2, 8, 2, 1000, 64, 128, 3, 5, variant=v)
    ok &= check("mid fp16", 2, 8, 2, 1000, 64, 128, 3, 5, dtype=torch.float16)
    ok &= check("G1 d32 S300 N20", 2, 4, 4, 300, 20, 32, 2, 3)
    ok &= check("G8 d128 S513 N33", 1, 16, 2, 513, 33, 128, 4, 2)
    ok &= check("G8 d128 S513 N33 variant 64", 1, 16, 2, 513, 33, 128, 4, 2, variant=64)
    ok &= check("G8 d128 S513 N33 variant 2048", 1, 16, 2, 513, 33, 128, 4, 2, variant=2048)
    for v in (2048, 4096):
        ok &= check(f"G4 d128 unsorted anchors variant {v}", 2, 8, 2, 700, 40, 128, 3, 4,
                    sorted_anchors=False, variant=v)
    ok &= check("G2 d64 unsorted anchors", 2, 4, 2, 700, 40, 64, 3, 4, sorted_anchors=False)
    ok &= check("no context S=16 N3", 1, 4, 1, 16, 3, 64, 1, 0)
    return ok


# ---- benchmark -----------------------------------------------------------------------------

def timed(fn, warmup=3, iters=20, reps=5):
    """Median over `iters` samples of (CUDA-event time of `reps` back-to-back calls) / reps:
    the host's launch overhead overlaps the device work instead of adding to it."""
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


def bench_case(docs=4, heads=(32, 8)):
    """The --bench inputs (Qwen3-8B shapes: B 1, S 3072, N 512, d 128, bf16; `docs` documents a
    row; seeded): q, kc, vc, kb, vb, lo, hi, keep, dout, scale."""
    dev = "cuda"
    B, S, N, d = 1, 3072, 512, 128
    H, Hkv = heads
    gen = torch.Generator().manual_seed(1)
    q, kc, vc, kb, vb = make_inputs(B, H, Hkv, S, N, d, torch.bfloat16, gen, dev)
    lo, hi, keep = make_ranges(B, S, N, docs, gen, dev, padding=0)
    dout = torch.randn(B, N * BS, H, d, generator=gen).to(dev, torch.bfloat16).transpose(1, 2)
    return q, kc, vc, kb, vb, lo, hi, keep, dout, d ** -0.5


def bench(flex, docs=4, variants=None, heads=(32, 8), dense=True):
    dev = "cuda"
    q, kc, vc, kb, vb, lo, hi, keep, dout, scale = bench_case(docs, heads)
    B, H, Q, d = q.shape
    Hkv, S, N = kc.shape[1], kc.shape[2], Q // BS
    pairs = ((hi - lo).long().clamp_min(0) * keep.long() + BS * keep.long()).sum().item() * BS
    fwd_flop = 4.0 * d * H * pairs
    bwd_flop = 2.5 * fwd_flop
    print(f"bench {SOURCE.name} B{B} S{S} N{N} H{H}/{Hkv} d{d}, {docs} documents: visible pairs/head {pairs:.3e} "
          f"(dense {Q * (S + Q):.3e}), fwd {fwd_flop / 1e9:.1f} GFLOP, bwd {bwd_flop / 1e9:.1f} GFLOP")
    rows = []
    for variant in variants if variants is not None else VARIANTS:
        out, lse = kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale, variant)
        t_f = timed(lambda: kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale, variant))
        t_b = timed(lambda: kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout, variant))
        rows.append((f"kernel v{variant}", t_f, t_b))
    G = H // Hkv
    leaves = [t.detach().requires_grad_(True) for t in (q, kc, vc, kb, vb)]
    # Dense-mask SDPA, as dflash.cpp did: bool mask, kv heads expanded.
    mask = dense_mask(lo, hi, keep, S, N)

    def sdpa_fwd():
        k = torch.cat([leaves[1], leaves[3]], 2).repeat_interleave(G, 1)
        v = torch.cat([leaves[2], leaves[4]], 2).repeat_interleave(G, 1)
        return torch.nn.functional.scaled_dot_product_attention(leaves[0], k, v, attn_mask=mask, scale=scale)

    def sdpa_both():
        o = sdpa_fwd()
        torch.autograd.grad(o, leaves, dout)

    if dense:
        with torch.no_grad():
            t_f = timed(sdpa_fwd, iters=10, reps=2)
        t_fb = timed(sdpa_both, iters=10, reps=2)
        rows.append(("sdpa dense mask", t_f, t_fb - t_f))
    if flex:
        try:
            from torch.nn.attention.flex_attention import flex_attention, create_block_mask
            lo_l, hi_l, keep_b = lo.long(), hi.long(), keep.bool()

            def mask_mod(b, h, qi, kv):
                j = qi // BS
                ctx = (kv < S) & (kv >= lo_l[b, j]) & (kv < hi_l[b, j])
                blk = (kv >= S) & ((kv - S) // BS == j)
                return (ctx | blk) & keep_b[b, j]

            bm = create_block_mask(mask_mod, B, None, Q, S + Q, device=dev)
            fa = torch.compile(flex_attention)

            def flex_fwd():
                k = torch.cat([leaves[1], leaves[3]], 2)
                v = torch.cat([leaves[2], leaves[4]], 2)
                return fa(leaves[0], k, v, block_mask=bm, scale=scale, enable_gqa=True)

            def flex_both():
                o = flex_fwd()
                torch.autograd.grad(o, leaves, dout)

            with torch.no_grad():
                t_f = timed(flex_fwd, iters=20)
            t_fb = timed(flex_both, iters=20)
            rows.append(("flex_attention", t_f, t_fb - t_f))
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"flex_attention failed: {type(e).__name__}: {e}"[:400])
    print(f"{'path':<18} {'fwd ms':>8} {'bwd ms':>8} {'total':>8} {'fwd TF/s':>9} {'bwd TF/s':>9}")
    for name, tf, tb in rows:
        print(f"{name:<18} {tf:8.3f} {tb:8.3f} {tf + tb:8.3f} {fwd_flop / tf / 1e9:9.1f} "
              f"{bwd_flop / tb / 1e9:9.1f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", action="store_true", help="only compile the library")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--flex", action="store_true")
    ap.add_argument("--docs", type=int, default=4, help="--bench: documents a row (1: one staircase)")
    ap.add_argument("--variants", help="--bench: comma-separated variant numbers (default: all)")
    ap.add_argument("--no-checks", action="store_true", help="--bench only, without the parity checks")
    ap.add_argument("--heads", default="32/8",
                    help="--bench: query heads / kv heads, comma-separated for several (default 32/8, Qwen3-8B; "
                         "Qwen3-14B's 40/8 is a group of 5, which the kernels take as 64/8 with the query "
                         "heads padded or 40/40 with the kv heads repeated)")
    ap.add_argument("--no-dense", action="store_true", help="--bench: skip the dense-mask SDPA line")
    ap.add_argument("--source", type=pathlib.Path,
                    help="build this version of dflash_attention.cu instead (an A/B against the tree's)")
    args = ap.parse_args()
    if args.source:
        global SOURCE
        SOURCE = args.source.resolve()
    if args.build:
        lib()  # builds (or reuses, when the sources are unchanged) and loads
        return 0
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    ok = True if args.no_checks else run_checks()
    if args.bench:
        for heads in args.heads.split(","):
            h, hkv = (int(x) for x in heads.split("/"))
            bench(args.flex, args.docs,
                  [int(v) for v in args.variants.split(",")] if args.variants else None,
                  (h, hkv), not args.no_dense)
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
