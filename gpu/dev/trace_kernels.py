# Every kernel of a Chrome trace saved by `tandem bench ... --trace DIR`, summed by
# name over the trace's STEPS profiled steps (ms a step, launches a step, mean µs a
# launch), longest first; GEMMs last as one line unless --gemms (issue 20: where the
# non-GEMM time goes, kernel by kernel):
#   python gpu/dev/trace_kernels.py TRACE.json [STEPS] [--gemms]
import json, sys, collections
args = [a for a in sys.argv[1:] if not a.startswith("--")]
d = json.load(open(args[0]))
steps = int(args[1]) if len(args) > 1 else 3
ev = [e for e in d.get("traceEvents", []) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
is_gemm = lambda n: any(s in n for s in ("gemm", "Gemm", "sm90_xmma", "cutlass", "nvjet"))
by = collections.defaultdict(lambda: [0.0, 0])
for e in ev:
    n = e["name"]
    k = "(every GEMM)" if is_gemm(n) and "--gemms" not in sys.argv else n[:110]
    by[k][0] += e["dur"] / 1e3 / steps
    by[k][1] += 1
total = sum(v[0] for v in by.values())
print(f"{total:9.3f} ms a step in {sum(v[1] for v in by.values()) // steps} launches")
for k, (ms, n) in sorted(by.items(), key=lambda kv: -kv[1][0]):
    if ms >= 0.01:
        print(f"{ms:9.3f} ms {n / steps:6.1f}x {1e3 * ms * steps / n:9.1f} us  {k}")
