# A/B of gpu/dev/ce_issue.patch (measured and dropped: the CE-gradient kernel with fewer
# instructions an element; docs/bench.md, "Sixteenth pass"). On the GPU host, built with the
# patch applied (tools/gpu-host/pack), repo root: the patched kernel
# against 19b6b7f's kernel (OLD_CE: a copy of it where the host has no .git): the
# harness's checks, its bench with --old (bit comparison, then both timed, interleaved),
# `tandem bench drafter_step` twice (its `ce_grad` kernel class), then all of gpu_tests.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
OLD_CE=${OLD_CE:-/tmp/ce_grad_19b6b7f.cu}; [ -f "$OLD_CE" ] || git show 19b6b7f:gpu/kernels/ce_grad.cu > "$OLD_CE" || exit 1
(cd tests/gpu && timeout 200 python ce_grad_harness.py --bench --old "$OLD_CE" 2>&1 | tee $OUT/ce_harness.txt | grep -E "FAIL|kernel|against|copy|composite|ALL|SOME")
for r in 1 2; do
  timeout 150 build/bin/tandem bench drafter_step --size 8b --warmup 3 --iters 10 2>>$OUT/err.txt | tee -a $OUT/step.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j.get('case'), j.get('mode'), round(j['median_ms'], 2), {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.3})"
done
# then every gpu_tests case (the kernel's parity tests and the graph-vs-eager 50 steps among them)
timeout ${GPU_TESTS_TIMEOUT:-300} build/bin/gpu_tests 2>&1 | tee $OUT/gpu_tests.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs|SKIPPED \]" | tail -12
