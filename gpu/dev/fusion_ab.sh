# A/B in one call (issue 20, fourth pass): the build before (.devbin-old/tandem.xz)
# against this one (.devbin) — the drafter's input gradients summed in GEMM
# epilogues and norm kernels (fused_linears, fused_rms_norm_passing) and the
# target's q/k norm + RoPE at 16 lanes a row.  (Its first run also carried the
# cross-entropy cluster kernel, gpu/dev/ce_cluster.patch, and a SwiGLU with two
# chunks in flight and streaming loads, 8.6 → 10.8 ms a forward: both dropped.)
# The new build's GPU tests for those parts first, then interleaved rounds of
# drafter_step and target_forward into $OUT/fusion_ab.jsonl.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && chmod +x /tmp/old/tandem
timeout 200 build/bin/gpu_tests --gtest_filter='fused_ops*:ce_grad*:graph.*:dflash*:target_packed*:adamw*' 2>&1 \
  | tee $OUT/gpu_tests_new.log | grep -E "^\[  (FAILED|PASSED) |FAILED|graph vs" | tail -12
show() { python3 -c "
import json,sys
for l in sys.stdin:
    if not l.startswith('{'): continue
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j['case'], j.get('mode') or j.get('variant'), round(j['median_ms'], 2), round(j.get('peak_mem_gib', 0), 2),
          {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.3})"; }
for r in ${ROUNDS:-1 2}; do
  for v in old new; do
    bin=build/bin/tandem; [ $v = old ] && bin=/tmp/old/tandem
    timeout 100 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/fusion_ab.jsonl | show
    timeout 100 $bin bench target_forward --size 8b --warmup 1 --iters 5 --profile-steps 1 2>>$OUT/ab.err | grep -E '"(graphs|eager|graphs_1doc)"' \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/fusion_ab.jsonl | show
  done
done
