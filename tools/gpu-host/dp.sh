# On the GPU host (see tools/gpu-host/pack), with 2 GPUs: `tandem run` with
# two data-parallel drafters, lockstep training and faults on either drafter
# (tests/integration/dp_run_test.sh).  Logs go to $OUT when set.
if [ $# -gt 0 ]; then  # no options (not even --dry-run: tools/gpu-host/two_gpu.sh --dry-run shows the plan)
  echo "usage: bash tools/gpu-host/dp.sh  (no options; on the GPU host after tools/gpu-host/pack)" >&2; exit 2
fi
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
timeout 400 tests/integration/dp_run_test.sh build/bin/tandem $TANDEM_PYTHON $ROOT/build/fixtures 2>&1 \
  | tee $OUT/dp_run_test.log | tail -25
