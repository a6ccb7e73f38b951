# On the GPU host (issue 20): the one-GPU pipeline of this build (.devbin)
# against the build before the change under test (.devbin-old/tandem.xz:
# commit 9e29da5 for the eleventh pass's page-locking; 470b1e2, the copied
# restore point in device memory, for the twelfth pass's in-place one),
# interleaved, 200 steps each (STEPS), with TANDEM_TURN_TIMING's lines
# kept; RUNS says which runs (labels pick variants, below), GTEST which GPU
# tests run first; then the compiled Python pipeline and the target's
# forward at one row (NOREF=1: not).  ≈ 6 minutes.  Results in $OUT (a few
# files: the device returns only a few): pipe.jsonl (a labelled line a run),
# turns.txt (TANDEM_TURN_TIMING's lines by run), smi.csv (clocks and power
# every 2 s), tests.log.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
xz -dc .devbin-old/tandem.xz > /tmp/tandem-old && chmod +x /tmp/tandem-old
nvidia-smi --query-gpu=name,power.limit --format=csv
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active \
  --format=csv -l 2 > $OUT/smi.csv 2>&1 &
SMI=$!
build/bin/gpu_tests --gtest_filter="${GTEST:-graph.prepared*:graph.replays_taken*}" 2>&1 | tee $OUT/tests.log | grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |max relative" 
P="python3 bench/pipeline.py --size 8b --target-device cuda:0 --drafter-device cuda:0 --work /tmp/pipe --timeout 105"
$P --tandem build/bin/tandem --setup-only 2>&1 | tail -1
run() {
  local label=$1 bin=$2
  shift 2
  echo "== $label $(date +%T)" | tee -a $OUT/pipe.jsonl >> $OUT/turns.txt
  TANDEM_TURN_TIMING=25 $P --tandem $bin --steps ${STEPS:-200} "$@" 2> /tmp/$label.err > /tmp/$label.json
  cat /tmp/$label.json >> $OUT/pipe.jsonl
  python3 -c "
import json, sys
j = json.loads(open('/tmp/$label.json').read().strip().splitlines()[-1])
print('$label', {k: j.get(k) for k in ('wall_ms_per_step', 'wall_ms_median', 'step_ms_median', 'data_wait_share', 'slowest_steps', 'snapshot_holds', 'error')})" || tail -5 /tmp/$label.err
  grep -h "turn timing\|held the drafter\|page-lock" /tmp/pipe/tandem.stderr >> $OUT/turns.txt
}
# A run's label picks its variant: nomem* without restore points in device
# memory, nohost* without those in shared memory, batch*/engines* with
# TANDEM_RESTORE_COPY, prio* with TANDEM_GRAPH_PRIORITY=high.
for r in ${RUNS:-new:build/bin/tandem old:/tmp/tandem-old nomem:build/bin/tandem}; do
  l=${r%%:*} b=${r#*:}
  case $l in
    nomem*) run $l $b --set checkpoint.memory_every=0 ;;
    nohost*) run $l $b --set checkpoint.host_every=0 ;;
    batch*) TANDEM_RESTORE_COPY=batch run $l $b ;;
    engines*) TANDEM_RESTORE_COPY=engines run $l $b ;;
    prio*) TANDEM_GRAPH_PRIORITY=high run $l $b ;;
    *) run $l $b ;;
  esac
done
[ -n "$NOREF" ] && { kill $SMI; exit 0; }
echo "== reference $(date +%T)" >> $OUT/pipe.jsonl
python3 bench/reference_pipeline.py --size 8b --device cuda:0 --variants compiled --warmup 3 --iters 10 \
  2> /tmp/reference.err | tee -a $OUT/pipe.jsonl | cut -c1-200
echo "== target_forward --rows 1 $(date +%T)" >> $OUT/pipe.jsonl
build/bin/tandem bench target_forward --size 8b --rows 1 --warmup 2 --iters 10 2>/dev/null | tee -a $OUT/pipe.jsonl | cut -c1-200
kill $SMI
