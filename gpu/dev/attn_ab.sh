# On the GPU host, repo root: parity checks of the tree's attention kernel, then the old one
# (first, here: mkdir -p gpu/dev/ab; git show REV:gpu/kernels/dflash_attention.cu > gpu/dev/ab/old_attention.cu)
# against the tree's, interleaved, at 1 and 4 documents a row (VARIANTS=0,18,34: the roles).
cd tests/gpu
(python dflash_attention_harness.py --build; python dflash_attention_harness.py --source ../../gpu/dev/ab/old_attention.cu --build) > $OUT/build.log 2>&1
python dflash_attention_harness.py 2>&1 | grep -E "FAIL|ALL PASS|SOME" | tee $OUT/checks.log
for d in 1 4; do for r in 1 2; do
  python dflash_attention_harness.py --source ../../gpu/dev/ab/old_attention.cu --bench --no-checks --docs $d --variants 0 2>&1 | grep "kernel v" | sed "s/^/old d$d /"
  python dflash_attention_harness.py --bench --no-checks --docs $d --variants ${VARIANTS:-0} 2>&1 | grep "kernel v" | sed "s/^/new d$d /"
done; done | tee $OUT/ab.log
