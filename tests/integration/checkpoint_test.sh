#!/usr/bin/env bash
# Checkpoints that survive kills, corruption and full disks (issue 19), with
# `tandem run` on the CPU as a user runs it (the tiny run of run_test.sh):
#   1. SIGKILL between a checkpoint's rename and the `latest` update, and
#      before the fsync of its state.json: --resume finds the newest complete
#      checkpoint and the run ends with the uninterrupted run's weights, bit
#      for bit;
#   2. a bit flipped in the newest checkpoint: --resume names the file and
#      tensor, moves it aside, continues from the previous one, and again
#      ends bit-equal;
#   3. a drafter that dies while the final checkpoint is taken: the run exits
#      non-zero and its end event names the step the durable checkpoint holds
#      (and the lost steps after it);
#   4. a disk too small (a tmpfs in a private mount namespace): refused at
#      start unless --force; with --force the checkpoint that does not fit
#      stops the run with the bytes needed, and the previous one is intact;
#   5. a fresh start into a folder holding a run: refused, --overwrite starts
#      again (one whose start fails puts the earlier run back, and so does the
#      next start after one SIGKILLed before its first checkpoint); a
#      checkpoint.host_dir that is not a folder of its own: refused; a resume
#      against other data: refused unless --force.
# The 60-trial SIGKILL test of the writer itself is in
# tests/unit/checkpoint_files_test.cpp.  The assertions read metrics.jsonl
# and the checkpoint files, never the progress text.  ~90 s on 2 cores.
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_lib.sh"

read -r -a extra <<< "${TANDEM_RUN_EXTRA:-}"
# The kills here stand for the machine's death: no worker process to restart
# (tests/integration/worker_test.sh has those) and no restore points in
# shared memory, which a machine's death takes along.
extra+=(--set supervision.worker_restarts=0 --set checkpoint.host_every=0)
run() { local out=$1; shift; "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" "${extra[@]}" \
          --set checkpoint.every_steps=10 --set train.max_steps=30 "$@"; }
same_weights() {  # the final checkpoints of two runs hold the same bytes
  cmp -s "$work/$1/checkpoints/step-00000030/weights.safetensors" "$work/$2/checkpoints/step-00000030/weights.safetensors" \
    && cmp -s "$work/$1/checkpoints/step-00000030/optimizer.safetensors" "$work/$2/checkpoints/step-00000030/optimizer.safetensors"
}
end_field() {  # the end event's field $2 in run $1
  "$python" -c 'import json,sys; e=[j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "end"]; print(e[-1].get(sys.argv[2], ""))' \
    "$work/$1/metrics.jsonl" "$2"
}

run whole > "$work/whole.log" 2>&1 || { cat "$work/whole.log"; fail "uninterrupted run"; }

# 1. Killed inside the first checkpoint write at step 20 or later (which
# steps are written depends on the write speed: checkpoints coalesce), at
# two points: after the rename (the pointer not yet updated) and before the
# fsync of state.json in the .tmp folder.
for point in after_swap state; do
  if TANDEM_CHECKPOINT_CRASH="$point:20" run "kill-$point" > "$work/kill-$point.log" 2>&1; then
    fail "TANDEM_CHECKPOINT_CRASH=$point:20 did not kill the run"
  fi
  killed=$(sed -n "s|^TANDEM_CHECKPOINT_CRASH: killed at '$point' writing .*/\(step-[0-9]*\)$|\1|p" "$work/kill-$point.log")
  [[ -n "$killed" ]] || { cat "$work/kill-$point.log"; fail "no crash point reached"; }
  if [[ $point == after_swap ]]; then want=$killed   # in place: complete
  else want=$(ls "$work/kill-$point/checkpoints" | grep -v -e '\.' -e latest -e "$killed" | sort | tail -n 1)
    check test -d "$work/kill-$point/checkpoints/$killed.tmp"  # the torn one, never taken
  fi
  run "kill-$point" --resume > "$work/resume-$point.log" 2>&1 || { cat "$work/resume-$point.log"; fail "resume after $point"; }
  check grep -q "resuming from .*/$want (step" "$work/resume-$point.log"
  check same_weights whole "kill-$point"
  check test ! -e "$work/kill-$point/checkpoints/$killed.tmp"
  # After the rename, `latest` still named the one before: the resume said so.
  [[ $point == after_swap ]] && check grep -q "latest names 'step-[0-9]*', but the newest complete checkpoint is $killed" \
    "$work/resume-$point.log"
done

# 2. A flipped bit in the newest checkpoint (its last tensor's last bytes).
run flip --set train.max_steps=20 --set checkpoint.keep=3 > /dev/null 2>&1 || fail "flip: first part"
"$python" - "$work/flip/checkpoints/step-00000020/weights.safetensors" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[-3] ^= 0x01
open(p, "wb").write(bytes(b))
EOF
run flip --resume > "$work/flip.log" 2>&1 || { cat "$work/flip.log"; fail "resume past a corrupt checkpoint"; }
check grep -q "step-00000020/weights.safetensors: tensor '.*' is corrupt" "$work/flip.log"
check grep -q "resuming from .*/step-00000010 (step 10)" "$work/flip.log"
check test -d "$work/flip/checkpoints/step-00000020.corrupt"
check same_weights whole flip

# 3. The drafter dies while the final checkpoint (step 30) is taken.  With
# its restore point in device memory (the default) it is restored at step 30
# and the final checkpoint is taken again: nothing lost, exit 0.
run lastsnap-memory --fault drafter=0,kind=throw_in_snapshot,at_step=30 > "$work/lastsnap-memory.log" 2>&1 \
  || { cat "$work/lastsnap-memory.log"; fail "a drafter restored from memory after dying in the final snapshot"; }
check test "$(end_field lastsnap-memory durable_step)" = 30
check same_weights whole lastsnap-memory
# Without it, steps after the newest checkpoint are gone: exit 1, and the
# end event says which step the durable checkpoint holds.
if run lastsnap --set checkpoint.memory_every=0 --fault drafter=0,kind=throw_in_snapshot,at_step=30 \
     > "$work/lastsnap.log" 2>&1; then
  failed=$((failed+1)); echo "FAILED: a run that lost steps 21..30 exited 0"; tail -n 5 "$work/lastsnap.log"
fi
durable=$("$python" -c 'import json,sys; print([j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "checkpoint"][-1]["step"])' "$work/lastsnap/metrics.jsonl")
check test "$(end_field lastsnap durable_step)" = "$durable"
check grep -q "holds step $durable" <<< "$(end_field lastsnap error)"
check grep -q "steps $((durable + 1))..30 are lost" "$work/lastsnap.log"

# 4. A disk that holds one checkpoint and a half.
if unshare --mount --propagation private true 2> /dev/null; then
  one=$(du -sb "$work/whole/checkpoints/step-00000030" | cut -f1)
  size=$(( one * 3 / 2 / 1024 + 1 ))
  unshare --mount --propagation private bash -s "$tandem" "$work" "$size" "${extra[@]}" <<'EOF' > "$work/disk.log" 2>&1 || true
set -u
tandem=$1 work=$2 size=$3; shift 3
mkdir -p "$work/small"
mount -t tmpfs -o "size=${size}k" tmpfs "$work/small"
go() { "$tandem" run "$work/run.toml" --set run.output_dir="$work/small/run" --set checkpoint.every_steps=10 \
         --set train.max_steps=30 --set checkpoint.keep=1 "$@"; }
go > "$work/refused.log" 2>&1; echo "refused: $?"
# With --force: step 10 fits, step 20 does not (refused before writing).
go --force > "$work/forced.log" 2>&1; echo "forced: $?"
ls "$work/small/run/checkpoints" > "$work/left.txt"
cp "$work/small/run/metrics.jsonl" "$work/disk-metrics.jsonl"
# The same, with the space check off: the write itself meets ENOSPC.
rm -rf "$work/small/run"
TANDEM_CHECKPOINT_SKIP_SPACE_CHECK=1 go --force > "$work/enospc.log" 2>&1; echo "enospc: $?"
ls "$work/small/run/checkpoints" > "$work/left-enospc.txt"
# The checkpoint left behind verifies: a resume takes it (nothing to train).
go --force --resume --set train.max_steps=10 > "$work/after.log" 2>&1; echo "resumed: $?"
EOF
  cat "$work/disk.log"
  check grep -q "^refused: 2" "$work/disk.log"
  check grep -q "not enough disk space: checkpoint.dir .*checkpoint.keep + 1 = 2 checkpoints.*--force" "$work/refused.log"
  check grep -q "warning: (--force) checkpoint.dir " "$work/forced.log"
  check grep -q "^forced: 1" "$work/disk.log"
  check grep -q "checkpoint needs [0-9]* bytes" "$work/forced.log"
  check grep -q "the previous checkpoints are intact" "$work/forced.log"
  check test "$(cat "$work/left.txt")" = "$(printf 'latest\nstep-00000010')"
  check grep -q "^enospc: 1" "$work/disk.log"
  check grep -q "disk full (.*No space left on device.*checkpoint needs [0-9]* bytes" "$work/enospc.log"
  check test "$(cat "$work/left-enospc.txt")" = "$(printf 'latest\nstep-00000010')"
  check "$python" -c 'import json,sys; e=[j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "end"][-1]; assert e["reason"] == "error" and e["durable_step"] == 10 and "bytes" in e["error"], e' "$work/disk-metrics.jsonl"
  # A checkpoint.dir (or output folder) it cannot write: said before training, exit 2.
  unshare --mount --propagation private bash -s "$tandem" "$work" "${extra[@]}" <<'EOF' > "$work/ro.log" 2>&1 || true
set -u
tandem=$1 work=$2; shift 2
mkdir -p "$work/ro"; mount -t tmpfs -o size=64k,ro tmpfs "$work/ro"
"$tandem" run "$work/run.toml" --set run.output_dir="$work/ro-run" --set checkpoint.dir="$work/ro/ck" "$@"; echo "ro: $?"
EOF
  check grep -q "^ro: 2" "$work/ro.log"
  check grep -q "checkpoint.dir = $work/ro/ck: cannot make it: Read-only file system" "$work/ro.log"
  check test ! -e "$work/ro-run/metrics.jsonl"
  check grep -q "^resumed: 0" "$work/disk.log"
  check grep -q "resuming from .*/step-00000010 (step 10)" "$work/after.log"
else
  echo "SKIPPED: the disk-full case (unshare --mount is not allowed here)"
fi

# 5. A fresh start into a folder that holds a run is refused (its steps would
# mix with the new run's); --overwrite starts again and ends on the same
# weights.  A resume against other data (another content_hash: the ledger's
# ids would name other samples) is refused unless --force.
rc=0; run whole > "$work/again.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "already holds a run (.*step-00000030); pass --resume" "$work/again.log"
check test -d "$work/whole/checkpoints/step-00000030"
mkdir -p "$work/before/checkpoints" && cp -r "$work/whole/checkpoints/step-00000030" "$work/before/checkpoints/"
# An --overwrite whose start fails (its control port taken) puts the earlier run back as it was.
"$python" -c 'import socket, time; s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(120)' > "$work/port" &
holder=$!
for _ in $(seq 100); do [ -s "$work/port" ] && break; sleep 0.1; done
metrics_sum=$(md5sum < "$work/whole/metrics.jsonl")
rc=0; run whole --overwrite --set control.listen="127.0.0.1:$(cat "$work/port")" > "$work/overwrite-fail.log" 2>&1 || rc=$?
kill "$holder" 2>/dev/null || true
check test "$rc" = 2
check grep -q "cannot listen on" "$work/overwrite-fail.log"
check grep -q "the earlier run's files in .* are back as they were" "$work/overwrite-fail.log"
check test -d "$work/whole/checkpoints/step-00000030"
check test "$(md5sum < "$work/whole/metrics.jsonl")" = "$metrics_sum"
check test -z "$(find "$work/whole" -name '*.overwritten')"
# An --overwrite start SIGKILLed before its first checkpoint (here while it waits for a member node that
# never joins) leaves the earlier run set aside: the next start puts it back (and drops the
# cluster.json the killed start wrote), then refuses as before.
"$tandem" run "$work/run.toml" --set run.output_dir="$work/whole" "${extra[@]}" --set checkpoint.every_steps=10 \
  --set train.max_steps=30 --overwrite --listen 127.0.0.1:0 --set placement.drafters=absent:cpu \
  --set cluster.join_timeout_s=60 > "$work/overwrite-killed.log" 2>&1 &
starter=$!
for _ in $(seq 300); do grep -q "waiting for nodes" "$work/overwrite-killed.log" && break; sleep 0.1; done
grep -q "waiting for nodes" "$work/overwrite-killed.log" || { cat "$work/overwrite-killed.log"; fail "no wait for nodes"; }
kill -KILL "$starter"; wait "$starter" 2>/dev/null || true  # one process (worker_restarts = 0): its lock goes with it
check test -e "$work/whole/.overwrite-pending"
check test -d "$work/whole/checkpoints/step-00000030.overwritten"
rc=0; run whole > "$work/after-kill.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "an --overwrite start in .* was stopped before its first checkpoint: put the earlier run back" "$work/after-kill.log"
check grep -q "already holds a run (.*step-00000030)" "$work/after-kill.log"
check test "$(md5sum < "$work/whole/metrics.jsonl")" = "$metrics_sum"
check test -z "$(find "$work/whole" -name '*.overwritten' -o -name cluster.json -o -name .overwrite-pending)"
# The same once the killed start has trained steps (its metrics.jsonl has lines) but not yet checkpointed.
"$tandem" run "$work/run.toml" --set run.output_dir="$work/whole" "${extra[@]}" --set checkpoint.every_steps=500 \
  --set data.epochs=100 --set train.max_steps=5000 --overwrite > "$work/overwrite-killed2.log" 2>&1 &
starter=$!
for _ in $(seq 300); do  # its own metrics.jsonl (the earlier one set aside) with 3 steps: before step 44's epoch checkpoint
  [ -e "$work/whole/metrics.jsonl.overwritten" ] && [ "$(grep -c '"event":"step"' "$work/whole/metrics.jsonl" 2>/dev/null)" -ge 3 ] && break
  sleep 0.05
done
kill -KILL "$starter"; wait "$starter" 2>/dev/null || true
check test -e "$work/whole/metrics.jsonl.overwritten"
rc=0; run whole > "$work/after-kill2.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "already holds a run (.*step-00000030)" "$work/after-kill2.log"
check test "$(md5sum < "$work/whole/metrics.jsonl")" = "$metrics_sum"
check test -z "$(find "$work/whole" -name '*.overwritten' -o -name .overwrite-pending)"
# The killed start's control.json is still there: the shell says the run is gone (exit 2), not "connection refused".
rc=0; "$tandem" shell "$work/whole" -c status > "$work/shell-gone.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "is not running: its control.json names process $starter, which is gone" "$work/shell-gone.log"
# checkpoint.host_dir is the restore points' own folder (a run empties it): a file, the run
# folder, a folder above it or one holding other files is refused (exit 2) and left alone.
echo keep > "$work/keep.txt"; mkdir -p "$work/users"; echo mine > "$work/users/notes.txt"
for hd in "$work/keep.txt|not a folder" ".|it is run.output_dir" "$work|it is a folder above run.output_dir" \
          "$work/users|it holds notes.txt"; do
  rc=0; run host-dir --set checkpoint.host_every=1 --set checkpoint.host_dir="${hd%%|*}" > "$work/hd.log" 2>&1 || rc=$?
  check test "$rc" = 2
  check grep -q "'checkpoint.host_dir' = .*: ${hd#*|}" "$work/hd.log"
done
check test "$(cat "$work/keep.txt")" = keep
check test -f "$work/users/notes.txt"
check test ! -e "$work/host-dir/checkpoints"
# A metrics.jsonl the run cannot write stops it before the start (it trained without its record).
rc=0; run no-metrics --set metrics.jsonl=/proc/none/metrics.jsonl > "$work/metrics.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "'metrics.jsonl' = \"/proc/none/metrics.jsonl\": cannot write it" "$work/metrics.log"
run whole --overwrite > "$work/overwrite.log" 2>&1 || { cat "$work/overwrite.log"; fail "--overwrite"; }
check grep -q -- "--overwrite: removed the earlier run" "$work/overwrite.log"
check test "$(grep -c '"event":"end"' "$work/whole/metrics.jsonl")" = 1
check same_weights whole before  # the run again from step 0: the same bytes
cp -r "$work/data" "$work/data2"
"$python" - "$work/data2" <<'EOF2'
import hashlib, json, os, sys
from safetensors.numpy import load_file, save_file
d = sys.argv[1]
shard = os.path.join(d, "shard-00000.safetensors")
t = load_file(shard)
t["tokens"][0] = (t["tokens"][0] + 1) % 500
save_file(t, shard, metadata={"format": "tandem.shard.v1", "num_samples": "64", "num_tokens": str(len(t["tokens"]))})
digest = hashlib.sha256(open(shard, "rb").read()).hexdigest()
m = json.load(open(os.path.join(d, "manifest.json")))
m["shards"][0]["sha256"] = digest
m["content_hash"] = hashlib.sha256(digest.encode()).hexdigest()
json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
EOF2
rc=0; run whole --resume --set train.max_steps=40 --set data.path="$work/data2" > "$work/otherdata.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "was trained on another data set" "$work/otherdata.log"
run whole --resume --force --set train.max_steps=40 --set data.path="$work/data2" > "$work/forced-data.log" 2>&1 \
  || { cat "$work/forced-data.log"; fail "--force past other data"; }
check grep -q "warning (--force): .* was trained on another data set" "$work/forced-data.log"

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
