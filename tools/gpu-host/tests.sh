# On the GPU host (see tools/gpu-host/pack): every gpu_tests case, then the
# runtime test with target and drafter on cuda:0 (faults, restarts, resume)
# with captured graphs, then the worker process's test there (restore points
# in shared memory, copied beside training).  Logs go to $OUT when set.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
timeout 400 build/bin/gpu_tests 2>&1 | tee $OUT/gpu_tests.log | grep -E "^\[  (FAILED|PASSED) |graph vs|data parallel:|^round" | tail -40
TANDEM_RUN_EXTRA="--set placement.targets=cuda:0 --set placement.drafters=cuda:0" \
  timeout 200 tests/integration/run_test.sh build/bin/tandem $TANDEM_PYTHON $ROOT/build/fixtures 2>&1 | tee $OUT/run_test.log | tail -8
TANDEM_RUN_EXTRA="--set placement.targets=cuda:0 --set placement.drafters=cuda:0" \
  timeout 200 tests/integration/worker_test.sh build/bin/tandem $TANDEM_PYTHON $ROOT/build/fixtures 2>&1 | tee $OUT/worker_test.log | tail -4
