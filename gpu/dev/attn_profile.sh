# On the GPU host, repo root (no packed build needed: the harness builds the kernel file):
# Nsight Compute on the DFlash attention kernels at the 8B drafter's shapes (S 3072, N 512,
# 32/8 heads, d 128, one document a row), one launch each: the key-major backward role alone
# (variant 34: separate launches, the query-major one skipped), the query-major role alone
# (variant 18) and the staged forward (variant 0).  Per kernel: the details page (speed of
# light, warp states, scheduler, memory) and the 40 SASS instructions with the most stall
# samples, with their reasons → $OUT/prof_<name>.txt (≈ 3 min).  ncu keeps the clocks as
# they are (--clock-control none; METHOD.md).  Not yet run in this form (--set full, the
# source page); the fifteenth pass's profile of the key-major role (docs/bench.md) ran with
# the sections SpeedOfLight, WarpStateStats, SchedulerStats, ComputeWorkloadAnalysis and
# MemoryWorkloadAnalysis and took ≈ 10 s.
OUT=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
cd tests/gpu
python dflash_attention_harness.py --build > /dev/null || exit 1
prof() {  # name, kernel regex, variant
  local rep=/tmp/prof_$1
  timeout 300 ncu --clock-control none -k "regex:$2" --launch-skip 2 --launch-count 1 --set full \
    --import-source no -f -o $rep python dflash_attention_harness.py --bench --no-checks --no-dense \
    --docs ${DOCS:-1} --variants $3 > /tmp/prof_$1.log 2>&1 || { tail -20 /tmp/prof_$1.log; return; }
  ncu --import $rep.ncu-rep --page details > $OUT/prof_$1.txt 2>&1
  ncu --import $rep.ncu-rep --page source --print-source sass --csv > /tmp/prof_$1_src.csv 2>&1
  python3 - /tmp/prof_$1_src.csv >> $OUT/prof_$1.txt <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and "Source" in r)
h = rows[head]; body = [r for r in rows[head + 1:] if len(r) == len(h)]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
samp = next((c for c in h if c.startswith("Warp Stall Sampling (All")), None)
stall_cols = [c for c in h if c.startswith("stall_") or "Stall" in c and c != samp]
print("\n== columns:", ", ".join(h)[:3000])
if samp:
    tot = sum(num(r[h.index(samp)]) for r in body)
    print(f"\n== top SASS by {samp} (total {tot:.0f})")
    for r in sorted(body, key=lambda r: -num(r[h.index(samp)]))[:40]:
        s = num(r[h.index(samp)])
        print(f"{100 * s / max(tot, 1):5.1f}%  {r[h.index('Address')] if 'Address' in h else ''}  {r[h.index('Source')][:90]}")
PY
}
prof dkv 'bwd_dkv_kernel' 34
prof fwd 'fwd_kernel' 0
prof dq 'bwd_dq_kernel' 18
ls -la $OUT
