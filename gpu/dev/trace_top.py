import json, sys, collections
d = json.load(open(sys.argv[1]))
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
tot = collections.Counter(); n = collections.Counter()
for e in d.get("traceEvents", []):
    if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
        tot[e["name"][:110]] += e.get("dur", 0) / 1e3 / steps; n[e["name"][:110]] += 1
for k, v in tot.most_common(14):
    print(f"{v:8.2f} ms {n[k]//steps:4d}x {k}")
