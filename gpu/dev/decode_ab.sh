# On the GPU host (tools/gpu-host/pack, carry .devbin): the decode step's A/B
# in one call, interleaved over 3 rounds — A the defaults, B TANDEM_PDL=0 (the
# decode GEMV launched plainly), C TANDEM_DECODE_GEMV=0 (cuBLAS at every batch)
# — `tandem bench target_decode --size 8b`; prints the median of the rounds'
# medians per (config, case, batch).  ~140 s on an H200.
source tools/gpu-host/env.sh > $OUT/env.log 2>&1; B=build/bin/tandem
for r in 1 2 3; do
  for cfg in "A" "B TANDEM_PDL=0" "C TANDEM_DECODE_GEMV=0"; do
    set -- $cfg; name=$1; shift
    env "$@" timeout 100 $B bench target_decode --size 8b --warmup 3 --iters 20 --profile-steps 0 2>>$OUT/bench.err | sed "s/^{/{\"cfg\":\"$name\",\"round\":$r,/" >> $OUT/ab.jsonl
  done
done
python3 - $OUT/ab.jsonl <<'P'
import json, sys, collections
rows = collections.defaultdict(list)
for l in open(sys.argv[1]):
    j = json.loads(l)
    rows[(j["cfg"], j["case"], j.get("shapes", {}).get("batch"))].append(j["median_ms"])
for k in sorted(rows):
    v = sorted(rows[k]); print(k, "median of medians %.3f" % v[len(v)//2], [round(x, 3) for x in rows[k]])
P
