#!/usr/bin/env bash
# The CPU soak (issue 19, "Long runs with faults"): the tiny run of
# run_test.toml over several epochs, once without faults and once with faults
# at steps drawn from a seeded schedule (soak_schedule.py plan):
#   in-process: throw, nan, hang (step_timeout_s 1.5), slow_snapshot
#               (heartbeat_s 1), each rolled back and restarted inside the run;
#   process:    SIGTERM + --resume (the signal's checkpoint) and
#               SIGKILL + --resume (the newest checkpoint; the steps after it
#               are trained again).
# Then, from structured output only (metrics.jsonl, checkpoint files):
#   1. every segment ended as planned (the last with reason 'epochs') and
#      every in-process failure was restarted;
#   2. every epoch's ledger is exact across all the segments (one
#      metrics.jsonl, appended to by each resumed process);
#   3. the final checkpoint holds the fault-free run's training state bit for
#      bit: weights, AdamW moments and step, the drafter's generator, ledger.
# SOAK_SEED picks the schedule (printed, so a failure reproduces); SOAK_PLAN
# replaces it by fixed events ("throw@30,sigkill@45"); SOAK_EPOCHS (default
# 6); SOAK_REFERENCE reuses a fault-free run; KEEP_WORK=1 keeps the work folder.
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_lib.sh"
helper() { "$python" "$here/soak_schedule.py" "$@"; }

seed=${SOAK_SEED:-19}; epochs=${SOAK_EPOCHS:-6}; every=10; samples=64
echo "soak: SOAK_SEED=$seed SOAK_EPOCHS=$epochs${SOAK_PLAN:+ SOAK_PLAN=$SOAK_PLAN}"
read -r -a extra <<< "${TANDEM_RUN_EXTRA:-}"
# Both runs alike but for the faults: short liveness limits so that a hang and
# a slow snapshot cost seconds, a budget no schedule exhausts.
common=(--set data.epochs="$epochs" --set checkpoint.every_steps="$every"
        --set runtime.step_timeout_s=1.5 --set runtime.heartbeat_s=1
        --set supervision.restart_budget=100 "${extra[@]}")
# A SIGKILL of `tandem run` here stands for the machine's death, which the
# restore points in shared memory do not survive (worker_test.sh has them).
common+=(--set checkpoint.host_every=0)
run() { local out=$1; shift; "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" "${common[@]}" "$@"; }
newest() { ls -d "$1"/checkpoints/step-* 2>/dev/null | grep -v '\.tmp$' | sort | tail -n 1 || true; }
t0=$SECONDS

# The fault-free reference (SOAK_REFERENCE: an earlier one's output folder,
# same SOAK_EPOCHS, to try several schedules against one).
ref=${SOAK_REFERENCE:-$work/ref}
if [[ -z "${SOAK_REFERENCE:-}" ]]; then
  run ref > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; fail "fault-free run"; }
fi
s=$(summary "$ref/metrics.jsonl"); echo "fault-free: $s ($((SECONDS - t0)) s)"
last=$(field "$s" last_step)
[[ "$(field "$s" end)" == epochs ]] || fail "the fault-free run ended '$(field "$s" end)'"

# The faulty run, one process per segment of the schedule.
plan=$(helper plan "$seed" "$last" "$every" "${SOAK_PLAN:-}"); echo "schedule: $plan"
segments=$("$python" -c 'import json,sys; print(len(json.loads(sys.argv[1])))' "$plan")
metrics="$work/soak/metrics.jsonl"
expect_failures=0
for ((i = 0; i < segments; i++)); do
  # A kill before the first checkpoint was durable leaves nothing to resume
  # (--resume would say so and exit 2): start again, as a user would.
  resume=(); from=0
  if ((i > 0)) && [[ -n "$(newest "$work/soak")" ]]; then
    resume=(--resume)
    from=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1] + "/state.json"))["step"])' \
           "$(newest "$work/soak")")
  fi
  # This segment's faults: a throw, nan or hang at or before the step it
  # resumes from cannot come (a signal stops a few steps after its step).
  read -r end at faults <<< "$("$python" -c '
import json, sys
g, start = json.loads(sys.argv[1])[int(sys.argv[2])], int(sys.argv[3])
kept = [(k, s) for k, s in g["faults"] if k == "slow_snapshot" or s > start]
print(g["end"], g["at"], sum(k != "slow_snapshot" for k, _ in kept),
      *[f"--fault drafter=0,kind={k},at_step={s}" for k, s in kept])' "$plan" "$i" "$from")"
  read -r -a fault_args <<< "${faults#* }"; [[ "$faults" == *" "* ]] || fault_args=()
  expect_failures=$((expect_failures + ${faults%% *}))
  offset=$(stat -c %s "$metrics" 2>/dev/null || echo 0)
  "$tandem" run "$work/run.toml" --set run.output_dir="$work/soak" "${common[@]}" "${fault_args[@]}" \
    "${resume[@]}" > "$work/soak-$i.log" 2>&1 &
  pid=$!  # tandem itself
  if [[ $end == end ]]; then
    wait "$pid" || { cat "$work/soak-$i.log"; fail "segment $i (the last) exit status"; }
  else
    rc=0; helper wait "$metrics" "$offset" "$at" "$pid" 300 || rc=$?
    if ((rc != 0)); then
      kill -KILL "$pid" 2>/dev/null || true; cat "$work/soak-$i.log"
      fail "segment $i: step $at never came (wait status $rc)"
    fi
    if [[ $end == sigterm ]]; then
      kill -TERM "$pid"
      wait "$pid" || { cat "$work/soak-$i.log"; fail "segment $i: SIGTERM exit status"; }
      check test "$(field "$(summary "$metrics")" end)" = signal
    else
      kill -KILL "$pid"
      rc=0; wait "$pid" 2>/dev/null || rc=$?  # (bash's "Killed" notice)
      check test "$rc" = 137
    fi
  fi
  how=fresh; ((${#resume[@]} == 0)) || how="--resume from step $from"
  echo "segment $i: $how, ${fault_args[*]:-no faults}, $end at $at; newest checkpoint now:" \
       "$(basename "$(newest "$work/soak")" 2>/dev/null) ($((SECONDS - t0)) s)"
done

# 1. Ended as planned; every in-process failure restarted.
s=$(summary "$metrics"); echo "faulty: $s"
check test "$(field "$s" end)" = epochs
check test "$(field "$s" last_step)" = "$last"
check test "$(field "$s" failed)" = "$expect_failures"
check test "$(field "$s" restarted)" = "$expect_failures"

# 2. Every epoch's ledger exact, across the segments.
check helper ledger "$metrics" "$epochs" "$samples"

# 3. Bit for bit the fault-free run's training state.
a=$(newest "$ref"); b=$(newest "$work/soak")
echo "final checkpoints: $(basename "$a") (fault-free), $(basename "$b") (faults)"
# (check's own status is its last echo's: test the comparison itself.)
check helper same "$a" "$b"
if ! helper same "$a" "$b" > /dev/null; then
  echo "first step whose loss differs: $(helper losses "$ref/metrics.jsonl" "$metrics")"
  echo "the faulty run's events:"; helper events "$metrics"
fi

echo "soak: $((SECONDS - t0)) s; SOAK_SEED=$seed"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
