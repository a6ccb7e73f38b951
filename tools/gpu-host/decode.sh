# On the GPU host (see tools/gpu-host/pack): the decode engine on CUDA (issue
# 16) into $OUT: target_decode / speculative_cycle bench lines at 8B shapes,
# `tandem eval` of a drafter of the tiny default (DRAFTER, default
# .devbin/drafter) in bfloat16 and float32, and `tandem generate` at batch 64.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=build/bin/tandem
D=${DRAFTER:-.devbin/drafter}
DEF=config/default
timeout 240 $B bench target_decode --size 8b --warmup 3 --iters 10 2>>$OUT/decode.err | tee $OUT/decode_bench.jsonl
for dt in bfloat16 float32; do
  timeout 150 $B eval --drafter $D --target $DEF/target --tokenizer $DEF/tokenizer \
    --prompts $DEF/data/eval.jsonl --limit 8 --max-new-tokens 128 --device cuda --dtype $dt \
    --references --json --quiet > $OUT/eval_cuda_$dt.json 2> $OUT/eval_cuda_$dt.log
  cat $OUT/eval_cuda_$dt.log
done
$B prepare $DEF/data/train.jsonl --tokenizer $DEF/tokenizer --prompts-out /tmp/p128.jsonl --limit 128 --quiet
timeout 150 $B generate --target $DEF/target --prompts /tmp/p128.jsonl --out /tmp/gen.jsonl --batch 64 \
  --max-new-tokens 256 --device cuda | tee $OUT/generate_cuda.json
