# On the GPU host (issue 20, eighth pass): the first layer on its distinct rows.
# The new build's GPU tests for it, then drafter_step of the build before it
# (.devbin-old/tandem.xz) against this one (.devbin), interleaved rounds, into
# $OUT/ab.jsonl; the GEMM fusion probe; a trace's GEMM launches; the target forward.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
timeout 120 build/bin/gpu_tests --gtest_filter='dflash_forward*:dflash_attention*:graph*' 2>&1 | tail -25 | tee $OUT/tests.txt
source gpu/dev/step_ab_rounds.sh
step_ab_rounds ab.jsonl
[ -n "$PROBE" ] && timeout 150 $TANDEM_PYTHON gpu/dev/gemm_fusion_probe.py --reps 20 --rounds 2 2>&1 | tee $OUT/fusion.jsonl
if [ -n "$TRACE" ]; then
  mkdir -p /tmp/tr && timeout 100 build/bin/tandem bench drafter_step --size 8b --warmup 2 --iters 2 --trace /tmp/tr > $OUT/trace_step.jsonl 2>&1
  $TANDEM_PYTHON gpu/dev/trace_gemms.py /tmp/tr/drafter_step_8b.json 3 > $OUT/gemms.txt 2>&1; tail -30 $OUT/gemms.txt
fi
[ -n "$TARGET" ] && timeout 120 build/bin/tandem bench target_forward --size 8b --warmup 2 --iters 10 2>&1 | tee $OUT/target.jsonl | cut -c1-300
