#!/usr/bin/env bash
# The README's run command on the embedded default, shortened to a few dozen
# steps: `tandem run config/default.toml` prepares config/default/data into
# the run folder, trains a drafter against the shipped tiny target on the
# CPU, and the loss falls below ln(vocab) (better than uniform guessing:
# the drafter has learned the target's token distribution); a second run
# reuses the prepared data and resumes from the first one's checkpoint; a
# damaged config names the field.
#
# The final real-tau evaluation ([eval] at_end) is off here: decode.default_tau
# checks it (it would take half this test's time).
#
# The runs are read from their structured record, not from their logs:
# metrics.jsonl (JSON lines, appended by each run: "epoch", "step",
# "checkpoint" and "end" events; a run's lines end with its "end") and the
# prepared data folder.  Only a rejected config, which never starts a run,
# is judged by its error message.
set -euo pipefail
tandem="$1"; python="$2"; source_dir="$3"
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT; echo "work: $work"
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }

run() {
  "$tandem" run "$source_dir/config/default.toml" --set run.output_dir="$work/run" \
    --set metrics.progress=false --set train.log_every=5 --set placement.targets=cpu \
    --set placement.drafters=cpu --set eval.at_end=false "$@"
}

# Checks run `$1` (0: the first) of metrics.jsonl with the Python on stdin,
# which sees `run` (that run's records, in order), `runs` (all of them) and
# `events(name[, records])`.
check_run() {
  local n="$1" code; code=$(cat)
  check "$python" - "$work/run/metrics.jsonl" "$n" "$code" <<'EOF_PY'
import json, math, sys
records = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
runs, cur = [], []
for r in records:
    cur.append(r)
    if r.get("event") == "end":
        runs.append(cur); cur = []
if cur:
    runs.append(cur)  # a run that did not end
def events(name, rs=None):
    return [r for r in (records if rs is None else rs) if r.get("event") == name]
n = int(sys.argv[2])
assert len(runs) > n, f"metrics.jsonl holds {len(runs)} run(s), expected run {n}"
run = runs[n]
exec(sys.argv[3])
EOF_PY
}
# The prepared data set: every file with its size and modification time.
data_listing() { (cd "$work/run/data" && find . -type f -printf '%p %s %T@\n' | sort); }

run --set train.max_steps=60 > "$work/first.log" 2>&1 || { cat "$work/first.log"; echo "FAIL: first run"; exit 1; }
tail -n 3 "$work/first.log"
check test -f "$work/run/data/manifest.json"
# The data set prepared: 546 samples (of the 550 regenerated conversations, 4 whose turn ended
# within 32 tokens are dropped by --min-supervised), in the manifest and in the run's epoch.
check "$python" -c 'import json, sys; t = json.load(open(sys.argv[1]))["totals"]; assert t["samples"] == 546, t' \
  "$work/run/data/manifest.json"
check_run 0 <<'EOF'
(epoch,) = events("epoch", run)
assert epoch["samples"] == 546, epoch
(end,) = events("end", run)
assert end["reason"] == "max_steps" and end["steps"] == 60, end
assert any(c["step"] == 60 for c in events("checkpoint", run)), events("checkpoint", run)
# run.name (default: the config file's stem) is in every line.
assert all(r.get("run") == "default" for r in run), [r for r in run if r.get("run") != "default"][:1]
EOF
# Logged losses: the first (step 5) against the mean of the last three.
check_run 0 <<'EOF'
steps = events("step", run)
first, last = steps[0]["loss"], sum(r["loss"] for r in steps[-3:]) / 3
print(f"loss: step {steps[0]['step']} {first:.3f} -> steps {steps[-3]['step']}-{steps[-1]['step']} "
      f"{last:.3f} (uniform guessing: {math.log(2048):.3f})")
assert all(math.isfinite(r["loss"]) for r in steps)
assert last < first / 2 and last < math.log(2048), (first, last)
EOF
data_listing > "$work/data.first"

# Again, to step 70: the prepared data is reused, training resumes.
run --set train.max_steps=70 --set run.name=resumed --resume > "$work/second.log" 2>&1 || { cat "$work/second.log"; echo "FAIL: second run"; exit 1; }
# Reused: not one file of the data set was written again.
data_listing > "$work/data.second"
check cmp -s "$work/data.first" "$work/data.second"
# Resumed from step 60: its first logged step is 65, it ends at 70, and its
# ledger starts with the samples the step-60 checkpoint had committed.
check_run 1 <<'EOF'
steps = [r["step"] for r in events("step", run)]
assert steps and steps[0] == 65 and steps[-1] == 70 and min(steps) > 60, steps
(end,) = events("end", run)
assert end["reason"] == "max_steps" and end["steps"] == 70, end
(at_60,) = [c for c in events("checkpoint", runs[0]) if c["step"] == 60]
(epoch,) = events("epoch", run)
assert epoch["already_committed"] == at_60["committed"] > 0, (epoch, at_60)
assert all(r.get("run") == "resumed" for r in run), "run.name set on the command line"
EOF

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
