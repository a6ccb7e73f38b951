# A/B of gpu/dev/adamw_f32.patch (measured and dropped, docs/bench.md): on the GPU host, built with the
# patch applied (tools/gpu-host/pack), repo root: the flat AdamW update in float arithmetic
# against the double arithmetic of PyTorch's fused kernel (the build before the patch:
# its `tandem`, xz-compressed in .devbin-old/tandem.xz, carried beside .devbin); gpu_tests
# adamw* first, then `tandem bench drafter_step --size 8b` for each,
# interleaved over two rounds (ROUNDS, as gpu/dev/step_ab_rounds.sh; kernel_ms `optimizer`:
# the sum of squares and the update).
# docs/bench.md, "Sixteenth pass".  ≈ 4 min.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
timeout 100 build/bin/gpu_tests --gtest_filter='adamw*:graph.*' 2>&1 | tee $OUT/gpu_tests_adamw.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs|flat - torch" | tail -12
source gpu/dev/step_ab_rounds.sh
step_ab_rounds adamw_ab.jsonl
