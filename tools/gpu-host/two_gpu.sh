#!/usr/bin/env bash
# The two-GPU issue's parts 1 and 3 on a host with 2 GPUs (nvidia-h200-x2;
# part 2, the cluster across processes, is tools/gpu-host/cluster2.sh):
#   1. what landed without a two-GPU run: every gpu_tests case (data_parallel.*,
#      nccl.*, peer.* included: tools/gpu-host/tests.sh) and
#      tests/integration/dp_run_test.sh (two data-parallel drafters: throw,
#      hang and NaN faults restored from peers; tools/gpu-host/dp.sh);
#   3. the two-GPU pipeline at Qwen3-8B shapes (bench/pipeline.py: target on
#      cuda:0, drafter on cuda:1: samples/s, data wait, MFU) and the seed
#      topology (tools/gpu-host/seed.sh: 1 target + 2 drafters, one killed).
# Logs into $OUT (default /tmp): two_gpu_*.log, and pipeline/seed JSON lines
# in two_gpu.jsonl.  ~25 min at most (each step bounded by its timeout).
#
# usage (from the repository root):
#   tools/gpu-host/two_gpu.sh [--dry-run] [--tandem PATH] [--python PATH] [--extra-set KEY=VALUE]...
#   --extra-set one more --set for the dry run's config checks (repeatable)
#   --dry-run   needs no GPU (CI: tests/integration/gpu_host_dryrun_test.sh):
#     prints every command and runs none; checks that gpu_tests holds the
#     two-GPU cases (--gtest_list_tests), that the scripts exist, and that
#     the pipeline's and the seed's configs (bench/pipeline.py --size tiny
#     --setup-only, with their two-GPU placements) are accepted by tandem:
#     each starts as a cluster leader with its cuda:N on a member "dryrun"
#     (config, placement, target and data checked) and is stopped there.
#     Exit 1 if a check fails.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DRY=0 B=$ROOT/build/bin/tandem PY=''
extra=()
while (($#)); do
  case $1 in
    --dry-run) DRY=1; shift ;;
    --extra-set) extra+=(--set "$2"); shift 2 ;;
    --tandem) B=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "two_gpu: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
cd "$ROOT" || exit 2
if ((!DRY)); then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  ((gpus >= 2)) || { echo "two_gpu: needs 2 GPUs, nvidia-smi -L lists ${gpus}: nothing run (--dry-run checks the commands)"; exit 2; }
  # shellcheck source=/dev/null
  source tools/gpu-host/env.sh
fi
PY=${PY:-${TANDEM_PYTHON:-python3}}
OUT=${OUT:-/tmp}
mkdir -p "$OUT"
GT=$(dirname "$B")/gpu_tests
checked=0 bad=0 shown=0
show() { shown=$((shown + 1)); echo "+ $*"; }
verdict() {
  checked=$((checked + 1))
  if [[ $2 == 0 ]]; then echo "  checked: $1"; else bad=$((bad + 1)); echo "  FAILED: $1"; fi
}
# accepted NAME CONFIG TARGETS DRAFTERS: tandem takes the config with these
# placements (cuda:N moved onto a member "dryrun"), as far as it goes without GPUs.
accepted() {
  local name=$1 config=$2 dir; dir=$(mktemp -d)
  local t d
  t=$(sed -E 's/(^|,)/\1dryrun:/g' <<< "$3"); d=$(sed -E 's/(^|,)/\1dryrun:/g' <<< "$4")
  CUDA_VISIBLE_DEVICES='' "$B" run "$config" --set run.output_dir="$dir/out" --listen 127.0.0.1:0 \
    --set placement.targets="$t" --set placement.drafters="$d" "${extra[@]}" > "$OUT/two_gpu_$name.log" 2>&1 &
  local pid=$! ok=1
  for _ in $(seq 1 600); do
    [[ -s $dir/out/cluster.json ]] && { ok=0; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.05
  done
  kill -KILL $pid 2>/dev/null; wait $pid 2>/dev/null
  verdict "$name: config and placement $3 / $4 accepted" $ok
  ((ok == 0)) || tail -n 5 "$OUT/two_gpu_$name.log" | sed 's/^/    | /'
  rm -rf "$dir"
}

echo "== 1. gpu_tests and the data-parallel runtime test on two GPUs"
show bash tools/gpu-host/tests.sh
show bash tools/gpu-host/dp.sh
if ((DRY)); then
  list=$("$GT" --gtest_list_tests 2>/dev/null)
  for suite in data_parallel nccl peer; do
    grep -qiE "^${suite}[A-Za-z_]*\." <<< "$list"
    verdict "gpu_tests holds the ${suite}.* cases" $?
  done
  [[ -x tests/integration/dp_run_test.sh && -f tools/gpu-host/tests.sh && -f tools/gpu-host/dp.sh ]]
  verdict "tests.sh, dp.sh and dp_run_test.sh are there" $?
else
  OUT=$OUT bash tools/gpu-host/tests.sh 2>&1 | tee "$OUT/two_gpu_tests.log" | tail -20
  OUT=$OUT bash tools/gpu-host/dp.sh 2>&1 | tee "$OUT/two_gpu_dp.log" | tail -25
fi

echo "== 3. the two-GPU pipeline at 8B, and the seed topology with a drafter killed"
pipe=("$PY" bench/pipeline.py --tandem "$B" --size 8b --target-device cuda:0 --drafter-device cuda:1
      --steps 60 --timeout 420)
show timeout 500 "${pipe[@]}"
show bash tools/gpu-host/seed.sh
if ((DRY)); then
  W=$(mktemp -d)
  "$PY" bench/pipeline.py --tandem "$B" --size tiny --target-device cuda:0 --drafter-device cuda:1 \
    --work "$W/pipe" --setup-only > "$OUT/two_gpu_setup.log" 2>&1
  verdict "pipeline.py writes the two-GPU config (--size tiny --setup-only)" $?
  [[ -f $W/pipe/run.toml ]] && accepted pipeline "$W/pipe/run.toml" cuda:0 cuda:1
  [[ -f $W/pipe/run.toml ]] && accepted seed "$W/pipe/run.toml" cuda:0 cuda:0,cuda:1
  rm -rf "$W"
  echo "dry run: $checked checks, $bad failed"
  echo "SKIPPED (dry run): $shown commands not run"
  ((bad == 0))
  exit
fi
timeout 500 "${pipe[@]}" 2> "$OUT/two_gpu_pipeline.err" | tee -a "$OUT/two_gpu.jsonl"
OUT=$OUT bash tools/gpu-host/seed.sh 2>&1 | tail -5
cat "$OUT/seed.jsonl" >> "$OUT/two_gpu.jsonl" 2>/dev/null
