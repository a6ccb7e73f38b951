# A/B in one call (issue 20): the drafter step before and after "the last
# layer skips each block's position 0 + residual adds in the o/down GEMMs"
# (gpu/models/dflash.cpp).  .devbin holds the old build, .devbin-new/new.tar.xz
# the new tandem and gpu_tests; interleaved rounds, then the new gpu_tests.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
mkdir -p /tmp/old /tmp/new && cp build/bin/tandem /tmp/old/ && tar -xJf .devbin-new/new.tar.xz -C /tmp/new
for r in 1 2; do
  for v in old new; do
    timeout 100 /tmp/$v/tandem bench drafter_step --size 8b --warmup 2 --iters 8 2>/dev/null \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/unscored_ab.jsonl \
      | python3 -c "import json,sys; [print(j['build'], j['round'], j['mode'], round(j['median_ms'],2), round(j['tflop'],2), round(j['peak_mem_gib'],2)) for j in map(json.loads, sys.stdin)]"
  done
done
cp /tmp/new/gpu_tests build/bin/gpu_tests
timeout 120 build/bin/gpu_tests --gtest_filter='graph.replay*:graph.the_learning*:graph.a_restored*:dflash*:ce_grad*:fused_ops*:adamw*' 2>&1 \
  | tee $OUT/gpu_tests_new.log | grep -E "^\[  (FAILED|PASSED) |graph vs" | tail -6
