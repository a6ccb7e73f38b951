#!/usr/bin/env python3
"""Where the device idles in a Chrome trace of `tandem bench ... --trace DIR` (issue 20).

  python gpu/dev/trace_gaps.py DIR/drafter_step_8b_graphed.json [STEPS] [--top N]

Over the trace's device events (kernels, copies, memsets) in start order: busy time (union of
intervals), span, and each gap between the end of everything so far and the next event's
start, summed by size class (< 2 µs, 2-5, 5-20, 20-100, >= 100 µs) per step; then the N
largest gaps with the events on either side (the between-step gaps, host work and the
read-back, are among them).  Shortened names: GEMMs as "gemm".
"""
import json
import sys


def short(name):
    if any(s in name for s in ("gemm", "Gemm", "sm90_xmma", "cutlass", "nvjet")):
        return "gemm"
    return name[:70]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 15
    if "--top" in sys.argv:
        args.remove(str(top))
    d = json.load(open(args[0]))
    steps = int(args[1]) if len(args) > 1 else 3
    ev = sorted((e for e in d.get("traceEvents", []) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                key=lambda e: e["ts"])
    if not ev:
        sys.exit("no device events in the trace")
    classes = [(2, "< 2 us"), (5, "2-5 us"), (20, "5-20 us"), (100, "20-100 us"), (float("inf"), ">= 100 us")]
    sums = {c: [0.0, 0] for _, c in classes}
    gaps = []
    busy = 0.0
    lo, hi, prev = ev[0]["ts"], ev[0]["ts"] + ev[0]["dur"], ev[0]
    for e in ev[1:]:
        if e["ts"] > hi:
            busy += hi - lo
            g = e["ts"] - hi
            for bound, c in classes:
                if g < bound:
                    sums[c][0] += g
                    sums[c][1] += 1
                    break
            gaps.append((g, short(prev["name"]), short(e["name"])))
            lo = e["ts"]
        if e["ts"] + e["dur"] >= hi:
            prev = e
        hi = max(hi, e["ts"] + e["dur"])
    busy += hi - lo
    span = hi - ev[0]["ts"]
    print(f"{len(ev) / steps:.0f} events a step; span {span / 1e3 / steps:.3f} ms, busy {busy / 1e3 / steps:.3f} ms, "
          f"idle {(span - busy) / 1e3 / steps:.3f} ms a step")
    for _, c in classes:
        ms, n = sums[c]
        print(f"  gaps {c:>10}: {ms / 1e3 / steps:7.3f} ms in {n / steps:6.1f} a step")
    print(f"largest {top} gaps (us, after -> before):")
    for g, a, b in sorted(gaps, reverse=True)[:top]:
        print(f"  {g:9.1f}  {a} -> {b}")


if __name__ == "__main__":
    main()
