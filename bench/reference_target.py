#!/usr/bin/env python3
"""PyTorch reference for `tandem bench target_forward` (docs/bench.md).

The work of Tandem's target actor in Hugging Face `transformers`: a Qwen3
model at the size's shapes with random weights in bf16, run up to its
deepest tap (the layers after it are not built), the five taps' hidden
states concatenated, [rows, S, 5·D].  One document a row with plain causal
SDPA: the easiest case for this stack (packed documents need a mask, which
only slows it down), so its strongest showing.

Variants, one JSON line each: `eager` (SDPA), `compiled` (torch.compile,
default mode), `max-autotune` (torch.compile mode="max-autotune"); a line
with "error" when one fails.  tokens_per_s = rows·S / median.
"""
import argparse
import json
import statistics
import sys
import time

import torch

SHAPES = {  # must match shapes_for() in bench/bench.cpp
    "tiny": dict(V=2048, D=256, I=768, H=4, K=2, hd=64, layers=8, rows=2, S=256),
    "8b": dict(V=151936, D=4096, I=12288, H=32, K=8, hd=128, layers=36, rows=4, S=3072),
}


def tap_ids(layers, n=5):  # gpu/io/hf_config.cpp default_tap_ids
    start, span = 1, (layers - 3) - 1
    return [round(start + (i * span) / (n - 1)) for i in range(n)]


def build(sh, dev):
    from transformers import Qwen3Config, Qwen3Model
    taps = tap_ids(sh["layers"])
    cfg = Qwen3Config(vocab_size=sh["V"], hidden_size=sh["D"], intermediate_size=sh["I"],
                      num_attention_heads=sh["H"], num_key_value_heads=sh["K"], head_dim=sh["hd"],
                      num_hidden_layers=max(taps) + 1, max_position_embeddings=40960,
                      rope_theta=1e6, rms_norm_eps=1e-6, attn_implementation="sdpa")
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(dev):
            model = Qwen3Model(cfg).eval()
    finally:
        torch.set_default_dtype(old)
    return model, taps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--variants", default="eager,compiled,max-autotune")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.set_device(dev)

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)
    sh = SHAPES[args.size]
    model, taps = build(sh, dev)
    ids = torch.randint(sh["V"], (sh["rows"], sh["S"]), device=dev)

    def forward(m):
        with torch.no_grad():
            hs = m(input_ids=ids, output_hidden_states=True, use_cache=False).hidden_states
            return torch.cat([hs[i + 1] for i in taps], dim=-1)

    for name in args.variants.split(","):
        try:
            t0 = time.perf_counter()
            if name == "eager":
                m = model
            elif name == "compiled":
                m = torch.compile(model)
            elif name == "max-autotune":
                m = torch.compile(model, mode="max-autotune")
            else:
                raise ValueError(f"unknown variant {name}")
            for _ in range(max(args.warmup, 2)):
                forward(m)
            sync()
            warm_s = time.perf_counter() - t0
            if cuda:
                torch.cuda.reset_peak_memory_stats(dev)
            ms = []
            for _ in range(args.iters):
                a = time.perf_counter()
                forward(m)
                sync()
                ms.append((time.perf_counter() - a) * 1e3)
            med = statistics.median(ms)
            line = dict(case="target_forward_reference", variant=name, size=args.size,
                        shapes=dict(rows=sh["rows"], seq=sh["S"], layers_run=max(taps) + 1, taps=taps),
                        median_ms=med, mad_ms=statistics.median(abs(x - med) for x in ms), samples_ms=ms,
                        tokens_per_s=sh["rows"] * sh["S"] / (med / 1e3), warmup_s=warm_s,
                        peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else 0.0,
                        torch=torch.__version__, attention="sdpa causal, one document a row")
        except Exception as e:  # noqa: BLE001 — reported as a JSON line, then the next variant
            line = dict(case="target_forward_reference", variant=name, error=f"{type(e).__name__}: {e}"[-2000:])
        print(json.dumps(line), flush=True)
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
