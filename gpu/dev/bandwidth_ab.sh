# Issue 20: three memory-bound kernels' A/B in one call (ran once on an H100,
# 2026-12-05: docs/bench.md, seventh pass — the SwiGLU kept, now the mainline's;
# the others dropped).  The patch applies to 47dea48.  Before the call, here:
#   git apply gpu/dev/bandwidth_kernels.patch && ninja -C build && bash tools/gpu-host/pack
# then on the GPU host (carry .devbin): bash gpu/dev/bandwidth_ab.sh
#   TANDEM_SWIGLU=grid|rows2d        the target's SwiGLU over its fused gate/up rows: the
#                                    grid-stride kernel (a 64-bit division and remainder a
#                                    chunk) against one token a blockIdx.y (none)
#   TANDEM_ADAMW_MATH=double|float   the flat AdamW's per-element math as PyTorch's fused
#                                    AdamW (double) or in float (no conversions; other roundings)
#   TANDEM_QK_PREFETCH=1|2|4         the target's q/k norm + RoPE (4.5 ms a forward, ≈ 2.2× its
#                                    bytes' time) with 1 (the mainline), 2 or 4 passes' rows in flight
# The parity tests under each value, then interleaved rounds (target_forward's and
# drafter_step's kernel_ms show the swiglu and adamw classes) into $OUT/bandwidth_ab.jsonl.
# ~8 min.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=build/bin/tandem
for v in grid rows2d; do
  TANDEM_SWIGLU=$v timeout 120 build/bin/gpu_tests --gtest_filter='target_packed.*' 2>&1 \
    | grep -E "^\[  (FAILED|PASSED|  OK) " | sed "s/^/swiglu=$v /" | tee -a $OUT/bandwidth_tests.log
done
for v in 2 4; do
  TANDEM_QK_PREFETCH=$v timeout 120 build/bin/gpu_tests --gtest_filter='target_packed.*:decode_attention.fused*' 2>&1 \
    | grep -E "^\[  (FAILED|PASSED|  OK) " | sed "s/^/qk_prefetch=$v /" | tee -a $OUT/bandwidth_tests.log
done
for v in double float; do
  TANDEM_ADAMW_MATH=$v timeout 120 build/bin/gpu_tests --gtest_filter='adamw*:graph.*' 2>&1 \
    | grep -E "^\[  (FAILED|PASSED|  OK) |graph vs|max rel" | sed "s/^/adamw=$v /" | tee -a $OUT/bandwidth_tests.log
done
show() { python3 -c "
import json,sys
for l in sys.stdin:
    if not l.startswith('{'): continue
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['ab'], j['round'], j['case'], j.get('mode') or j.get('variant'), round(j['median_ms'], 2),
          {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and c in ('swiglu', 'optimizer', 'norm_rope', 'other')})"; }
for r in ${ROUNDS:-1 2}; do
  for v in grid rows2d; do
    TANDEM_SWIGLU=$v timeout 100 $B bench target_forward --size 8b --warmup 1 --iters 8 --profile-steps 1 2>>$OUT/ab.err \
      | grep -E '"(graphs|eager|graphs_1doc)"' | sed "s/^{/{\"ab\": \"swiglu=$v\", \"round\": $r, /" \
      | tee -a $OUT/bandwidth_ab.jsonl | show
  done
  for v in 2 4; do
    TANDEM_QK_PREFETCH=$v timeout 100 $B bench target_forward --size 8b --warmup 1 --iters 8 --profile-steps 1 2>>$OUT/ab.err \
      | grep -E '"(graphs|eager)"' | sed "s/^{/{\"ab\": \"qk_prefetch=$v\", \"round\": $r, /" \
      | tee -a $OUT/bandwidth_ab.jsonl | show
  done
  for v in double float; do
    TANDEM_ADAMW_MATH=$v timeout 100 $B bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"ab\": \"adamw=$v\", \"round\": $r, /" | tee -a $OUT/bandwidth_ab.jsonl | show
  done
done
