#!/usr/bin/env python3
"""Do bench/reference_step.py's variants compute the same step?  Each variant
from the same seed (same weights, tokens, taps and anchors): the losses of its
first steps, side by side (the first before any update).  On a GPU:
  python gpu/dev/flex_reference_check.py --size tiny|8b [--steps 3]
Prints one JSON line per variant and the largest relative difference of each
step's loss to the eager variant's."""
import argparse, json, os, sys
import torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import reference_step as r

ap = argparse.ArgumentParser()
ap.add_argument("--size", default="tiny")
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--variants", default="eager,compiled,flex-compiled")
a = ap.parse_args()
dev = torch.device("cuda:0")
losses = {}
for v in a.variants.split(","):
    step, _ = r.make_step(v, r.SHAPES[a.size], dev)
    losses[v] = [step().item() for _ in range(a.steps)]
    print(json.dumps({"variant": v, "losses": losses[v]}), flush=True)
    torch.cuda.empty_cache()
base = losses[a.variants.split(",")[0]]
for v, l in losses.items():
    print(v, "max relative difference to", a.variants.split(",")[0], max(abs(x - y) / abs(y) for x, y in zip(l, base)))
