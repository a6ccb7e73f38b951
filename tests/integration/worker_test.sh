#!/usr/bin/env bash
# `tandem run`'s worker process and the restore points in shared memory
# (issue 19): the tiny run of run_test.toml for one epoch, restore points
# every 4 steps (checkpoint.host_dir in the work folder), checkpoints every 20.
#   reference   fault-free: its restore points are removed at the end; a
#               --resume of it has nothing to train and writes nothing;
#   abort       the worker aborts (SIGABRT) at step 11: the parent starts a
#               new worker, which resumes from the restore point of step 8
#               (or 4, on a loaded machine; not the checkpoint: none yet), and the run ends as the
#               reference did, bit for bit, its ledger exact;
#   sigkill     the worker (not tandem) is SIGKILLed mid-run (its drafter hung): the same;
#   no-parent   supervision.worker_restarts = 0: the abort ends the run (134),
#               and `--resume` continues from the restore point (restore
#               points every 2 steps there; see below);
#   budget      worker_restarts = 1 and two aborts: the second ends the run
#               (exit 1, "giving up"; the parent writes the run's end, reason
#               error, and removes the dead worker's control.json), each fault
#               firing once;
#   actors      a target and a prefetch throw: restarted in the process, their
#               batches issued again, the same result bit for bit;
#   teardown    the worker crashes after the run's end (TANDEM_TEST_ABORT_AT_EXIT):
#               not restarted (nothing is left to do), exit 0, the crash and its
#               stack on stderr, one end in the record; then a --resume with a
#               second epoch whose worker aborts mid-way: restarted (the old end
#               does not count), trained to the new end.
# ~25 s on 2 cores.
# TANDEM_RUN_EXTRA: more arguments for every run, e.g. a GPU placement
# (tools/gpu-host/tests.sh: target and drafter on cuda:0, where a restore
# point's copy runs beside the steps that follow it).
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_lib.sh"
helper() { "$python" "$here/soak_schedule.py" "$@"; }
read -r -a extra <<< "${TANDEM_RUN_EXTRA:-}"
t0=$SECONDS
common=(--set data.epochs=1 --set checkpoint.every_steps=20 --set checkpoint.host_every=4)
run() { local out=$1; shift; "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" \
          --set checkpoint.host_dir="$work/$out-shm" "${common[@]}" ${extra[@]+"${extra[@]}"} "$@"; }
newest() { ls -d "$1"/checkpoints/step-* 2>/dev/null | grep -v '\.tmp$' | sort | tail -n 1 || true; }
lines() { "$python" -c 'import json,sys; print(json.dumps([x for x in map(json.loads, open(sys.argv[1])) if x["event"] == sys.argv[2]]))' "$1" "$2"; }
first() { "$python" -c 'import json,sys; l=json.loads(sys.argv[1]); print(l[0][sys.argv[2]] if l else "none")' "$1" "$2"; }

# Fault-free.
run ref > "$work/ref.log" 2>&1 || { cat "$work/ref.log"; fail "fault-free run"; }
s=$(summary "$work/ref/metrics.jsonl"); echo "reference: $s"
check test "$(field "$s" end)" = epochs
check test "$(lines "$work/ref/metrics.jsonl" restore_point)" != "[]"
check test ! -e "$work/ref-shm"   # removed once the run kept everything
ref=$(newest "$work/ref")
# A --resume of a run that ended: nothing to train, nothing written.
n=$(wc -l < "$work/ref/metrics.jsonl")
rc=0; run ref --resume > "$work/ref-again.log" 2>&1 || rc=$?
check test "$rc" = 0
check grep -q "already ended at step" "$work/ref-again.log"
check test "$(wc -l < "$work/ref/metrics.jsonl")" = "$n"

same_as_reference() {  # $1: output folder
  check helper same "$ref" "$(newest "$1")"
  check helper ledger "$1/metrics.jsonl" 1 64
  check test "$(field "$(summary "$1/metrics.jsonl")" end)" = epochs
}

# The worker aborts at step 11.
rc=0; run abort --fault drafter=0,kind=abort,at_step=11 > "$work/abort.log" 2>&1 || rc=$?
check test "$rc" = 0
m="$work/abort/metrics.jsonl"
w=$(lines "$m" worker_restarted); r=$(lines "$m" resumed); echo "abort: $w $r"
check grep -q "signal 6" <<< "$(first "$w" exit)"
check test "$(first "$r" tier)" = host
# The restore point of step 8, or on a loaded machine step 4's (step 8's not
# yet written when the abort landed: they are written beside training).
check grep -qx "8\|4" <<< "$(first "$r" step)"
check grep -q "starting a new one (restart 1 of 3)" "$work/abort.log"
check grep -q "tandem run (worker): fatal signal SIGABRT; the stack" "$work/abort.log"
same_as_reference "$work/abort"

# The worker crashes in teardown, after the run ended and checkpointed.
rc=0; TANDEM_TEST_ABORT_AT_EXIT=1 run teardown > "$work/teardown.log" 2>&1 || rc=$?
check test "$rc" = 0
check grep -qE "after the run had ended at step [0-9]+, checkpointed: nothing is lost" "$work/teardown.log"
check grep -q "fatal signal SIGABRT" "$work/teardown.log"
check test "$(lines "$work/teardown/metrics.jsonl" worker_restarted)" = "[]"
check test "$(lines "$work/teardown/metrics.jsonl" end | "$python" -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1
# A --resume with more to train (a second epoch) whose worker aborts before
# its end, no step record written since the earlier end (log_every 1000): that
# end does not count, so the parent restarts the worker and the run trains to
# its new end.
rc=0; "$tandem" run "$work/run.toml" --resume --set run.output_dir="$work/teardown" \
  --set checkpoint.host_dir="$work/teardown-shm" --set data.epochs=2 --set checkpoint.every_steps=20 \
  --set checkpoint.host_every=4 --set train.log_every=1000 --fault drafter=0,kind=abort,at_step=50 ${extra[@]+"${extra[@]}"} \
  > "$work/more.log" 2>&1 || rc=$?
check test "$rc" = 0
check grep -q "starting a new one (restart 1 of 3)" "$work/more.log"
s=$(summary "$work/teardown/metrics.jsonl"); echo "more: $s"
check test "$(field "$s" end)" = epochs
check test "$(field "$s" last_checkpoint)" -gt 50   # (no step records: log_every 1000)

# A target and a prefetch fail in the process (an exception each): each is
# restarted, the batches in flight are issued again, and nothing else moves:
# the drafter keeps its state, the run ends as the reference did, bit for bit.
rc=0; run actors --fault target=0,kind=throw,at_step=12 --fault prefetch=0,kind=throw,at_step=30 \
  > "$work/actors.log" 2>&1 || rc=$?
check test "$rc" = 0
m="$work/actors/metrics.jsonl"
echo "actors: $(lines "$m" actor_failed) $(lines "$m" reissued)"
check test "$(lines "$m" actor_failed | "$python" -c 'import json,sys; print(sorted(x["role"] for x in json.load(sys.stdin)))')" = "['prefetch', 'target']"
check test "$(lines "$m" actor_restarted | "$python" -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 2
check test "$(lines "$m" reissued)" != "[]"
check test "$(lines "$m" drafter_failed)" = "[]"
check test "$(lines "$m" worker_restarted)" = "[]"
same_as_reference "$work/actors"

# The worker is SIGKILLed after step 13 (tandem itself is not), while its
# drafter hangs before step 14 (a "hang" fault: its step would time out after
# step_timeout_s, 120 s), so that the kill lands mid-run however fast the
# device is (on a GPU the 44 steps take under a second).  The hang fires once
# in the tandem run: the new worker trains through step 14.  No checkpoint
# before the end here: the newest restore point is the only choice.
run sigkill --set checkpoint.every_steps=1000 --fault drafter=0,kind=hang,at_step=14 > "$work/sigkill.log" 2>&1 & pid=$!  # the subshell running `run`; tandem is its child
helper wait "$work/sigkill/metrics.jsonl" 0 13 "$pid" 120 || fail "step 13 never came"
parent=$(pgrep -P "$pid" | head -n 1); [[ -n "$parent" ]] || fail "no tandem process under $pid"
worker=$(pgrep -P "$parent" | head -n 1); [[ -n "$worker" ]] || fail "no worker process under tandem ($parent)"
check test "$(cat "$work/sigkill/.lock")" = "$parent"  # the parent holds the folder across its workers
kill -KILL "$worker"
rc=0; wait "$pid" || rc=$?
check test "$rc" = 0
m="$work/sigkill/metrics.jsonl"
check grep -q "signal 9" <<< "$(first "$(lines "$m" worker_restarted)" exit)"
check test "$(first "$(lines "$m" resumed)" tier)" = host
same_as_reference "$work/sigkill"

# No parent: the abort ends the run; --resume takes the restore point.
# Restore points are written beside training, not waited for: on a loaded
# machine none may be complete when the abort lands (each takes a write and
# an fsync; a step here takes ~10 ms).  Every 2 steps here, so that one of
# the five due before step 11 almost always is; when none is, `--resume`
# must refuse (exit 2) and say why, and that is what is checked then.
rc=0; run noparent --set checkpoint.host_every=2 --set supervision.worker_restarts=0 \
  --fault drafter=0,kind=abort,at_step=11 > "$work/noparent.log" 2>&1 || rc=$?
check test "$rc" = 134
check test "$(lines "$work/noparent/metrics.jsonl" worker_restarted)" = "[]"
kept=$(ls -d "$work/noparent-shm"/step-* 2>/dev/null | grep -v '\.tmp$' || true)
rc=0; run noparent --set checkpoint.host_every=2 --set supervision.worker_restarts=0 --resume \
  > "$work/noparent-2.log" 2>&1 || rc=$?
if [[ -n "$kept" ]]; then
  check test "$rc" = 0
  check grep -q "a restore point in shared memory" "$work/noparent-2.log"
  same_as_reference "$work/noparent"
else
  echo "noparent: no restore point was complete when the abort landed (a loaded machine): checking the refusal"
  check test "$rc" = 2
  check grep -q "no complete checkpoint" "$work/noparent-2.log"
fi

# The budget: one restart, two aborts.
rc=0; run budget --set supervision.worker_restarts=1 --fault drafter=0,kind=abort,at_step=11 \
  --fault drafter=0,kind=abort,at_step=17 > "$work/budget.log" 2>&1 || rc=$?
check test "$rc" = 1
check grep -q "giving up" "$work/budget.log"
check test "$(lines "$work/budget/metrics.jsonl" worker_restarted | "$python" -c 'import json,sys; print(len(json.load(sys.stdin)))')" = 1
check test -d "$work/budget-shm"   # kept for --resume
# The dead worker could not close the run's record: the parent did.
check test "$(field "$(summary "$work/budget/metrics.jsonl")" end)" = error
check test ! -e "$work/budget/control.json"

echo "worker: $((SECONDS - t0)) s"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
