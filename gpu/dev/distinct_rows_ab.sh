# On the GPU host (issue 20, eighth pass): the first layer on its distinct rows.
# The new build's GPU tests for it, then drafter_step with the first layer on
# every row (TANDEM_FIRST_LAYER_ROWS=all, "old") against the distinct rows
# ("new"), one binary, interleaved rounds, into
# $OUT/ab.jsonl; PROBE=1: the GEMM fusion probe; TRACE=1: a step's trace, its GEMM
# launches and every kernel by name (and the target's with TARGET=1); TARGET=1: the
# target forward.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
timeout 120 build/bin/gpu_tests --gtest_filter='dflash_forward*:dflash_attention*:graph*' 2>&1 | tail -25 | tee $OUT/tests.txt
source gpu/dev/step_ab_rounds.sh
OLD_ENV=TANDEM_FIRST_LAYER_ROWS=all
step_ab_rounds ab.jsonl
[ -n "$PROBE" ] && timeout 150 $TANDEM_PYTHON gpu/dev/gemm_fusion_probe.py --reps 20 --rounds 2 2>&1 | tee $OUT/fusion.jsonl
if [ -n "$TRACE" ]; then
  mkdir -p /tmp/tr && timeout 100 build/bin/tandem bench drafter_step --size 8b --warmup 2 --iters 2 --trace /tmp/tr > $OUT/trace_step.jsonl 2>&1
  $TANDEM_PYTHON gpu/dev/trace_gemms.py /tmp/tr/drafter_step_8b.json 3 > $OUT/gemms.txt 2>&1; tail -30 $OUT/gemms.txt
  $TANDEM_PYTHON gpu/dev/trace_kernels.py /tmp/tr/drafter_step_8b.json 3 > $OUT/kernels_step.txt 2>&1; head -40 $OUT/kernels_step.txt
fi
if [ -n "$TARGET" ]; then
  timeout 150 build/bin/tandem bench target_forward --size 8b --warmup 2 --iters 10 ${TRACE:+--trace /tmp/tr} 2>&1 | tee $OUT/target.jsonl | cut -c1-300
  [ -n "$TRACE" ] && $TANDEM_PYTHON gpu/dev/trace_kernels.py /tmp/tr/target_forward_8b.json 3 > $OUT/kernels_target.txt 2>&1 && head -30 $OUT/kernels_target.txt
fi
