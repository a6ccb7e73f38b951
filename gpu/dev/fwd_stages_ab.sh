# On the GPU host, repo root, with a packed build (.devbin): the DFlash forward's staged form
# (stage barriers, several warpgroups a CTA sharing each K/V tile: three blocks a CTA at G 4;
# the default since the fourteenth pass, docs/bench.md) against its former form
# (TANDEM_ATTENTION_VARIANT=2048: one block a CTA, a CTA barrier a tile) and two blocks a CTA
# (4096).  One part a call:
# PART=1 (≈ 3 min): the kernels' parity checks with every variant (harness), the target's
#   chunked mode against fp32 and FlashAttention-2 with each form, then both harnesses timed,
#   1 and 4 documents a row (and G 8: 64/8 heads), two rounds → $OUT/fwd_checks.log, fwd_ab.log.
# PART=2 (≈ 7 min): the GPU tests (tools/gpu-host/tests.sh), the harness's checks, both forward
#   forms at G 8 and 4 (harness; the run of the fourteenth pass also timed gpu/dev/dq_stages.patch
#   as variant 8192), then `tandem bench drafter_step`
#   (8B shapes) at variants 2048 (before) and 0 interleaved, two rounds → $OUT/fwd_step.jsonl.
# PART=3 (≈ 5 min): `tandem bench target_forward` at 2048 and 0, two rounds, then the Python
#   references (FlexAttention + torch.compile step; compiled transformers target) → fwd_ref.jsonl.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
show() { python3 -c "import sys, json
for l in sys.stdin:
    if not l.startswith('{'): continue
    j = json.loads(l); print({k: j.get(k) for k in ('bench', 'mode', 'median_ms', 'tokens_per_s', 'mfu', 'peak_gib', 'kernel_ms') if k in j})"; }
case "${PART:-1}" in
1)
  nvidia-smi --query-gpu=name,power.limit --format=csv | tee $OUT/fwd_checks.log
  (cd tests/gpu && python dflash_attention_harness.py 2>&1 | grep -E "PASS|FAIL|rror") | tee -a $OUT/fwd_checks.log
  python gpu/dev/target_attention_harness.py --docs 1,4 --variants 2048,0,4096 2>&1 | tee -a $OUT/fwd_checks.log
  for r in 1 2; do for d in 1 4; do
    (cd tests/gpu && python dflash_attention_harness.py --bench --no-checks --no-dense --docs $d \
      --variants 2048,0,4096 --heads 32/8,64/8 2>&1 | grep -E "^bench|kernel v|rror" | sed "s/^/r$r d$d /")
  done
  python gpu/dev/target_attention_harness.py --no-checks --docs 1,4 --variants 2048,0,4096 2>&1 \
    | grep chunked | sed "s/^/r$r target /"
  done | tee $OUT/fwd_ab.log ;;
2)
  nvidia-smi --query-gpu=name,power.limit --format=csv | tee $OUT/fwd_tests.log
  bash tools/gpu-host/tests.sh 2>&1 | tail -15 | tee -a $OUT/fwd_tests.log
  (cd tests/gpu && python dflash_attention_harness.py 2>&1 | grep -E "FAIL|ALL|rror") | tee -a $OUT/fwd_tests.log
  for d in 1 4; do  # G 8: the staged form is its two warpgroups of one block
    (cd tests/gpu && python dflash_attention_harness.py --bench --no-checks --no-dense --docs $d \
      --variants 2048,0 --heads 64/8,32/8 2>&1 | grep -E "^bench|kernel v|rror" | sed "s/^/d$d /")
  done | tee -a $OUT/fwd_tests.log
  for r in 1 2; do for v in 2048 0; do
    echo "== round $r variant $v" | tee -a $OUT/fwd_step.jsonl
    TANDEM_ATTENTION_VARIANT=$v build/bin/tandem bench dflash_attention drafter_step --size 8b --warmup 3 --iters 10 2>&1 \
      | grep '^{' | tee -a $OUT/fwd_step.jsonl | show
  done; done ;;
3)
  nvidia-smi --query-gpu=name,power.limit --format=csv | tee $OUT/fwd_ref.jsonl
  for r in 1 2; do for v in 2048 0; do
    echo "== round $r variant $v" | tee -a $OUT/fwd_ref.jsonl
    TANDEM_ATTENTION_VARIANT=$v timeout 120 build/bin/tandem bench target_forward --size 8b --warmup 2 --iters 10 2>&1 \
      | grep '^{' | tee -a $OUT/fwd_ref.jsonl | show
  done; done
  timeout 240 $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 --variants flex-compiled --iters 10 2>&1 \
    | grep '^{' | tee -a $OUT/fwd_ref.jsonl | show
  timeout 330 $TANDEM_PYTHON bench/reference_target.py --size 8b --variants compiled --iters 10 2>&1 \
    | grep '^{' | tee -a $OUT/fwd_ref.jsonl | show ;;
4)
  # The corrected A/B (after the dispatch fix: before it, 2048 at G 4 ran the mma.sync forward):
  # both harnesses timed, then drafter_step, the former form (2048) and the staged one
  # interleaved → $OUT/fwd_fix.log, $OUT/fwd_fix.jsonl (≈ 5 min; ROUNDS=1 STEP=0: the
  # harnesses once, ≈ 2.5 min).
  nvidia-smi --query-gpu=name,power.limit --format=csv | tee $OUT/fwd_fix.log
  for r in $(seq ${ROUNDS:-2}); do for d in 1 4; do
    (cd tests/gpu && python dflash_attention_harness.py --bench --no-checks --no-dense --docs $d \
      --variants 2048,0,2048,0 --heads 32/8 2>&1 | grep -E "kernel v|rror" | sed "s/^/r$r d$d /")
  done; done | tee -a $OUT/fwd_fix.log
  for r in $(seq ${ROUNDS:-2}); do
    python gpu/dev/target_attention_harness.py --no-checks --docs 1,4 --variants 2048,0,2048,0 2>&1 \
      | grep -E "chunked|rror" | sed "s/^/r$r target /"
  done | tee -a $OUT/fwd_fix.log
  [ "${STEP:-1}" = 1 ] && for v in 2048 0 2048 0; do
    echo "== variant $v" | tee -a $OUT/fwd_fix.jsonl
    TANDEM_ATTENTION_VARIANT=$v timeout 100 build/bin/tandem bench drafter_step --size 8b --warmup 3 --iters 10 2>&1 \
      | grep '^{' | tee -a $OUT/fwd_fix.jsonl | show
  done ;;
esac
