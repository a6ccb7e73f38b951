# A/B of a norm-kernel patch (docs/bench.md, eighteenth pass): gpu/dev/norm_rows.patch (the
# forward taking 4 row groups a CTA with every load first: measured and dropped) or
# gpu/dev/rope_tables_t.patch (the fused q/k norm + RoPE reading the tables in the activations'
# dtype: written, compiled and CPU-tested, not yet run on a GPU).  On the GPU host, repo root, the
# build with the patch applied packed and the build before as .devbin-old/tandem.xz.  gpu_tests
# fused_ops*, graph.*, dflash_forward*, then the step, old and new interleaved (ROUNDS, default
# "1 2 3"), then each run's last loss (both patches keep the arithmetic: the same loss).  ≈ 4 min.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
ROUNDS=${ROUNDS:-1 2 3}
source gpu/dev/step_ab_rounds.sh
step_ab_checked 'fused_ops*:graph.*:dflash_forward*' norm_ab.jsonl
