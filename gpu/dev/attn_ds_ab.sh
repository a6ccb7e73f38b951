# A/B of the attention backward's stored-dS form (gpu/dev/stored_ds.patch, dropped:
# docs/bench.md, seventeenth pass; variant bits 8192 and 16384) in the whole step, on
# the GPU host after `git apply gpu/dev/stored_ds.patch` and tools/gpu-host/pack, repo
# root: `tandem bench drafter_step --size 8b` with TANDEM_ATTENTION_VARIANT=$NEW_VARIANT
# (default 24576: the form with its halves)
# against 0, the same binary, interleaved over ROUNDS (gpu/dev/step_ab_rounds.sh).
# ≈ 1 min a line.  The kernels alone: tests/gpu/dflash_attention_harness.py --bench
# --no-checks --docs 1 --variants 0,8192,24576.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
source gpu/dev/step_ab_rounds.sh
export TANDEM_ATTENTION_VARIANT=${NEW_VARIANT:-24576}
OLD_ENV=TANDEM_ATTENTION_VARIANT=0 step_ab_rounds attn_ds_ab.jsonl
