#!/usr/bin/env python3
"""Which attention for the target's forward (issue 20): causal within each
document of a packed row, Qwen3-8B heads (32 query, 8 kv, d 128), bf16.

Times, on the same GPU in one process, the candidates PyTorch 2.11 ships:
  dense_mask   SDPA with a [B, 1, S, S] bool mask, kv heads expanded (the
               engine's path before issue 20)
  sdpa_causal  SDPA is_causal, kv heads expanded (one document a row only)
  fa2_varlen   aten::_flash_attention_forward over cu_seqlens, GQA native
  cudnn        aten::_cudnn_attention_forward, causal (one document a row),
               and ragged over cu_seqlens (packed)
  flex         FlexAttention compiled, document mask (the Python reference)
Prints one JSON line per candidate: median ms, useful TFLOP/s (4·d FLOP per
visible (query, key) pair and head), max |diff| against dense_mask in fp32.
Experiment only (gpu/dev/): the winner moves into gpu/.
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F

B, S, H, K, D = 4, 3072, 32, 8, 128
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def timeit(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


def run(docs):
    lens = torch.full((B, docs), S // docs, dtype=torch.int64)
    lens[:, -1] += S - lens.sum(1)
    pairs = float((lens * (lens + 1) // 2).sum())
    flop = 4.0 * D * H * pairs
    q = torch.randn(B * S, H, D, device=dev, dtype=torch.bfloat16, generator=g)
    k = torch.randn(B * S, K, D, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(B * S, K, D, device=dev, dtype=torch.bfloat16, generator=g)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.flatten().cumsum(0)]).to(dev, torch.int32)
    seg = torch.repeat_interleave(torch.arange(B * docs), lens.flatten()).to(dev).view(B, S)
    idx = torch.arange(S, device=dev)
    mask = ((idx[:, None] >= idx[None, :]) & (seg[:, :, None] == seg[:, None, :]))[:, None]
    qb = q.view(B, S, H, D).transpose(1, 2)
    kb = k.view(B, S, K, D).transpose(1, 2)
    vb = v.view(B, S, K, D).transpose(1, 2)
    ref = F.scaled_dot_product_attention(qb.float(), kb.float().repeat_interleave(H // K, 1),
                                         vb.float().repeat_interleave(H // K, 1), attn_mask=mask)
    ref = ref.transpose(1, 2).reshape(B * S, H, D)
    out = {}

    def report(name, fn):
        try:
            o = fn().reshape(B * S, H, D).float()
            diff = (o - ref).abs().max().item()
            ms = timeit(fn)
            line = dict(docs=docs, variant=name, median_ms=ms, tflops=flop / ms / 1e9, max_abs_diff=diff)
        except Exception as e:  # noqa: BLE001
            line = dict(docs=docs, variant=name, error=f"{type(e).__name__}: {e}"[:400])
        print(json.dumps(line), flush=True)
        out[name] = line

    def dense():
        a = F.scaled_dot_product_attention(qb, kb.repeat_interleave(H // K, 1), vb.repeat_interleave(H // K, 1),
                                           attn_mask=mask)
        return a.transpose(1, 2)
    report("dense_mask", dense)
    if docs == 1:
        report("sdpa_causal", lambda: F.scaled_dot_product_attention(
            qb, kb.repeat_interleave(H // K, 1), vb.repeat_interleave(H // K, 1), is_causal=True).transpose(1, 2))
        report("cudnn_causal", lambda: torch.ops.aten._cudnn_attention_forward(
            qb, kb.repeat_interleave(H // K, 1), vb.repeat_interleave(H // K, 1), None, None, None, S, S, False,
            0.0, True)[0].transpose(1, 2))
        report("cudnn_causal_gqa", lambda: torch.ops.aten._cudnn_attention_forward(
            qb, kb, vb, None, None, None, S, S, False, 0.0, True)[0].transpose(1, 2))
    report("fa2_varlen", lambda: torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, S, S, 0.0, True, False)[0])
    report("cudnn_ragged", lambda: torch.ops.aten._cudnn_attention_forward(
        q, k, v, None, cu, cu, S, S, False, 0.0, True)[0])
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        segf = seg

        def doc_causal(b, h, qi, ki):
            return (qi >= ki) & (segf[b, qi] == segf[b, ki])
        bm = create_block_mask(doc_causal, B, None, S, S, device=dev)
        flex = torch.compile(flex_attention)
        report("flex", lambda: flex(qb, kb, vb, block_mask=bm, enable_gqa=True).transpose(1, 2))
    except Exception as e:  # noqa: BLE001
        print(json.dumps(dict(docs=docs, variant="flex", error=str(e)[:400])), flush=True)


if __name__ == "__main__":
    print(json.dumps(dict(torch=torch.__version__, device=torch.cuda.get_device_name(),
                          cudnn=torch.backends.cudnn.version())), flush=True)
    for docs in (1, 4):
        run(docs)
    sys.exit(0)
