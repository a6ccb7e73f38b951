#!/usr/bin/env bash
# `tandem run` end to end on the CPU, as a user runs it, against the tiny
# Qwen3 of the parity fixtures and a small synthetic token dataset:
#   1. two epochs train, the loss falls, every epoch commits every sample;
#   2. injected faults (throw, nan, hang) each end in a restart from the
#      restore point in device memory (no step lost: the last loss is the
#      plain run's, bit for bit), and with
#      checkpoint.memory_every = 0 from the newest checkpoint; the run
#      completes with an exact ledger;
#   2b. a drafter busy with a slow snapshot is not taken for dead;
#   3. past the restart budget the run stops with a report naming the drafter;
#   4. SIGTERM (and SIGHUP) finishes the step, writes a checkpoint and exits 0;
#   5. stop at step 20 + --resume gives the uninterrupted run's losses for
#      steps 1..40 exactly (tolerance: bit-identical on the CPU).
# The assertions read metrics.jsonl (structured), never the progress text.
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_lib.sh"

# TANDEM_RUN_EXTRA: more arguments for every run, e.g. a GPU placement
# ("--set placement.targets=cuda:0 --set placement.drafters=cuda:0").
read -r -a extra <<< "${TANDEM_RUN_EXTRA:-}"
run() { local out=$1; shift; "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" "${extra[@]}" "$@"; }

# 1. Two epochs.
run plain > "$work/plain.log" 2>&1 || { cat "$work/plain.log"; fail "plain run"; }
s=$(summary "$work/plain/metrics.jsonl"); echo "plain: $s"
plain_last=$(field "$s" last)
check test "$(field "$s" end)" = epochs
# No worker process died, in training or in teardown (a crash after the end
# is not restarted, but still prints its stack: report_crashes).
check test "$(field "$s" worker_restarts)" = 0
check bash -c '! grep -q "fatal signal" "$1"' _ "$work/plain.log"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['last'] < s['first'] - 0.5, s" "$s"
check both_epochs_exact "$s"

# 2. Faults: each ends in a restart; the run completes with an exact ledger.
run faults --set runtime.step_timeout_s=1.5 --fault drafter=0,kind=hang,at_step=12 \
    --fault drafter=0,kind=throw,at_step=30 --fault drafter=0,kind=nan,at_step=50 \
    > "$work/faults.log" 2>&1 || { cat "$work/faults.log"; fail "faults run"; }
s=$(summary "$work/faults/metrics.jsonl"); echo "faults: $s"
check test "$(field "$s" failed)" = 3
check test "$(field "$s" restarted)" = 3
check test "$(field "$s" end)" = epochs
check both_epochs_exact "$s"
# Restores from device memory lose nothing: the last step's loss is the plain run's, bit for bit.
check test "$(field "$s" last)" = "$plain_last"
check grep -q '"reason":"drafter 0 hung' "$work/faults/metrics.jsonl"
check grep -q 'non-finite loss' "$work/faults/metrics.jsonl"
check grep -q 'injected fault (throw_in_step)' "$work/faults/metrics.jsonl"
# Restored from device memory: no completed step lost (issue 19: <= 1).
check "$python" -c 'import json,sys; f=[j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "drafter_failed"]; assert [(x["restore_from"], x["steps_lost"], x["restore_step"]) for x in f] == [("memory", 0, 11), ("memory", 0, 29), ("memory", 0, 49)], f' "$work/faults/metrics.jsonl"
# Without it, from the newest checkpoint (every 20 steps).
run faults-disk --set checkpoint.memory_every=0 --set train.max_steps=40 --fault drafter=0,kind=throw,at_step=30 \
    > "$work/faults-disk.log" 2>&1 || { cat "$work/faults-disk.log"; fail "faults run without memory restore points"; }
# The newest durable checkpoint when the drafter failed (step 20's, unless a
# loaded machine had not finished writing it by step 30: then none).
check "$python" -c '
import json, sys
lines = [j for j in map(json.loads, open(sys.argv[1]))]
at = next(i for i, j in enumerate(lines) if j["event"] == "drafter_failed")
held = [j["step"] for j in lines[:at] if j["event"] == "checkpoint"]
want = held[-1] if held else 0
f = [j for j in lines if j["event"] == "drafter_failed"]
assert want in (0, 20), held
assert [(x["restore_from"], x["steps_lost"], x["restore_step"]) for x in f] == [("checkpoint", 29 - want, want)], (f, held)
' "$work/faults-disk/metrics.jsonl"

# 2b. Busy is not dead (issue 19): snapshots that copy for 2 x heartbeat_s
# + 1 = 3 s on the drafter's thread, one mid-run (step 20) and the last one
# (step 30, max_steps: nothing else to do, the case that lost a whole 8B run
# on an H200).  The coordinator asks no heartbeat of, and sends no work to, a
# drafter it is waiting on for a snapshot, so nothing fails and the final
# checkpoint holds step 30 (before: "missed its heartbeat" and a rollback to
# step 20, a step-20 checkpoint rewritten, success reported).  ~10 s.
run busy --set runtime.heartbeat_s=1 --set train.max_steps=30 \
    --fault drafter=0,kind=slow_snapshot,at_step=20 --fault drafter=0,kind=slow_snapshot,at_step=30 \
    > "$work/busy.log" 2>&1 || { cat "$work/busy.log"; fail "slow snapshot run"; }
s=$(summary "$work/busy/metrics.jsonl"); echo "slow snapshot: $s"
check test "$(grep -c "injected fault 'slow_snapshot'" "$work/busy.log")" = 2
check test "$(field "$s" failed)" = 0
check test "$(field "$s" end)" = max_steps
check test "$(field "$s" last_step)" = 30
check test "$(field "$s" last_checkpoint)" = 30
check "$python" -c 'import json,sys; c=[j["step"] for j in map(json.loads, open(sys.argv[1])) if j["event"] == "checkpoint"]; assert c == [20, 30], c' "$work/busy/metrics.jsonl"

# 3. Restart budget.
if run budget --set supervision.restart_budget=1 --fault drafter=0,kind=throw,at_step=5 \
     --fault drafter=0,kind=throw,at_step=9 > "$work/budget.log" 2>&1; then
  failed=$((failed+1)); echo "FAILED: a run past its restart budget exited 0"
else
  check grep -q "drafter 0 failed 2 times" "$work/budget.log"
  check grep -q "restart budget 1" "$work/budget.log"
  grep -q "restart budget 1" "$work/budget.log" || { echo "budget.log:"; tail -n 20 "$work/budget.log"; }
fi

# 4. SIGTERM, and SIGHUP (a closed terminal): finish the step, checkpoint, exit 0.
for sig in TERM HUP; do
"$tandem" run "$work/run.toml" --set run.output_dir="$work/signal-$sig" "${extra[@]}" --set data.epochs=200 \
  > "$work/signal-$sig.log" 2>&1 &
pid=$!  # tandem itself (a shell function here would put a subshell in between)
for _ in $(seq 150); do
  sleep 0.2
  if [[ -f "$work/signal-$sig/metrics.jsonl" ]] && (( $(grep -c '"event":"step"' "$work/signal-$sig/metrics.jsonl") >= 30 )); then
    break
  fi
done
kill -"$sig" "$pid" 2>/dev/null || echo "the signal run had already ended"
if wait "$pid"; then
  s=$(summary "$work/signal-$sig/metrics.jsonl"); echo "signal $sig: $s"
  check test "$(field "$s" end)" = signal
  check test "$(field "$s" last_checkpoint)" = "$(field "$s" last_step)"
else
  failed=$((failed+1)); echo "FAILED: SIG$sig exit status"; cat "$work/signal-$sig.log"
fi
done

# 5. Resume follows the uninterrupted trajectory exactly.
run whole --set train.max_steps=40 > /dev/null 2>&1 || fail "whole run"
run parts --set train.max_steps=20 > /dev/null 2>&1 || fail "first part"
run parts --set train.max_steps=40 --resume > "$work/resume.log" 2>&1 || { cat "$work/resume.log"; fail "resume"; }
check "$python" "$here/compare_losses.py" "$work/whole/metrics.jsonl" "$work/parts/metrics.jsonl" 40

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
