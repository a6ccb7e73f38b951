# On the GPU host (tools/gpu-host/pack, .devbin carried): the weight-gradient
# side stream (TANDEM_WEIGHT_GRADS; apply gpu/dev/weight_grad_side_stream.patch first: the mainline has no such stream) A/B on the 8b
# drafter step, interleaved, after the GPU tests its change touches.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
timeout ${TESTS_S:-260} build/bin/gpu_tests --gtest_filter="${FILTER:-target_packed.*:decode_attention.*:graph.*:ce_grad.*:adamw_flat.*:fused_ops.*}" 2>&1 \
  | tee $OUT/gpu_tests.log | grep -E "^\[  (FAILED|PASSED) |^\[==|graph vs" | tail -20
for r in ${ROUNDS:-1 2}; do
  for w in ${MODES:-main side side:1024}; do
    TANDEM_WEIGHT_GRADS=$w timeout 150 build/bin/tandem bench ${CASES:-drafter_step} --size 8b --warmup 3 --iters 10 2>>$OUT/bench.err \
      | python3 -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        j = json.loads(l); j["wg"] = sys.argv[1]; j["round"] = int(sys.argv[2]); print(json.dumps(j))' "$w" "$r" | tee -a $OUT/wg.jsonl \
      | python3 -c 'import json,sys
for l in sys.stdin:
    j = json.loads(l); print(j["wg"], j["round"], j["case"], j.get("mode",""), j.get("median_ms"), j.get("mfu"), j.get("peak_gib", j.get("peak_memory_gib")), j.get("error",""))'
  done
done
