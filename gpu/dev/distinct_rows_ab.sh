# On the GPU host (issue 20, eighth pass): the first layer on its distinct rows.
# The new build's GPU tests for it, then drafter_step of the build before it
# (.devbin-old/tandem.xz) against this one (.devbin), interleaved rounds, into
# $OUT/ab.jsonl; the GEMM fusion probe; a trace's GEMM launches; the target forward.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
timeout 120 build/bin/gpu_tests --gtest_filter='dflash_forward*:dflash_attention*:graph*' 2>&1 | tail -25 | tee $OUT/tests.txt
mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && chmod +x /tmp/old/tandem
for r in ${ROUNDS:-1 2}; do
  for v in old new; do
    bin=build/bin/tandem; [ $v = old ] && bin=/tmp/old/tandem
    timeout 100 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/ab.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j.get('mode'), round(j['median_ms'], 2), round(j['mfu'], 4), round(j['peak_mem_gib'], 2),
          {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.1})"
  done
done
[ -n "$PROBE" ] && timeout 150 $TANDEM_PYTHON gpu/dev/gemm_fusion_probe.py --reps 20 --rounds 2 2>&1 | tee $OUT/fusion.jsonl
if [ -n "$TRACE" ]; then
  mkdir -p /tmp/tr && timeout 100 build/bin/tandem bench drafter_step --size 8b --warmup 2 --iters 2 --trace /tmp/tr > $OUT/trace_step.jsonl 2>&1
  $TANDEM_PYTHON gpu/dev/trace_gemms.py /tmp/tr/drafter_step_8b.json 3 > $OUT/gemms.txt 2>&1; tail -30 $OUT/gemms.txt
fi
[ -n "$TARGET" ] && timeout 120 build/bin/tandem bench target_forward --size 8b --warmup 2 --iters 10 2>&1 | tee $OUT/target.jsonl | cut -c1-300
