#!/usr/bin/env bash
# `tandem run` with two data-parallel drafters (cuda:0 and cuda:1, one NCCL
# group) and a target on cuda:0, against the parity fixtures' tiny Qwen3 and
# the runtime tests' synthetic dataset:
#   1. two epochs train in lockstep, the loss falls, every epoch commits every
#      sample exactly once, one group is formed;
#   2. injected faults on either drafter (throw: the coordinator aborts the
#      group for its peer, left in the step's all-reduce; hang: its peer's
#      all-reduce times out after runtime.group_timeout_s and names the rank
#      that never arrived; nan: every rank skips the update, the drafter with
#      the non-finite loss is the failure) each restart that drafter only; the
#      survivor's guarded update was skipped (or every rank skipped it), so
#      the group is re-formed from the survivor's state with no step lost,
#      and the run completes with an exact ledger.
# Needs 2 GPUs: prints SKIPPED otherwise.  Assertions read metrics.jsonl.
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gpus=$("$tandem" info --json 2>/dev/null | "$python" -c 'import sys,json; print(len(json.load(sys.stdin).get("devices", [])))' 2>/dev/null || echo 0)
if [[ "${gpus:-0}" -lt 2 ]]; then
  echo "SKIPPED: data-parallel drafters need 2 GPUs, this host has ${gpus:-0}"
  exit 0
fi
source "$here/run_lib.sh"
run() {
  local out=$1; shift
  "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" --set placement.targets=cuda:0 \
    --set placement.drafters=cuda:0,cuda:1 --set checkpoint.every_steps=5 "$@"
}
count() { grep -c "\"event\":\"$2\"" "$1" || true; }

# 1. Two epochs, two drafters.
run plain > "$work/plain.log" 2>&1 || { tail -n 40 "$work/plain.log"; fail "plain run"; }
m="$work/plain/metrics.jsonl"; s=$(summary "$m"); echo "plain: $s"
check test "$(field "$s" end)" = epochs
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['last'] < s['first'] - 0.5, s" "$s"
check both_epochs_exact "$s"
check test "$(count "$m" group_formed)" = 1
# Both drafters report every step, at the same step numbers.
check "$python" - "$m" <<'EOF'
import json, sys, collections
steps = [json.loads(l) for l in open(sys.argv[1]) if '"event":"step"' in l]
by = collections.defaultdict(set)
for s in steps:
    by[s["step"]].add(s["drafter"])
full = sum(1 for d in by.values() if d == {0, 1})
print(f"group steps: {len(by)}, with both drafters: {full}")
assert len(by) >= 10 and full >= len(by) - 2, dict(by)
EOF

# 2. Faults on either drafter: each restarts that drafter only.
run faults --set runtime.step_timeout_s=8 --set runtime.group_timeout_s=3 \
    --fault drafter=1,kind=throw,at_step=6 --fault drafter=0,kind=hang,at_step=12 \
    --fault drafter=1,kind=nan,at_step=18 > "$work/faults.log" 2>&1 \
  || { tail -n 60 "$work/faults.log"; fail "faults run"; }
m="$work/faults/metrics.jsonl"; s=$(summary "$m"); echo "faults: $s"
check test "$(field "$s" failed)" = 3
check test "$(field "$s" restarted)" = 3
check test "$(field "$s" end)" = epochs
check both_epochs_exact "$s"
check test "$(count "$m" group_formed)" = 4
check grep -q 'injected fault (throw_in_step)' "$m"
check grep -q '"reason":"drafter 0 did not complete group step' "$m"
check grep -q 'drafter 1: non-finite loss' "$m"
# After a failure inside a step (throw, hang) the survivor's update was
# skipped (its all-reduce was cut short), after the NaN every rank skipped
# it: each time the survivor keeps the state (no step lost) and is rank 0
# of the next group.
check "$python" - "$m" <<'EOF'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1])]
failed = [e for e in ev if e["event"] == "drafter_failed"]
roots = [e["root"] for e in ev if e["event"] == "group_formed"][1:]
print("failed:", [(e["drafter"], e["restore_from"], e["steps_lost"]) for e in failed], "roots after:", roots)
assert [e["drafter"] for e in failed] == [1, 0, 1], failed
assert [e["restore_from"] for e in failed] == ["peers", "peers", "peers"], failed
assert [e["steps_lost"] for e in failed] == [0, 0, 0], failed
assert roots == [0, 1, 0], roots
EOF

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
