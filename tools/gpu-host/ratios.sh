# On the GPU host (see tools/gpu-host/pack): issue 20's ratios, each Tandem
# figure beside its Python reference at its strongest, in one call, into
# $OUT/ratios.jsonl (stderr in $OUT/ratios.err).  One part a call: together
# they take longer than a call may run.
#   bash tools/gpu-host/ratios.sh step      drafter step: Tandem graphed/eager and
#                                           bench/reference_step.py eager, compiled,
#                                           flex-compiled (~7 min, compiling included)
#   bash tools/gpu-host/ratios.sh target    target forward: Tandem's paths and
#                                           bench/reference_target.py eager, compiled (~5 min)
#   bash tools/gpu-host/ratios.sh pipeline  one GPU shared by target and drafter:
#                                           bench/pipeline.py on cuda:0 and
#                                           bench/reference_pipeline.py compiled (~5 min)
#   bash tools/gpu-host/ratios.sh autotune  the references with mode="max-autotune"
#                                           (REF_TIMEOUT s each, default 500)
# EXTRA_VARIANTS adds reference variants to `step` (e.g. flex-max-autotune).
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=build/bin/tandem
part=${1:?usage: ratios.sh step|target|pipeline|autotune}
run() { timeout "$1" "${@:2}" 2>>$OUT/ratios.err | tee -a $OUT/ratios.jsonl; }
case "$part" in
  step)
    # The reference variants one process each, so that a slow compilation
    # loses only its own line (`tandem bench drafter_step --reference` runs
    # them all in one process and prints them at its end).
    run 150 $B bench drafter_step --size 8b --warmup 3 --iters 10
    for v in eager compiled flex-compiled $EXTRA_VARIANTS; do
      run 240 $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 --variants $v --iters 10
    done ;;
  target)
    run 120 $B bench target_forward --size 8b --warmup 2 --iters 10
    run 330 $TANDEM_PYTHON bench/reference_target.py --size 8b --variants eager,compiled --iters 10 ;;
  pipeline)
    # 200 steps (194 measured): a 60-step window weighs the one-off costs
    # (the first restore point in shared memory) three times as much.
    run 300 $TANDEM_PYTHON bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 \
      --drafter-device cuda:0 --steps 200 --work /tmp/pipe1 --timeout 280
    rm -rf /tmp/pipe1  # its 16 GB target
    run 280 $TANDEM_PYTHON bench/reference_pipeline.py --size 8b --device cuda:0 --variants compiled \
      --warmup 3 --iters 10 ;;
  autotune)
    run ${REF_TIMEOUT:-500} $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 \
      --variants flex-max-autotune --iters 10 ;;
  *) echo "ratios.sh: unknown part '$part' (step, target, pipeline, autotune)" >&2; exit 2 ;;
esac
