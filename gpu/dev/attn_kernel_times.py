#!/usr/bin/env python3
"""Device time of each DFlash attention backward kernel (torch.profiler), per variant.

Run from tests/gpu on the GPU host (it loads the harness's library, building it if needed):
  python ../../gpu/dev/attn_kernel_times.py [--variants 0,8192,24576] [--docs 1,4] [--reps 5]
The one-launch backward shows as bwd_fused_kernel; the stored-dS form (gpu/dev/stored_ds.patch)
as bwd_dkv_ds_kernel + bwd_dq_kernel (docs/bench.md, seventeenth pass).  Inputs: the harness's
--bench ones (bench_case: B 1, S 3072, N 512, H 32/8, d 128, bf16).  ms a call, averaged over
--reps calls.
"""
import argparse
import re
import sys
import pathlib

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests/gpu"))
import dflash_attention_harness as h  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", default="0,8192,24576")
    ap.add_argument("--docs", default="1,4", help="documents a row, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    for docs in (int(x) for x in args.docs.split(",")):
        q, kc, vc, kb, vb, lo, hi, keep, dout, scale = h.bench_case(docs)
        out, lse = h.kernel_fwd(q, kc, vc, kb, vb, lo, hi, keep, scale)
        for v in (int(x) for x in args.variants.split(",")):
            run = lambda: h.kernel_bwd(q, kc, vc, kb, vb, lo, hi, keep, scale, out, lse, dout, v)  # noqa: E731
            for _ in range(3):
                run()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(args.reps):
                    run()
                torch.cuda.synchronize()
            ms = {}
            for e in p.events():
                if e.device_type.name == "CUDA":
                    m = re.findall(r"(\w+_kernel)", e.name)
                    name = m[0] if m else e.name[:30]
                    ms[name] = ms.get(name, 0.0) + e.device_time_total / 1e3 / args.reps
            print(f"docs {docs} variant {v}: " + ", ".join(f"{k} {x:.3f}" for k, x in ms.items() if x > 0.003),
                  flush=True)


if __name__ == "__main__":
    main()
