# A/B of gpu/dev/ce_cluster.patch (measured and dropped, see the patch's head):
# .devbin-old/tandem.xz the build before, .devbin-alt/tandem-c2.xz the patch with
# 2 CTAs a row, .devbin this build (3 CTAs a row); drafter_step's kernel_ms.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && xz -dc .devbin-alt/tandem-c2.xz > /tmp/old/tandem-c2 && chmod +x /tmp/old/*
timeout 100 build/bin/gpu_tests --gtest_filter='ce_grad*:graph.the_learning*:target_packed*' 2>&1 | tee $OUT/gpu_tests_ce.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs" | tail -8
for r in 1 2; do
  for v in old c2 new; do
    bin=build/bin/tandem; [ $v = old ] && bin=/tmp/old/tandem; [ $v = c2 ] && bin=/tmp/old/tandem-c2
    timeout 100 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/ce_ab.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j.get('mode'), round(j['median_ms'], 2), {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.3})"
  done
done
timeout 100 build/bin/tandem bench target_forward --size 8b --warmup 1 --iters 5 --profile-steps 1 2>>$OUT/ab.err | tee -a $OUT/ce_ab.jsonl | cut -c1-150
