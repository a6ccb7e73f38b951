# On the GPU host (see tools/gpu-host/pack): variants of the embedded default's
# recipe, each trained on cuda:0 in float32 (as the CPU default trains) and
# measured with `tandem eval` (EVAL_LIMIT held-out prompts, 128 new tokens, greedy,
# float32), into $OUT/recipe.log.  VARIANTS: "name|--set ... --set ..." lines;
# EVAL_LIMIT (default 8) prompts, EVAL_EXTRA more `tandem eval` arguments
# (e.g. --references).
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
       --prompts $DEF/data/eval.jsonl --limit ${EVAL_LIMIT:-8} --max-new-tokens 128 --device cuda --dtype float32 \
       --no-baseline --quiet ${EVAL_EXTRA:-} 2>&1 | grep -E "tau  |histogram|references")
  # Mean step time (compute_ms of the logged steps) and the run's own eval lines, if any.
  ms=$($TANDEM_PYTHON -c "import json,sys; L=[json.loads(l) for l in open(sys.argv[1])]; S=[l['compute_ms'] for l in L if l.get('event')=='step']; E=[(l['step'],round(l.get('tau',0),3),round(l['seconds'],1)) for l in L if l.get('event')=='eval']; print(f'step {sum(S)/max(1,len(S)):.1f} ms', 'evals', E)" /tmp/v_$name/metrics.jsonl)
  echo "$name ($t s; $ms): $(tail -1 /tmp/v_$name.log | cut -c1-90) :: $r" | tee -a $OUT/recipe.log
done <<< "$VARIANTS"
