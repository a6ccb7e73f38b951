#!/usr/bin/env python3
"""PyTorch reference for `tandem bench drafter_step --reference` (docs/bench.md).

One DFlash drafter training step in plain PyTorch, at the shapes of the C++
`drafter_step` case: anchors and block layout, the drafter forward (Qwen3
decoder layers with KV injection, DFLASH.md), dense boolean-mask SDPA, full
logits + decay-weighted CE, backward, clip 1.0, AdamW.

Precision (the standard PyTorch AMP recipe): fp32 parameters are the master
weights, the forward and backward run under torch.autocast(bfloat16) on CUDA,
and torch.optim.AdamW(fused=True) updates the fp32 parameters (foreach on the
CPU, where fused needs a recent build; fp32 throughout on the CPU).

Variants (one JSON line each; a line with "error" when one fails), random
weights:
  eager              dense boolean-mask SDPA (kv heads expanded), no compiler
  compiled           the same, torch.compile of the layer stack and of the
                     lm-head + loss (default mode)
  flex-compiled      FlexAttention over the block mask of the step's anchors
                     (GQA without expanding the kv heads; the mask built each
                     step by create_block_mask, as a user must: the anchors
                     change), inside torch.compile of the stack and the loss
  flex-max-autotune  the same with mode="max-autotune" (compiles for minutes)
The default runs eager, compiled and flex-compiled; `best` in each line's
`strongest_so_far` helps pick the strongest Python setup of a call.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SHAPES = {  # must match drafter_step_shapes() in bench/bench.cpp
    "tiny": dict(V=4096, D=256, I=768, H=4, K=2, hd=64, L=2, target_layers=8, S=512, N=32, Bs=16),
    "8b": dict(V=151936, D=4096, I=12288, H=32, K=8, hd=128, L=5, target_layers=36, S=3072, N=512, Bs=16),
    "14b": dict(V=151936, D=5120, I=17408, H=40, K=8, hd=128, L=5, target_layers=40, S=3072, N=512, Bs=16),
}
EPS, THETA, TAPS = 1e-6, 1e6, 5


def rope(x, cos, sin):  # x [B, H, T, hd]; cos/sin [T, hd]
    h = x.shape[-1] // 2
    rot = torch.cat((-x[..., h:], x[..., :h]), dim=-1)
    return x * cos + rot * sin


def attend_sdpa(q, k, v, mask, sh):
    """Dense SDPA: the kv heads expanded, a [1, 1, Q, S+Q] boolean mask."""
    G = sh["H"] // sh["K"]
    k = k.repeat_interleave(G, dim=1)
    v = v.repeat_interleave(G, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sh["hd"] ** -0.5)


def attend_flex(q, k, v, mask, sh):
    """FlexAttention: `mask` is a BlockMask; grouped kv heads as they are."""
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, block_mask=mask, scale=sh["hd"] ** -0.5, enable_gqa=True)


def layer_forward(p, x, ctx, cos_q, sin_q, cos_k, sin_k, mask, sh, attend=attend_sdpa):
    """One Qwen3 decoder layer with KV injection: x [B, Q, D] block states, ctx [B, S, D]."""
    B, Q, D = x.shape
    H, K, hd = sh["H"], sh["K"], sh["hd"]
    h = F.rms_norm(x, (D,), p["in_norm"], EPS)
    kv_in = torch.cat((ctx, h), dim=1)  # [B, S+Q, D]: context keys/values, then the block's
    q = F.linear(h, p["wq"]).view(B, Q, H, hd)
    k = F.linear(kv_in, p["wk"]).view(B, -1, K, hd)
    v = F.linear(kv_in, p["wv"]).view(B, -1, K, hd)
    q = F.rms_norm(q, (hd,), p["q_norm"], EPS).transpose(1, 2)
    k = F.rms_norm(k, (hd,), p["k_norm"], EPS).transpose(1, 2)
    v = v.transpose(1, 2)
    q, k = rope(q, cos_q, sin_q), rope(k, cos_k, sin_k)
    a = attend(q, k, v, mask, sh)
    x = x + F.linear(a.transpose(1, 2).reshape(B, Q, H * hd), p["wo"])
    h = F.rms_norm(x, (D,), p["post_norm"], EPS)
    return x + F.linear(F.silu(F.linear(h, p["wg"])) * F.linear(h, p["wu"]), p["wd"])


def stack_forward(layers, x, ctx, cos_q, sin_q, cos_k, sin_k, mask, sh, attend=attend_sdpa):
    for p in layers:
        x = layer_forward(p, x, ctx, cos_q, sin_q, cos_k, sin_k, mask, sh, attend)
    return x


def head_loss(h, norm, head, labels, weight):
    """Final norm, full fp32 logits, decay-weighted CE."""
    h = F.rms_norm(h, (h.shape[-1],), norm, EPS)
    logits = F.linear(h, head).float()  # [Q, V] fp32
    ce = F.cross_entropy(logits, labels, reduction="none")
    return (ce * weight).sum() / (weight.sum() + 1e-6)


VARIANTS = {  # name: (attention, torch.compile mode or None)
    "eager": ("sdpa", None),
    "compiled": ("sdpa", "default"),
    "flex-compiled": ("flex", "default"),
    "flex-max-autotune": ("flex", "max-autotune"),
}


def make_params(sh, dev, gen):
    D, I, H, K, hd = sh["D"], sh["I"], sh["H"], sh["K"], sh["hd"]

    def w(*shape):
        return (torch.randn(*shape, generator=gen, device=dev) * 0.02).requires_grad_()

    def ones(n):
        return torch.ones(n, device=dev, requires_grad=True)

    layers = [dict(in_norm=ones(D), wq=w(H * hd, D), wk=w(K * hd, D), wv=w(K * hd, D),
                   q_norm=ones(hd), k_norm=ones(hd), wo=w(D, H * hd), post_norm=ones(D),
                   wg=w(I, D), wu=w(I, D), wd=w(D, I)) for _ in range(sh["L"])]
    top = dict(fc=w(D, TAPS * D), hidden_norm=ones(D), norm=ones(D))
    return layers, top


def rope_tables(pos, hd, dtype):
    inv = 1.0 / (THETA ** (torch.arange(0, hd, 2, device=pos.device, dtype=torch.float32) / hd))
    f = pos.to(torch.float32)[:, None] * inv[None, :]
    f = torch.cat((f, f), dim=-1)
    return f.cos().to(dtype), f.sin().to(dtype)


def make_step(name, sh, dev):
    """The variant's training step: step(tokens=None, taps=None) -> the loss (a
    0-d tensor, not read back).  tokens [S] and taps [S, 5·D] default to random
    ones drawn here (bench/reference_pipeline.py passes a target's)."""
    attention, mode = VARIANTS[name]
    compiled = mode is not None
    gen = torch.Generator(device=dev).manual_seed(7)
    cuda = dev.type == "cuda"
    cdt = torch.bfloat16 if cuda else torch.float32
    V, D, S, N, Bs = sh["V"], sh["D"], sh["S"], sh["N"], sh["Bs"]
    Q, gamma, mask_id = N * Bs, {16: 7.0, 10: 5.0, 8: 4.0}.get(Bs, max(1.0, Bs / 2 - 1)), sh["V"] - 1
    layers, top = make_params(sh, dev, gen)
    params = [t for p in layers for t in p.values()] + list(top.values())
    opt = torch.optim.AdamW(params, lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0,
                            fused=cuda, foreach=None if cuda else True)
    embed = torch.randn(V, D, generator=gen, device=dev).mul_(0.02).to(cdt)   # frozen
    head = torch.randn(V, D, generator=gen, device=dev).mul_(0.02).to(cdt)    # frozen
    tokens = torch.randint(V, (1, S), generator=gen, device=dev)
    taps = torch.randn(1, S, TAPS * D, generator=gen, device=dev).to(cdt)
    if attention == "flex":
        from torch.nn.attention.flex_attention import create_block_mask
    if compiled:
        stack = torch.compile(stack_forward, mode=mode)
        loss_fn = torch.compile(head_loss, mode=mode)
    else:
        stack, loss_fn = stack_forward, head_loss
    attend = attend_flex if attention == "flex" else attend_sdpa
    anchor_buf = torch.zeros(N, dtype=torch.long, device=dev)

    def visible(b, h, qi, kv):
        """Query qi (block qi // Bs) sees context keys before its anchor and its own block."""
        blk = (qi // Bs).clamp(max=N - 1)  # rows past Q (FlexAttention pads to its tile) read a real anchor
        return torch.where(kv < S, kv < anchor_buf[blk], (kv - S) // Bs == blk)
    k_in_block = torch.arange(Bs, device=dev)
    wk = torch.exp(-(k_in_block - 1).clamp_min(0).float() / gamma) * (k_in_block > 0)
    cos_c, sin_c = rope_tables(torch.arange(S, device=dev), sh["hd"], cdt)

    def step(tokens=tokens, taps=taps):
        tokens, taps = tokens.reshape(1, S), taps.reshape(1, S, TAPS * D).to(cdt)
        # Anchors: N of the S-Bs+1 candidates (loss on every token), sorted.
        anchors = torch.rand(S - Bs + 1, generator=gen, device=dev).topk(N).indices.sort().values
        pos = (anchors[:, None] + k_in_block[None, :]).reshape(-1)            # [Q]
        ids = torch.full((N, Bs), mask_id, device=dev)
        ids[:, 0] = tokens[0, anchors]
        labels = tokens[0, pos]
        weight = wk.repeat(N)
        if attention == "flex":
            anchor_buf.copy_(anchors)  # one mask_mod for every step: no recompilation
            mask = create_block_mask(visible, None, None, Q, S + Q, device=dev)
        else:
            blk = torch.arange(Q, device=dev) // Bs
            ctx_vis = torch.arange(S, device=dev)[None, :] < anchors[blk][:, None]   # kv < anchor_j
            mask = torch.cat((ctx_vis, blk[:, None] == blk[None, :]), dim=1)[None, None]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            x = embed[ids.reshape(1, Q)]
            ctx = F.rms_norm(F.linear(taps, top["fc"]), (D,), top["hidden_norm"], EPS)
            cos_q, sin_q = rope_tables(pos, sh["hd"], cdt)
            cos_k, sin_k = torch.cat((cos_c, cos_q)), torch.cat((sin_c, sin_q))
            h = stack(layers, x, ctx, cos_q, sin_q, cos_k, sin_k, mask, sh, attend)
            loss = loss_fn(h[0], top["norm"], head, labels, weight)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    info = dict(precision="fp32 params (masters) + autocast bf16, AdamW fused" if cuda
                else "fp32, AdamW foreach",
                attention="flex_attention, block mask of the anchors, grouped kv heads" if attention == "flex"
                else "sdpa dense bool mask, kv heads expanded",
                ce="full fp32 logits", compiled=compiled, compile_mode=mode)
    return step, info


def run_variant(name, sh, dev, args):
    step, info = make_step(name, sh, dev)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(args.warmup):
        loss = step()
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    ms = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        loss = step()
        loss_v = loss.item()  # read-back, as Tandem's step
        sync()
        ms.append((time.perf_counter() - t0) * 1e3)
    med = statistics.median(ms)
    return dict(variant=name, samples_ms=ms, median_ms=med,
                mad_ms=statistics.median(abs(x - med) for x in ms),
                peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else 0.0,
                loss=loss_v, torch=torch.__version__, warmup=args.warmup, iters=args.iters, **info)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="tiny")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--block-size", type=int, default=0,
                    help="the drafter's block size Bs (default: the size's, 16); γ as the trainer's "
                         "default for it (7 at 16, 5 at 10, 4 at 8)")
    ap.add_argument("--variants", default="eager,compiled,flex-compiled",
                    help="comma-separated, of: " + ", ".join(VARIANTS))
    args = ap.parse_args()
    args.warmup = max(args.warmup, 2)  # the compiled variant compiles in its first step
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    torch.backends.cuda.matmul.allow_tf32 = True
    sh = dict(SHAPES[args.size])
    if args.block_size:
        top = sh["S"] - sh["N"] + 1  # N distinct anchors among S - Bs + 1 starts
        if not 2 <= args.block_size <= top:
            ap.error(f"--block-size {args.block_size}: a block size from 2 to {top} at --size {args.size} "
                     f"(S {sh['S']}, N {sh['N']} anchors)")
        sh["Bs"] = args.block_size
    best = None
    for name in args.variants.split(","):
        try:
            if name not in VARIANTS:
                raise ValueError(f"unknown variant '{name}' (one of {', '.join(VARIANTS)})")
            line = run_variant(name, sh, dev, args)
            if best is None or line["median_ms"] < best[1]:
                best = (name, line["median_ms"])
            line["strongest_so_far"] = best[0]
        except Exception as e:  # noqa: BLE001 — reported as a JSON line, then the next variant
            msg = f"{type(e).__name__}: {e}"
            line = dict(variant=name, error=msg[-2000:], torch=torch.__version__)
        print(json.dumps(line), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
