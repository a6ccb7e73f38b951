# On the GPU host, repo root, with a packed build (.devbin; ≈ 7 min): GQA groups the attention
# kernels do not take as they are (Qwen3-14B's 5, and 3, 6, 7), in the two forms the wrapper
# can give them (kernel_form, gpu/models/dflash_attention.cpp): the query heads padded with
# zero heads to a multiple of 4, the kv heads then repeated into groups of 4 (wgmma; the
# default on sm_90 at head_dim 128; the first version of this script ran groups of 8) or the
# kv heads repeated into a smaller group (mma.sync; TANDEM_ATTENTION_VARIANT=1024).
# 1. The new GPU tests (dflash_attention.*) → $OUT/tests.log.
# 2. The kernels alone (tests/gpu/dflash_attention_harness.py), one layer forward + backward,
#    S 3072, N 512, d 128, 1 and 4 documents a row, two rounds → $OUT/gqa.log.  Reading:
#    G5 = 40/40 (repeated) against 64/16 (padded, kept) or 64/8; G3 = 24/24 against 32/8;
#    G6 = 48/24 against 64/16; G7 = 56/56 against 64/16; G2 = 16/8 (native) against 32/8;
#    G1 = 32/32 against 128/32; 64/16 against 64/8 (group 4 or 8 for the same work).
# 3. `tandem bench dflash_attention` and `drafter_step` at --size 14b, padded and repeated
#    interleaved (two rounds), then FlexAttention + torch.compile's step at the same shapes
#    (NOREF=1: not) → $OUT/step.jsonl.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,power.limit --format=csv | tee $OUT/tests.log
build/bin/gpu_tests --gtest_filter="${GTEST:-dflash_attention.*}" 2>&1 | tee -a $OUT/tests.log \
  | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |heads .*: cuda"
(cd tests/gpu
python dflash_attention_harness.py --build > $OUT/gqa_build.log 2>&1 || { tail -30 $OUT/gqa_build.log; exit 1; }
for r in 1 2; do for d in 1 4; do
  python dflash_attention_harness.py --bench --no-checks --no-dense --docs $d --variants 0 \
    --heads 32/8,64/8,64/16,40/40,24/24,48/24,56/56,32/32,128/32,16/8 2>&1 \
    | grep -E "^bench|kernel v|Error|error" | sed "s/^/r$r d$d /"
done; done | tee $OUT/gqa.log)
for r in 1 2; do for v in 0 1024; do
  for c in "dflash_attention --size 14b --warmup 3 --iters 20" "drafter_step --size 14b --warmup 3 --iters 10"; do
    echo "== round $r variant $v: $c" | tee -a $OUT/step.jsonl
    TANDEM_ATTENTION_VARIANT=$v build/bin/tandem bench $c 2>&1 | grep '^{' | tee -a $OUT/step.jsonl \
      | python3 -c "import sys, json
for l in sys.stdin:
    j = json.loads(l); print({k: j.get(k) for k in ('bench', 'mode', 'median_ms', 'mfu', 'peak_gib', 'kernel_ms')})"
  done
done; done
[ -n "$NOREF" ] || python3 bench/reference_step.py --size 14b --device cuda:0 --variants flex-compiled --iters 10 2>&1 \
  | tail -3 | tee -a $OUT/step.jsonl
