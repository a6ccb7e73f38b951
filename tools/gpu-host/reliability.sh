#!/usr/bin/env bash
# On the GPU host (see tools/gpu-host/pack): issue 19's runs at Qwen3-8B
# shapes with target and drafter on cuda:0, each a JSON line of
# bench/pipeline.py in $OUT/reliability.jsonl (its `recoveries` give steps
# lost and the time to training again) plus the run's metrics.jsonl:
#   repro      60 steps, a checkpoint only at the end (the run that used to
#              lose all its training at the final snapshot);
#   throw40    a throw at step 40, checkpoints every 20 (restore points in
#              device memory on, the default);
#   throw40-disk  the same with checkpoint.memory_every = 0 (the checkpoint);
#   nomem      60 steps without restore points in device memory: the step
#              time beside repro's measures their cost.
# CASES picks some (default all).  ~2 min each after the first (which makes
# the 16 GB random target in $W, kept for the others).
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
W=${W:-/tmp/pipe}
B=build/bin/tandem
CASES=${CASES:-"repro throw40 throw40-disk nomem"}
one() {
  local name=$1; shift
  echo "== $name: $*" >&2
  timeout 330 $TANDEM_PYTHON bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 --drafter-device cuda:0 \
    --work "$W" --keep --timeout 300 "$@" 2> >(tee "$OUT/$name.err" >&2) \
    | sed "s/^{/{\"case\": \"$name\", /" | tee -a "$OUT/reliability.jsonl"
  cp "$W/out/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  rm -rf "$W/out"
}
for c in $CASES; do
  case $c in
    repro) one repro --steps 60 --set checkpoint.every_steps=0 ;;
    throw40) one throw40 --steps 60 --set checkpoint.every_steps=20 --fault drafter=0,kind=throw,at_step=40 ;;
    throw40-disk) one throw40-disk --steps 60 --set checkpoint.every_steps=20 --set checkpoint.memory_every=0 \
                    --fault drafter=0,kind=throw,at_step=40 ;;
    nomem) one nomem --steps 60 --set checkpoint.every_steps=0 --set checkpoint.memory_every=0 ;;
  esac
done
