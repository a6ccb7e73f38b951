# Sourced by the gpu/dev A/B scripts on the GPU host (after tools/gpu-host/env.sh):
#   step_ab_rounds FILE   (and step_ab_losses, step_ab_checked, below)
# runs `tandem bench drafter_step --size 8b` of "old" and "new" in interleaved
# rounds (ROUNDS, default "1 2"), appends the JSON lines, each with its build and
# round, to $OUT/FILE, and prints one summary line each (ms, MFU, peak GiB, kernel
# classes over 0.1 ms). "new" is build/bin/tandem. "old" is, with OLD_ENV set
# (e.g. OLD_ENV="TANDEM_FIRST_LAYER_ROWS=all"), the same binary under those
# environment variables; else the build before, .devbin-old/tandem.xz.
step_ab_rounds() {
  local old_bin=/tmp/old/tandem
  if [ -n "$OLD_ENV" ]; then
    old_bin=build/bin/tandem
  else
    mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && chmod +x /tmp/old/tandem
  fi
  for r in ${ROUNDS:-1 2}; do
    for v in old new; do
      local bin=build/bin/tandem envs=""
      [ $v = old ] && bin=$old_bin && envs=$OLD_ENV
      env $envs timeout 100 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
        | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a "$OUT/$1" | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j.get('mode'), round(j['median_ms'], 2), round(j['mfu'], 4), round(j['peak_mem_gib'], 2),
          {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.1})"
    done
  done
}

# step_ab_losses FILE: each line's build, round, mode and last loss and grad norm (a change
# meant to keep the arithmetic must leave them equal between the builds).
step_ab_losses() {
  python3 -c "
import json
for l in open('$OUT/$1'):
    j = json.loads(l); print(j['build'], j['round'], j['mode'], 'last loss', j['last_step']['loss'], 'grad norm', j['last_step']['grad_norm'])"
}

# step_ab_checked FILTER FILE: gpu_tests --gtest_filter=FILTER (log in $OUT), then step_ab_rounds
# FILE and step_ab_losses FILE: the A/B of a change meant to keep the arithmetic.
step_ab_checked() {
  timeout 200 build/bin/gpu_tests --gtest_filter="$1" 2>&1 | tee "$OUT/gpu_tests_${2%.jsonl}.log" \
    | grep -E "^\[  (FAILED|PASSED|SKIPPED) |FAILED|graph vs" | tail -14
  step_ab_rounds "$2"
  step_ab_losses "$2"
}
