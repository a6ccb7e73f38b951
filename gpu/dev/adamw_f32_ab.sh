# A/B of gpu/dev/adamw_f32.patch (written, not yet run): on the GPU host, built with the
# patch applied (tools/gpu-host/pack), repo root: the flat AdamW update in float arithmetic
# against the double arithmetic of PyTorch's fused kernel (the build before the patch:
# its `tandem`, xz-compressed in .devbin-old/tandem.xz, carried beside .devbin); gpu_tests
# adamw* first, then `tandem bench drafter_step --size 8b` for each,
# interleaved over two rounds (kernel_ms `optimizer`: the sum of squares and the update).
# docs/bench.md, "Sixteenth pass".  ≈ 4 min.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && chmod +x /tmp/old/tandem
timeout 100 build/bin/gpu_tests --gtest_filter='adamw*:graph.*' 2>&1 | tee $OUT/gpu_tests_adamw.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs|flat - torch" | tail -12
for r in $(seq ${ROUNDS:-2}); do
  for v in old new; do
    bin=build/bin/tandem; [ $v = old ] && bin=/tmp/old/tandem
    timeout 90 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/adamw_ab.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j.get('mode'), round(j['median_ms'], 2), {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.3})"
  done
done
