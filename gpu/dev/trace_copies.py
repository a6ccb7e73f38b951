# The copies, adds and fills of one profiled step in a Chrome trace saved by
# `tandem bench drafter_step --trace DIR` (3 profiled steps: the first is read),
# each with its size and the kernels on either side, to tell where it comes from:
#   python gpu/dev/trace_copies.py DIR/drafter_step_8b.json
import json, sys, collections
d = json.load(open(sys.argv[1])); steps = 3
ev = [e for e in d.get("traceEvents", []) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
ev.sort(key=lambda e: e["ts"])
n = len(ev) // steps
for i, e in enumerate(ev[:n]):
    nm = e["name"]
    if "Memcpy" in nm or "direct_copy" in nm or "CUDAFunctor_add" in nm or "FillFunctor" in nm:
        prev = ev[i-1]["name"][:70] if i else ""
        nxt = ev[i+1]["name"][:70] if i + 1 < len(ev) else ""
        a = e.get("args", {})
        print(f"{i:4d} {e['dur']:7.1f}us bytes={a.get('bytes','')} grid={a.get('grid','')} {nm[:60]!r}\n      prev {prev!r}\n      next {nxt!r}")
