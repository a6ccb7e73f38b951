# On the GPU host (see tools/gpu-host/pack): the benchmark lines quoted in
# the closing notes, into $OUT/bench.jsonl; the 2-GPU pipeline needs 2 GPUs.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=build/bin/tandem
run() { timeout "$1" "${@:2}" 2>>$OUT/bench.err | tee -a $OUT/bench.jsonl; }
run 120 $B bench drafter_step --size tiny --warmup 5 --iters 30 --reference
run 100 $B bench drafter_step --size 8b --warmup 3 --iters 10
run 60 $B bench drafter_step_eager --size 8b --warmup 2 --iters 5
run 90 $B bench target_forward --size 8b --warmup 2 --iters 10
run 60 $B bench dflash_attention --size 8b --warmup 3 --iters 20
run 150 $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 --iters 10
run 200 $TANDEM_PYTHON bench/reference_target.py --size 8b --variants eager,compiled --iters 10
run 230 $TANDEM_PYTHON bench/pipeline.py --tandem $B --size 8b --steps 60 --work /tmp/pipe --timeout 200
