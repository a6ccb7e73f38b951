# On the GPU host (see tools/gpu-host/pack): variants of the embedded default's
# recipe, each trained on cuda:0 in float32 (as the CPU default trains) and
# measured with `tandem eval` (8 held-out prompts, 128 new tokens, greedy,
# float32), into $OUT/recipe.log.  VARIANTS: "name|--set ... --set ..." lines.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=build/bin/tandem
DEF=config/default
while IFS='|' read -r name sets; do
  [[ -z "$name" ]] && continue
  start=$(date +%s)
  timeout 240 $B run $DEF.toml --set run.output_dir=/tmp/v_$name --set metrics.progress=false \
    --set placement.targets=cuda:0 --set placement.drafters=cuda:0 --set model.dtype=float32 \
    --set data.path=/tmp/v_data $sets > /tmp/v_$name.log 2>&1 || { echo "$name: run failed"; tail -3 /tmp/v_$name.log; continue; }
  t=$(( $(date +%s) - start ))
  r=$(timeout 120 $B eval --drafter /tmp/v_$name --target $DEF/target --tokenizer $DEF/tokenizer \
       --prompts $DEF/data/eval.jsonl --limit 8 --max-new-tokens 128 --device cuda --dtype float32 \
       --no-baseline --quiet 2>&1 | grep -E "tau  |histogram")
  echo "$name ($t s): $(tail -1 /tmp/v_$name.log | cut -c1-90) :: $r" | tee -a $OUT/recipe.log
done <<< "$VARIANTS"
