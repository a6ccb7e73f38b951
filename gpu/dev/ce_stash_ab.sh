# A/B of gpu/dev/ce_stash_norm_wide.patch (measured and dropped: docs/bench.md, "Sixteenth
# pass"). On the GPU host (tools/gpu-host/pack, built with the patch applied), repo root:
# gpu_tests of the kernels, the CE harness (checks, then its bench twice: the stash form
# against the l2 form), `tandem bench drafter_step` twice around the strongest Python
# reference, then the norm harness against another norm_rope.cu (--old).  ≈ 3 min on an H100.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
timeout 150 build/bin/gpu_tests --gtest_filter='ce_grad*:fused_ops*:graph.*:adamw*' 2>&1 | tee $OUT/gpu_tests_ce.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs" | tail -8
(cd tests/gpu && timeout 150 python ce_grad_harness.py --bench 2>&1 | tee $OUT/ce_harness.txt | grep -E "FAIL|PASS|kernel|copy|composite|ALL|SOME")
(cd tests/gpu && timeout 60 python ce_grad_harness.py --bench 2>&1 | grep -E "kernel|copy" | tee $OUT/ce_harness2.txt)
step() { timeout 150 build/bin/tandem bench drafter_step --size 8b --warmup 3 --iters 10 2>>$OUT/err.txt | tee -a $OUT/step.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j.get('case'), j.get('mode'), round(j['median_ms'], 2), {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.3})"; }
step
timeout 240 $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 --variants flex-compiled --iters 10 2>>$OUT/err.txt | tee -a $OUT/step.jsonl | cut -c1-300
step
# RMSNorm's wide backward (gpu/kernels/norm_rope.cu rms_norm_bwd_wide_kernel) against the
# kernel before it (OLD_NORM, default /tmp/norm_rope_19b6b7f.cu: `git show
# 19b6b7f:gpu/kernels/norm_rope.cu > /tmp/norm_rope_19b6b7f.cu`), checks and bench.
(cd tests/gpu && timeout 150 python fused_ops_harness.py --bench --old ${OLD_NORM:-/tmp/norm_rope_19b6b7f.cu} 2>&1 | tee $OUT/norm_harness.txt | grep -E "FAIL|PASS|bwd|ALL|SOME|copy")
