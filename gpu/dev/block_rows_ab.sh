# A/B of the block-row gathers and the CE backward's one-pass scale (docs/bench.md, eighteenth
# pass): on the GPU host, repo root, this build packed (tools/gpu-host/pack) and the build
# before as .devbin-old/tandem.xz.  gpu_tests of the changed ops and the step's graph and
# resume checks, then `tandem bench drafter_step --size 8b`, old and new interleaved (ROUNDS,
# default "1 2 3"; gpu/dev/step_ab_rounds.sh), then each run's last loss (the moves are
# copies: the same bits, so the same loss).  ≈ 5 min.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
ROUNDS=${ROUNDS:-1 2 3}
source gpu/dev/step_ab_rounds.sh
step_ab_checked 'block_rows*:ce_grad*:graph.*:dflash_forward*' rows_ab.jsonl
