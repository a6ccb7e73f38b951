# On the GPU host (see tools/gpu-host/pack): the bench cases of the closing
# notes for two packed builds, interleaved A B A B … for ROUNDS rounds (default
# 3) on the same GPU in one call, into $OUT/ab.jsonl (each line tagged
# "build": A or B); then per case the median over the rounds of each build's
# median_ms and B/A ($OUT/ab.txt).  A layout change must keep every ratio
# within ±3%.
#   TANDEM_DEVBIN=.devbin-before tools/gpu-host/pack   # here, at the old commit
#   tools/gpu-host/pack                                # here, at the new one
#   bash tools/gpu-host/ab.sh .devbin-before .devbin    # there, both carried
# ROUNDS="2 3" runs those rounds only (a second call continuing a first);
# the summary reads every line in $OUT/ab.jsonl, so concatenate the calls'
# files and run the summary (the Python at the end) over them.
set -o pipefail
A=${1:-.devbin-before}; B=${2:-.devbin}; ROUNDS=${ROUNDS:-1 2 3}
OUT=${OUT:-/tmp}
cases=("drafter_step --size tiny --warmup 5 --iters 30"
       "drafter_step --size 8b --warmup 3 --iters 10"
       "drafter_step_eager --size 8b --warmup 2 --iters 5"
       "target_forward --size 8b --warmup 2 --iters 10"
       "dflash_attention --size 8b --warmup 3 --iters 20")
for r in $ROUNDS; do
  for tag in A B; do
    dev=$A; [[ $tag == B ]] && dev=$B
    TANDEM_DEVBIN=$dev source tools/gpu-host/env.sh > /dev/null
    for c in "${cases[@]}"; do
      # shellcheck disable=SC2086
      timeout 150 build/bin/tandem bench $c 2>> "$OUT/ab.err" \
        | python3 -c 'import json,sys
for l in sys.stdin:
    if l.strip():
        j = json.loads(l); j["build"] = sys.argv[1]; j["round"] = int(sys.argv[2]); print(json.dumps(j))' "$tag" "$r" \
        >> "$OUT/ab.jsonl"
    done
    echo "round $r build $tag done at $(date +%T): $(wc -l < "$OUT/ab.jsonl") lines"
  done
done
python3 - "$OUT/ab.jsonl" <<'PY' | tee "$OUT/ab.txt"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
key = lambda j: (j["case"], j.get("size", ""), j.get("mode", ""))
cases = sorted({key(j) for j in rows})
print(f"{'case':42} {'A ms':>9} {'B ms':>9} {'B/A':>7}  rounds A/B  commits")
for k in cases:
    a = [j["median_ms"] for j in rows if key(j) == k and j["build"] == "A"]
    b = [j["median_ms"] for j in rows if key(j) == k and j["build"] == "B"]
    ca = {j["git_commit"] for j in rows if key(j) == k and j["build"] == "A"}
    cb = {j["git_commit"] for j in rows if key(j) == k and j["build"] == "B"}
    if not a or not b:
        print(f"{' '.join(k):42} missing: A {len(a)} B {len(b)}"); continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{' '.join(k):42} {ma:9.3f} {mb:9.3f} {mb/ma:7.3f}  {len(a)}/{len(b)}  {','.join(ca)} -> {','.join(cb)}")
PY
