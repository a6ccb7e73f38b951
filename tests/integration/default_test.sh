#!/usr/bin/env bash
# The README's run command on the embedded default, shortened to a few dozen
# steps: `tandem run config/default.toml` prepares config/default/data into
# the run folder, trains a drafter against the shipped tiny target on the
# CPU, and the loss falls below ln(vocab) (better than uniform guessing:
# the drafter has learned the target's token distribution); a second run
# reuses the prepared data; a damaged config names the field.
set -euo pipefail
tandem="$1"; python="$2"; source_dir="$3"
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT; echo "work: $work"
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }

run() {
  "$tandem" run "$source_dir/config/default.toml" --set run.output_dir="$work/run" \
    --set metrics.progress=false --set train.log_every=5 --set placement.targets=cpu \
    --set placement.drafters=cpu "$@"
}

run --set train.max_steps=60 > "$work/first.log" 2>&1 || { cat "$work/first.log"; echo "FAIL: first run"; exit 1; }
tail -n 3 "$work/first.log"
check test -f "$work/run/data/manifest.json"
check grep -q "prepare: wrote 550 samples" "$work/first.log"
check grep -q "tandem run: max_steps after 60 steps" "$work/first.log"
# Logged losses: the first (step 5) against the mean of the last three.
check "$python" - "$work/run/metrics.jsonl" <<'EOF'
import json, math, sys
steps = [r for r in map(json.loads, open(sys.argv[1])) if "loss" in r]
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-3:]) / 3
print(f"loss: step {steps[0]['step']} {first:.3f} -> steps {steps[-3]['step']}-{steps[-1]['step']} "
      f"{last:.3f} (uniform guessing: {math.log(2048):.3f})")
assert all(math.isfinite(r["loss"]) for r in steps)
assert last < first / 2 and last < math.log(2048), (first, last)
EOF

# Again, to step 70: the prepared data is reused, training resumes.
run --set train.max_steps=70 --resume > "$work/second.log" 2>&1 || { cat "$work/second.log"; echo "FAIL: second run"; exit 1; }
check grep -q "reusing it" "$work/second.log"
check grep -q "resuming from .*step-00000060" "$work/second.log"
check grep -q "tandem run: max_steps after 70 steps" "$work/second.log"

# A mistyped key and a missing target name the file and the field.
if run --set data.seq_lenn=5 > "$work/bad.log" 2>&1; then
  failed=$((failed+1)); echo "FAILED: a mistyped key was accepted"
else
  check grep -q "unknown key 'data.seq_lenn' (did you mean 'data.seq_len'?)" "$work/bad.log"
fi
if run --set model.target="$work/nowhere" > "$work/bad.log" 2>&1; then
  failed=$((failed+1)); echo "FAILED: a missing target was accepted"
else
  check grep -q "default.toml: 'model.target' = \"$work/nowhere\": no such folder" "$work/bad.log"
fi

echo "$passed passed, $failed failed"
test "$failed" -eq 0
