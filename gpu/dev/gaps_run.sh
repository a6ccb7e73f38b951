# On the GPU host (after tools/gpu-host/pack here): the drafter step graphed and eager with
# kernel_ms (busy_ms, span_ms) and both traces' idle gaps (gpu/dev/trace_gaps.py), into $OUT.
# On an H200 also the step's strongest reference (flex-compiled), for the floor.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader | tee $OUT/gpu.txt
timeout 200 build/bin/tandem bench drafter_step --size 8b --warmup 3 --iters 10 --trace $OUT/tr \
  2>>$OUT/gaps.err | tee $OUT/step.jsonl
for f in $OUT/tr/drafter_step_8b.json $OUT/tr/drafter_step_8b_graphed.json; do
  echo "== $f"; python3 gpu/dev/trace_gaps.py $f 3 --top 25
done | tee $OUT/gaps.txt
python3 gpu/dev/trace_kernels.py $OUT/tr/drafter_step_8b_graphed.json 3 | head -40 > $OUT/kernels_graphed.txt
if grep -q H200 $OUT/gpu.txt; then
  timeout 240 $TANDEM_PYTHON bench/reference_step.py --size 8b --device cuda:0 --variants flex-compiled \
    --iters 10 2>>$OUT/gaps.err | tee -a $OUT/step.jsonl
fi
xz -T4 $OUT/tr/*.json
