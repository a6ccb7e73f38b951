# On the GPU host (see tools/gpu-host/pack): issue 17's H200 check.  The 8B
# pipeline of bench/pipeline.py (random Qwen3-8B target and synthetic data,
# target and drafter on cuda:0; made once in $W) trained with the control
# endpoint, and tools/gpu-host/shell_cost.py: phases of PHASE_S seconds
# (default 20) with and without a client polling every 100 ms, `tandem shell
# -c top/tree/ledger/show` captured, `stop` through the shell at the end.
# Into $OUT: shell_cost.jsonl (the line), shell_*.txt, shell_cost_run.log.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
W=${W:-/tmp/pipe}
B=build/bin/tandem
[[ -f $W/run.toml && -f $W/target/config.json ]] || \
  timeout 400 "$TANDEM_PYTHON" bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 \
    --drafter-device cuda:0 --work "$W" --setup-only >&2 || { echo "shell: setup failed" >&2; exit 1; }
rm -rf "$W/shell"
timeout 420 "$TANDEM_PYTHON" tools/gpu-host/shell_cost.py --tandem $B --config "$W/run.toml" \
  --run-dir "$W/shell" --phase-s "${PHASE_S:-20}" --phases "${PHASES:-8}" --out "$OUT" \
  | tee -a "$OUT/shell_cost.jsonl"
