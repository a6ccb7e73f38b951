# The fifteenth pass's A/B (docs/bench.md), measured and dropped: the key-major backward
# role's items loaded by TMA (variant 16384) and the staged forward in FlashAttention-3's
# order inside a warpgroup (8192).  Their code is gpu/dev/tma_fa3_order.patch (against
# d9522fa: `git apply gpu/dev/tma_fa3_order.patch`, rebuild, `bash tools/gpu-host/pack`);
# then on the GPU host, repo root, carrying .devbin (≈ 3 min):
#   the harness's parity checks (every variant, incl. the TMA form bit-equal to cp.async),
#   both forms timed beside the defaults at one document a row, then `tandem bench
#   drafter_step` at variants 0, 16384 and 8192 → $OUT/ab.log, $OUT/step.jsonl.
#   The profile of docs/bench.md ran from the mainline (variant 34 needs no patch): PROFILE=1.
T0=$(date +%s)
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv | tee $OUT/ab.log
(cd tests/gpu
 timeout 150 python dflash_attention_harness.py 2>&1 | grep -E "FAIL|ALL|rror"
 timeout 100 python dflash_attention_harness.py --bench --no-checks --no-dense --docs 1 \
   --variants 0,8192,16384,2048,0,8192,16384 --heads 32/8 2>&1 | grep -E "kernel v|rror" | sed "s/^/d1 /"
) | tee -a $OUT/ab.log
source tools/gpu-host/env.sh > /dev/null
for v in ${VARS:-0 16384 8192}; do
  echo "== variant $v" | tee -a $OUT/step.jsonl
  TANDEM_ATTENTION_VARIANT=$v timeout 100 build/bin/tandem bench drafter_step --size 8b --warmup 3 --iters 10 2>&1 \
    | grep '^{' | tee -a $OUT/step.jsonl | python3 -c "import sys, json
for l in sys.stdin:
    j = json.loads(l); print({k: j.get(k) for k in ('mode', 'median_ms', 'mfu', 'kernel_ms') if k in j})"
done
# PROFILE=1: Nsight Compute on the key-major role alone (variant 34), one launch (≈ 10 s).
[ "${PROFILE:-0}" = 1 ] && (cd tests/gpu && timeout 100 ncu --clock-control none -k regex:bwd_dkv_kernel \
  --launch-skip 2 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis python dflash_attention_harness.py \
  --bench --no-checks --no-dense --docs 1 --variants 34 > $OUT/prof_dkv.txt 2>&1)
echo "total $(( $(date +%s) - T0 )) s" | tee -a $OUT/ab.log
