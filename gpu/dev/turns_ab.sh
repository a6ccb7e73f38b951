source tools/gpu-host/env.sh
B=build/bin/tandem
timeout 120 build/bin/gpu_tests --gtest_filter='graph.replay*:graph.replays_taken*' 2>&1 | grep -E "OK|FAILED|PASSED|SKIPPED|ms\)" | tee $OUT/graph_test.log
for mode in turns concurrent turns concurrent; do
  TANDEM_SHARED_GPU=$mode timeout 150 $TANDEM_PYTHON bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 \
    --drafter-device cuda:0 --steps 60 --work /tmp/pipe1 --timeout 140 2>>$OUT/pipe.err | sed "s/^{/{\"shared_gpu\": \"$mode\", /" | tee -a $OUT/ab.jsonl \
    | python3 -c "import json,sys; [print(j['shared_gpu'], j.get('step_ms_median'), j.get('compute_ms_median'), j.get('data_wait_share'), j.get('error')) for j in map(json.loads, sys.stdin)]"
done
rm -rf /tmp/pipe1
timeout 200 $TANDEM_PYTHON bench/reference_pipeline.py --size 8b --device cuda:0 --variants compiled --warmup 3 --iters 10 2>>$OUT/ref.err | tee -a $OUT/ab.jsonl | cut -c1-400
