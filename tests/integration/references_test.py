#!/usr/bin/env python3
"""The Python references of the benchmarks (bench/reference_*.py) run at
--size tiny on the CPU, eager (FlexAttention has no CPU backward): each prints
one JSON line per variant, with timings, and an unknown variant is a line with
"error" naming it, not a crash (~30 s on 2 cores).

  references_test.py PYTHON SOURCE_DIR
"""
import json
import subprocess
import sys

python, src = sys.argv[1], sys.argv[2]
bad = []


def lines(script, *args):
    cmd = [python, f"{src}/bench/{script}", "--size", "tiny", "--device", "cpu", "--warmup", "1",
           "--iters", "2", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    out = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    if p.returncode != 0:
        bad.append(f"{script} exited with {p.returncode}: {p.stderr[-1000:]}")
    return out


step = lines("reference_step.py", "--variants", "eager,nonsense")
if len(step) != 2 or "error" in step[0] or len(step[0].get("samples_ms", [])) != 2:
    bad.append(f"reference_step eager: {step[:1]}")
if len(step) == 2 and "nonsense" not in step[1].get("error", ""):
    bad.append(f"reference_step: an unknown variant gave {step[1]}")

pipe = lines("reference_pipeline.py", "--variants", "eager,nonsense", "--rows", "2")
if len(pipe) != 2 or "error" in pipe[0]:
    bad.append(f"reference_pipeline eager: {pipe[:1]}")
else:
    p = pipe[0]
    split = p["target_ms_median"] + p["drafter_ms_median"]
    if not (p["sample_ms_median"] > 0 and 0.5 * split <= p["sample_ms_median"] <= 2 * split):
        bad.append(f"reference_pipeline: sample {p['sample_ms_median']} ms against target + drafter {split} ms")
    if p["rows"] != 2 or len(p["samples_ms"]) != 2:
        bad.append(f"reference_pipeline: rows/iters {p['rows']}, {len(p['samples_ms'])}")
    print(f"reference_pipeline eager, tiny: {p['sample_ms_median']:.1f} ms a sample "
          f"(target {p['target_ms_median']:.1f}, drafter {p['drafter_ms_median']:.1f})")
if len(pipe) == 2 and "nonsense" not in pipe[1].get("error", ""):
    bad.append(f"reference_pipeline: an unknown variant gave {pipe[1]}")

tgt = lines("reference_target.py", "--variants", "eager")
if len(tgt) != 1 or "error" in tgt[0]:
    bad.append(f"reference_target eager: {tgt}")

for b in bad:
    print("FAILED:", b)
sys.exit(1 if bad else 0)
