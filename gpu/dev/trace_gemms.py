# Each GEMM launch of one step in a Chrome trace saved by `tandem bench ... --trace DIR`,
# in order, with grid and duration, and the GEMMs summed by grid (issue 20):
#   python gpu/dev/trace_gemms.py TRACE.json [STEPS]
import json, sys, collections
d = json.load(open(sys.argv[1]))
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3
ev = sorted((e for e in d.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])
gemm = [e for e in ev if any(s in e["name"] for s in ("gemm", "Gemm", "sm90_xmma", "cutlass", "nvjet"))]
per = len(gemm) // steps
by = collections.defaultdict(lambda: [0.0, 0])
for e in gemm[-per:]:
    g = tuple(e.get("args", {}).get("grid", []))
    print(f"{e['dur']/1e3:8.3f} ms grid {g} {e['name'][:90]}")
for e in gemm:
    g = tuple(e.get("args", {}).get("grid", []))
    k = (e["name"][:60], g)
    by[k][0] += e["dur"] / 1e3 / steps; by[k][1] += 1
print("--- by kernel and grid, ms a step")
for k, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
    print(f"{ms:8.3f} ms {n//steps:3d}x {k[1]} {k[0]}")
