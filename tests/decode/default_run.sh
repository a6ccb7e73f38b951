#!/usr/bin/env bash
# The README's run command on the embedded default, in two steps.
#   default_run.sh train TANDEM PYTHON SOURCE RUN_DIR [--set ...]
#       `tandem run config/default.toml` (plus the --set arguments) trains a
#       drafter on the conversations the tiny target regenerated.  The decode
#       tests' fixture shortens it to one epoch; decode.default_claim's runs
#       it whole.
#   default_run.sh tau|claim TANDEM PYTHON SOURCE RUN_DIR
#       `tandem eval` measures real speculative decoding on the held-out
#       prompts (config/default/data/eval.jsonl, 128 new tokens: `claim` all
#       31, the README's command; `tau` the first 8, as the shortened fixture's
#       run evaluates them) with the untrained-drafter and prompt-lookup
#       references beside it.  Both fail if greedy speculative decoding ever
#       differs from target-only decoding, if τ does not beat the untrained
#       drafter's by 0.3, or if the run's own real τ ([eval] in
#       config/default.toml: "eval" events in metrics.jsonl, the end summary)
#       is missing, not of the final step, or not equal to `tandem eval`'s on
#       the same weights and prompts (float32 on the CPU: the eval actor
#       decodes exactly as `tandem eval` does).  `claim` also checks what the
#       README claims for the whole default: τ > 2 and at least 10% above
#       prompt lookup's.
# Leaves RUN_DIR (the run) and RUN_DIR/eval.json (the report) for the other
# decode tests.
set -euo pipefail
step="$1"; tandem="$2"; python="$3"; source_dir="$4"; run_dir="$5"; shift 5  # then: --set ... for `train`
start=$(date +%s)
case "$step" in train|tau|claim) ;; *) echo "default_run.sh: unknown step '$step' (train, tau, claim)"; exit 2 ;; esac
if [[ "$step" == train ]]; then
  rm -rf "$run_dir"
  mkdir -p "$(dirname "$run_dir")"
  "$tandem" run "$source_dir/config/default.toml" --set run.output_dir="$run_dir" \
    --set metrics.progress=false --set placement.targets=cpu --set placement.drafters=cpu "$@" \
    > "$run_dir.train.log" 2>&1 || { tail -n 30 "$run_dir.train.log"; echo "FAILED: tandem run"; exit 1; }
  tail -n 2 "$run_dir.train.log"
  echo "training $(( $(date +%s) - start )) s"
  exit 0
fi
"$tandem" eval --drafter "$run_dir" --tokenizer "$source_dir/config/default/tokenizer" \
  --prompts "$source_dir/config/default/data/eval.jsonl" --limit "$([[ $step == claim ]] && echo 0 || echo 8)" \
  --max-new-tokens 128 --device cpu \
  --references --json --quiet \
  > "$run_dir/eval.json" 2> "$run_dir.eval.log" || { cat "$run_dir.eval.log"; echo "FAILED: tandem eval"; exit 1; }
cat "$run_dir.eval.log"
echo "eval $(( $(date +%s) - start )) s"
"$python" - "$run_dir/eval.json" "$run_dir/metrics.jsonl" "$run_dir.train.log" "$step" <<'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
lines = [json.loads(l) for l in open(sys.argv[2])]
evals = [l for l in lines if l.get("event") == "eval"]
end = [l for l in lines if l.get("event") == "end"]
ref = r["references"]
tau, lookup, untrained = r["tau"], ref["lookup_tau"], ref["untrained_tau"]
print(f"tau {tau:.3f} (per-prompt mean {r['tau_prompt_mean']:.3f}); untrained {untrained:.3f}; "
      f"prompt lookup {lookup:.3f}; {r['differing_prompts']} of {len(r['prompts'])} prompts differ from "
      "target-only decoding")
bad = []
if sys.argv[4] == "claim":
    if tau <= 2.0:
        bad.append(f"tau {tau:.3f} <= 2.0")
    if tau < 1.1 * lookup:
        bad.append(f"tau {tau:.3f} does not beat prompt lookup's {lookup:.3f} by 10%")
if tau < untrained + 0.3:
    bad.append(f"tau {tau:.3f} does not beat the untrained drafter's {untrained:.3f} by 0.3")
if r["differing_prompts"]:
    bad.append(f"{r['differing_prompts']} prompts differ from target-only greedy decoding (float32 must be exact)")
# Real tau during training ([eval]): every evaluation answered, the last of
# the final step, equal to tandem eval's on the same checkpoint and prompts.
print("run's evaluations:", [(e["step"], round(e.get("tau", 0), 3), e.get("error", "")) for e in evals])
if not evals or any("error" in e for e in evals):
    bad.append("the run's eval events are missing or failed")
elif not end or evals[-1]["step"] != end[-1]["steps"]:
    bad.append(f"the last evaluation (step {evals[-1]['step']}) is not of the final step {end and end[-1]['steps']}")
elif r["drafter_step"] != evals[-1]["step"] or abs(evals[-1]["tau"] - tau) > 1e-9:
    bad.append(f"the run's final tau {evals[-1]['tau']!r} (step {evals[-1]['step']}) differs from tandem eval's "
               f"{tau!r} (step {r['drafter_step']})")
elif evals[-1]["histogram"] != r["histogram"]:
    bad.append("the run's final histogram differs from tandem eval's")
if "tau " not in open(sys.argv[3]).read():
    bad.append("the run's end summary does not give tau")
for b in bad:
    print("FAILED:", b)
sys.exit(1 if bad else 0)
EOF
