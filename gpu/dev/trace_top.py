# Top kernels of a Chrome trace saved by `tandem bench ... --trace DIR`:
#   python gpu/dev/trace_top.py TRACE.json [STEPS [TOP]]
# prints ms per step and launches per step of the TOP (default 14) kernels by
# total time, names cut at 110 characters; STEPS (default 3) is --profile-steps.
import json, sys, collections
d = json.load(open(sys.argv[1]))
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
top = int(sys.argv[3]) if len(sys.argv) > 3 else 14
tot = collections.Counter(); n = collections.Counter()
for e in d.get("traceEvents", []):
    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
        tot[e["name"][:110]] += e.get("dur", 0) / 1e3 / steps; n[e["name"][:110]] += 1
for k, v in tot.most_common(top):
    print(f"{v:8.2f} ms {n[k]//steps:4d}x {k}")
