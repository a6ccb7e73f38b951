#!/usr/bin/env python3
"""The DFlash forward kernel in chunked mode (gpu/kernels/dflash_attention.hpp: row0 / rows /
q_rows) as the target's causal, document-packed attention: parity against an fp32
reference, then time against FlashAttention-2 varlen (what gpu/models/qwen3_packed.cpp
calls today) at Qwen3-8B shapes.  GPU host, repo root:

  python gpu/dev/target_attention_harness.py [--docs 1,4] [--no-checks] [--variants 0,2048]

A document of L tokens becomes ceil(L / 16) blocks: 16-row chunks, each seeing its
document's earlier tokens as context (ctx_lo = document start, ctx_hi = chunk start) and
its own rows causally.  Tolerances as tests/gpu/dflash_attention_harness.py (out 1e-2, lse
1e-3 relative Frobenius against fp32 on the same bf16 inputs).
"""
import argparse
import ctypes
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
import kernel_lib  # noqa: E402
from dflash_attention_harness import timed  # noqa: E402  (the same median of CUDA-event samples)

SHIM = r'''
#include "gpu/kernels/dflash_attention.hpp"
using namespace tandem::gpu::kernels;
static attn_in in_at(const int64_t* a) { return {reinterpret_cast<const void*>(a[0]), a[1], a[2], a[3]}; }
// a: B, H, Hkv, T, N, d, q[4], k[4], v[4], out[4], lse, ctx_lo, ctx_hi, keep, row0, rows, variant
extern "C" int tandem_attn_chunked(const int64_t* a, float scale, void* stream) {
  dflash_attention_fwd_args f;
  f.shape.batch = int(a[0]); f.shape.heads = int(a[1]); f.shape.kv_heads = int(a[2]);
  f.shape.ctx_len = int(a[3]); f.shape.blocks = int(a[4]); f.shape.block_size = 16;
  f.shape.head_dim = int(a[5]); f.shape.scale = scale; f.shape.dtype = attn_dtype::bf16;
  f.q = in_at(a + 6); f.k_ctx = in_at(a + 10); f.v_ctx = in_at(a + 14);
  f.k_blk = f.k_ctx; f.v_blk = f.v_ctx;
  f.out = {reinterpret_cast<void*>(a[18]), a[19], a[20], a[21]};
  f.lse = reinterpret_cast<float*>(a[22]);
  f.ranges = {reinterpret_cast<const int32_t*>(a[23]), reinterpret_cast<const int32_t*>(a[24]),
              reinterpret_cast<const uint8_t*>(a[25])};
  f.row0 = reinterpret_cast<const int32_t*>(a[26]); f.rows = reinterpret_cast<const int32_t*>(a[27]);
  f.q_rows = int(a[3]); f.variant = int(a[28]);
  return int(dflash_attention_forward(f, static_cast<cudaStream_t>(stream)));
}
'''


def lib():
    l = kernel_lib.load("dflash_attn_chunked", SHIM, [ROOT / "gpu/kernels/dflash_attention.cu"])
    l.tandem_attn_chunked.argtypes = [ctypes.POINTER(ctypes.c_int64), ctypes.c_float, ctypes.c_void_p]
    l.tandem_attn_chunked.restype = ctypes.c_int
    return l


def view4(t):
    assert t.stride(-1) == 1
    return [t.data_ptr(), t.stride(0), t.stride(1), t.stride(2)]


def documents(B, T, docs, gen):
    """Per row, `docs` documents at random cuts (each at least 1 token)."""
    out = []
    for _ in range(B):
        cuts = sorted(torch.randperm(T - 1, generator=gen)[: docs - 1].add(1).tolist())
        bounds = [0] + cuts + [T]
        out.append([(bounds[i], bounds[i + 1]) for i in range(docs)])
    return out


def blocks_of(docs, dev):
    rows = [[(s, c, min(16, e - c)) for s, e in row for c in range(s, e, 16)] for row in docs]
    n = max(len(r) for r in rows)
    lo = torch.zeros(len(rows), n, dtype=torch.int32)
    hi, row0, cnt = lo.clone(), lo.clone(), lo.clone()
    keep = torch.zeros(len(rows), n, dtype=torch.uint8)
    for b, r in enumerate(rows):
        for j, (s, c, k) in enumerate(r):
            lo[b, j], hi[b, j], row0[b, j], cnt[b, j], keep[b, j] = s, c, c, k, 1
    return [t.to(dev) for t in (lo, hi, keep, row0, cnt)], n


def ours(l, q, k, v, blocks, n, scale, variant=0):
    B, T, H, d = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
    lo, hi, keep, row0, cnt = blocks
    args = [B, H, k.shape[2], T, n, d] + view4(q.transpose(1, 2)) + view4(k.transpose(1, 2)) \
        + view4(v.transpose(1, 2)) + view4(out.transpose(1, 2)) \
        + [lse.data_ptr(), lo.data_ptr(), hi.data_ptr(), keep.data_ptr(), row0.data_ptr(), cnt.data_ptr(), variant]
    arr = (ctypes.c_int64 * len(args))(*args)
    rc = l.tandem_attn_chunked(arr, ctypes.c_float(scale), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc != 0:
        raise RuntimeError(f"kernel returned cudaError {rc}")
    return out, lse


def reference(q, k, v, docs, scale):
    """fp32, per document, causal; lse natural log."""
    B, T, H, d = q.shape
    G = H // k.shape[2]
    out = torch.zeros(B, T, H, d, dtype=torch.float32, device=q.device)
    lse = torch.zeros(B, H, T, dtype=torch.float32, device=q.device)
    for b, row in enumerate(docs):
        for s, e in row:
            qq = q[b, s:e].float().transpose(0, 1)
            kk = k[b, s:e].float().transpose(0, 1).repeat_interleave(G, 0)
            vv = v[b, s:e].float().transpose(0, 1).repeat_interleave(G, 0)
            sc = qq @ kk.transpose(1, 2) * scale
            mask = torch.ones(e - s, e - s, dtype=torch.bool, device=q.device).tril()
            sc = sc.masked_fill(~mask, float("-inf"))
            lse[b, :, s:e] = torch.logsumexp(sc, -1)
            out[b, s:e] = (sc.softmax(-1) @ vv).transpose(0, 1)
    return out, lse


def fa2(q, k, v, docs, scale):
    B, T, H, d = q.shape
    lens = [e - s for row in docs for s, e in row]
    cu = torch.tensor([0] + lens, dtype=torch.int32, device=q.device).cumsum(0, dtype=torch.int32)
    mx = max(lens)
    qf, kf, vf = q.reshape(B * T, H, d), k.reshape(B * T, -1, d), v.reshape(B * T, -1, d)
    return lambda: torch.ops.aten._flash_attention_forward(qf, kf, vf, cu, cu, mx, mx, 0.0, True, False,
                                                           scale=scale)




def rel(a, b):
    return ((a.float() - b).norm() / b.norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", default="1,4")
    ap.add_argument("--no-checks", action="store_true")
    ap.add_argument("--variants", default="0", help="the kernels' variant bits, comma-separated "
                    "(gpu/kernels/dflash_attention.cu; the forward's: 2048 its former form, 4096 two blocks a CTA)")
    args = ap.parse_args()
    variants = [int(x) for x in args.variants.split(",")]
    dev = "cuda"
    l = lib()
    gen = torch.Generator().manual_seed(3)
    ok = True
    if not args.no_checks:
        for B, T, docs, H, Hkv in [(2, 300, 3, 8, 2), (1, 517, 1, 32, 8), (2, 1000, 7, 16, 4)]:
            d = 128
            q, k, v = (torch.randn(B, T, h, d, generator=gen).to(dev, torch.bfloat16) for h in (H, Hkv, Hkv))
            dl = documents(B, T, docs, gen)
            blocks, n = blocks_of(dl, dev)
            ro, rl = reference(q, k, v, dl, d ** -0.5)
            for var in variants:
                out, lse = ours(l, q, k, v, blocks, n, d ** -0.5, var)
                e_o, e_l = rel(out, ro), rel(lse, rl)
                good = e_o < 1e-2 and e_l < 1e-3
                ok &= good
                print(f"[{'PASS' if good else 'FAIL'}] B{B} T{T} {docs} docs H{H}/{Hkv} variant {var}: "
                      f"out {e_o:.2e} lse {e_l:.2e}")
    B, T, H, Hkv, d = 4, 3072, 32, 8, 128
    q, k, v = (torch.randn(B, T, h, d, generator=gen).to(dev, torch.bfloat16) for h in (H, Hkv, Hkv))
    for nd in [int(x) for x in args.docs.split(",")]:
        dl = [[(i * T // nd, (i + 1) * T // nd) for i in range(nd)] for _ in range(B)]
        blocks, n = blocks_of(dl, dev)
        pairs = sum((e - s) * (e - s + 1) // 2 for row in dl for s, e in row)
        flop = 4.0 * d * H * pairs
        t_fa2 = timed(fa2(q, k, v, dl, d ** -0.5))
        for var in variants:
            t_ours = timed(lambda: ours(l, q, k, v, blocks, n, d ** -0.5, var))
            print(f"{B} x {T}, {nd} documents a row, one layer: chunked kernel v{var} {t_ours:.3f} ms "
                  f"({flop / t_ours / 1e9:.0f} TFLOP/s), FlashAttention-2 varlen {t_fa2:.3f} ms "
                  f"({flop / t_fa2 / 1e9:.0f} TFLOP/s)")
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
