# On the GPU host (.devbin and .devbin-old carried; .devbin-old/tandem.xz is
# the build before the change): the 8b drafter step, old and new builds
# interleaved, then the overlap probe and the one-GPU pipeline on the new one.
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
xz -dc .devbin-old/tandem.xz > build/bin/tandem-old && chmod +x build/bin/tandem-old
for r in ${ROUNDS:-1 2 3}; do
  for b in old new; do
    bin=build/bin/tandem; [ $b = old ] && bin=build/bin/tandem-old
    timeout 120 $bin bench drafter_step --size 8b --warmup 3 --iters 10 --profile-steps ${PROFILE:-0} 2>>$OUT/bench.err \
      | sed "s/^{/{\"b\":\"$b\",\"r\":$r,/" | tee -a $OUT/ab.jsonl \
      | python3 -c 'import json,sys
for l in sys.stdin:
    j = json.loads(l); print(j["b"], j["r"], j.get("mode"), j.get("median_ms"), j.get("mfu"), j.get("peak_mem_gib"), j.get("error", ""))'
  done
done
[ -n "$PROBE" ] && timeout 120 $TANDEM_PYTHON gpu/dev/overlap_probe.py 2>&1 | tee $OUT/overlap.txt
if [ -n "$PIPE" ]; then
  rm -rf /tmp/pipe*
  timeout 300 $TANDEM_PYTHON bench/pipeline.py --tandem build/bin/tandem --size 8b --target-device cuda:0 --drafter-device cuda:0 \
    --steps 60 --work /tmp/pipe1 --timeout 260 2>$OUT/pipe.err | tee $OUT/pipe.jsonl | tail -3
fi
