#!/usr/bin/env bash
# On the GPU host (see tools/gpu-host/pack): issue 19's soak at Qwen3-8B
# shapes, target and drafter on cuda:0 (bench/pipeline.py's random target,
# synthetic data and run.toml, made once in $W and kept), trained for SOAK_S
# seconds in all (default 480: the workers' step spans, bench/pipeline.py
# workers(); start-up, stops and worker restarts not counted) with a fault
# about every FAULT_EVERY steps (default 280, ~60 s at ~0.21 s a step): a
# seeded schedule cycling through throw, nan, cuda_error, hang (caught by
# runtime.step_timeout_s = STEP_TIMEOUT_S, default 20), cuda_sticky and abort
# (tools/gpu-host/soak_summary.py, plan()), with checkpoints every 50 steps
# (keep 2), restore points in shared memory every HOST_EVERY steps (default
# 10) in /dev/shm/tandem-soak, and budgets no schedule exhausts.
#
# A 10-minute device call cannot hold setup, 8 minutes of training and a
# stop, so the soak runs in parts, one call each, on one warm host (the run
# folder $W/soak, 25 GB of checkpoints, and /dev/shm stay there between
# calls; a fresh host has neither, and PART=2 then says so and stops):
#   PART=1 bash tools/gpu-host/soak.sh   # setup (the target ~1.5 min if $W has none), then train
#   PART=2 bash tools/gpu-host/soak.sh   # tandem run --resume: train on
#   PART=3 ...                           # only while soak.jsonl says "done": false
# Each part trains until SOAK_S is reached or until STOP_S (default 120) +
# 30 s before CALL_S (default 570) seconds since the script started (a part
# that stops at that deadline takes ~9.5 min), then stops `tandem run` with
# SIGTERM to its process group (it finishes the step and writes a
# checkpoint; SIGKILL STOP_S later).  A later part passes only the faults
# beyond the last step reported.
# Every 10 s in the background: bytes under the checkpoint folder and the
# shared-memory folder, free bytes of both file systems ($W/soak_disk.jsonl).
#
# Into $OUT after each part (each part's files cover the soak so far):
#   soak.jsonl          the summary line (soak_summary.py summary: training
#                       seconds, steps, faults due vs recoveries per kind with
#                       steps lost and time to training again, the ledger
#                       check over every complete epoch, the most disk used,
#                       the final checkpoint's step, "done", "ok")
#   soak.metrics.jsonl  the run's metrics.jsonl (every part appends to it)
#   soak_disk.jsonl     the disk samples;  soak_parts.jsonl  the parts' starts and stops
#   soak-partN.log      the last 2 MB of this part's `tandem run` stderr
# When done, the checkpoints and the shared-memory folder are removed
# (SOAK_KEEP=1 keeps them); $W's target and data stay for the other scripts.
# Exit status 0 when the summary says "ok" (so far), 2 when PART>1 finds
# nothing to resume.
T0=$SECONDS
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
W=${W:-/tmp/pipe}
B=build/bin/tandem
PART=${PART:-1}
SOAK_S=${SOAK_S:-480}
CALL_S=${CALL_S:-570}
STOP_S=${STOP_S:-120}
FAULT_EVERY=${FAULT_EVERY:-280}
FAULT_COUNT=${FAULT_COUNT:-16}
SOAK_SEED=${SOAK_SEED:-19}
HOST_EVERY=${HOST_EVERY:-10}
CHECKPOINT_EVERY=50
STEP_TIMEOUT_S=${STEP_TIMEOUT_S:-20}
HOST_DIR=/dev/shm/tandem-soak
RUN=$W/soak
PARTS=$W/soak_parts.jsonl
DISK=$W/soak_disk.jsonl
helper() { timeout 120 "$TANDEM_PYTHON" tools/gpu-host/soak_summary.py "$@"; }
now() { date +%s.%N; }
echo "soak: PART=$PART SOAK_S=$SOAK_S SOAK_SEED=$SOAK_SEED FAULT_EVERY=$FAULT_EVERY HOST_EVERY=$HOST_EVERY" \
     "CALL_S=$CALL_S STOP_S=$STOP_S; $($B --version 2>/dev/null)" >&2
df -h "$W" /dev/shm 2>/dev/null | sed 's/^/soak: /' >&2

if [[ $PART == 1 ]]; then
  rm -rf "$RUN" "$HOST_DIR" "$PARTS" "$DISK" "$W/out"
  mkdir -p "$W"
  # The target, the data and run.toml (pipeline.py keeps a target and data
  # already in $W; both are drawn from fixed seeds).
  timeout 400 "$TANDEM_PYTHON" bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 \
    --drafter-device cuda:0 --work "$W" --setup-only >&2 || { echo "soak: setup failed" >&2; exit 1; }
elif ! ls -d "$RUN"/checkpoints/step-* > /dev/null 2>&1 || [[ ! -f $W/run.toml ]]; then
  msg="PART=$PART: no checkpoint in $RUN to resume (a fresh host?): run PART=1 again"
  echo "soak: $msg" >&2
  echo "{\"case\": \"soak\", \"part\": $PART, \"error\": \"$msg\"}" | tee -a "$OUT/soak.jsonl"
  exit 2
fi

# Every part alike but for --resume and the faults still ahead.
sets=(--set run.output_dir="$RUN" --set train.max_steps=0 --set data.epochs=1000
      --set checkpoint.every_steps="$CHECKPOINT_EVERY" --set checkpoint.keep=2
      --set checkpoint.on_signal=true --set checkpoint.host_every="$HOST_EVERY"
      --set checkpoint.host_dir="$HOST_DIR" --set runtime.step_timeout_s="$STEP_TIMEOUT_S"
      --set supervision.restart_budget=100 --set supervision.worker_restarts=100)
schedule=(--seed "$SOAK_SEED" --every "$FAULT_EVERY" --count "$FAULT_COUNT")
ahead=$(helper faults --metrics "$RUN/metrics.jsonl" --parts "$PARTS" "${schedule[@]}") || exit 1
faults=(); [[ -z $ahead ]] || mapfile -t faults <<< "$ahead"
resume=(); [[ $PART == 1 ]] || resume=(--resume)
offset=$(stat -c %s "$RUN/metrics.jsonl" 2>/dev/null || echo 0)
echo "{\"part\": $PART, \"event\": \"start\", \"offset\": $offset, \"unix_s\": $(now)," \
     "\"resume\": $([[ $PART == 1 ]] && echo false || echo true), \"faults\": \"${faults[*]}\"}" >> "$PARTS"
echo "soak: part $PART: ${faults[*]:-no faults left}" >&2

# Disk use every 10 s, in the background.
bytes() { du -sb "$1" 2>/dev/null | awk '{n = $1} END {print (n == "" ? 0 : n)}'; }
avail() { df -B1 --output=avail "$1" 2>/dev/null | awk 'NR == 2 {n = $1} END {print (n == "" ? "null" : n)}'; }
sample_disk() {
  while :; do
    echo "{\"unix_s\": $(now), \"part\": $PART, \"checkpoints_bytes\": $(bytes "$RUN/checkpoints")," \
         "\"host_bytes\": $(bytes "$HOST_DIR"), \"disk_free_bytes\": $(avail "$W")," \
         "\"shm_free_bytes\": $(avail /dev/shm)}" >> "$DISK"
    sleep 10
  done
}
sample_disk & sampler=$!

# `tandem run` in its own process group (setsid), stopped as a terminal's
# Ctrl-C would stop it: the signal to the group, its worker process included.
setsid $B run "$W/run.toml" "${sets[@]}" "${faults[@]}" "${resume[@]}" > "$W/soak-part$PART.log" 2>&1 &
pid=$!
cleanup() {
  kill "$sampler" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null
}
trap cleanup EXIT
trap 'exit 143' TERM INT

# Train until SOAK_S in all, or until this call must stop.
deadline=$(( $(date +%s) + CALL_S - (SECONDS - T0) - STOP_S - 30 ))
bound=$(( deadline - $(date +%s) + 60 )); ((bound > 60)) || bound=60
rc=0
timeout $bound "$TANDEM_PYTHON" tools/gpu-host/soak_summary.py wait \
  --metrics "$RUN/metrics.jsonl" --parts "$PARTS" --soak-s "$SOAK_S" --deadline "$deadline" --pid "$pid" || rc=$?
case $rc in
  0) why=soak_s ;;
  2) why=exited; tail -n 20 "$W/soak-part$PART.log" | sed 's/^/soak: tandem: /' >&2 ;;
  *) why=deadline ;;
esac
how=exited
if kill -0 "$pid" 2>/dev/null; then
  how=sigterm
  kill -TERM -- "-$pid"
  for ((i = 0; i < STOP_S; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    how=sigkill
    echo "soak: tandem run still up $STOP_S s after SIGTERM: SIGKILL" >&2
    kill -KILL -- "-$pid"
  fi
fi
wait "$pid"; status=$?
kill -KILL -- "-$pid" 2>/dev/null  # a worker left behind, if any
kill "$sampler" 2>/dev/null
echo "{\"part\": $PART, \"event\": \"stop\", \"unix_s\": $(now), \"how\": \"$how\", \"rc\": $status," \
     "\"why\": \"$why\"}" >> "$PARTS"
echo "soak: part $PART stopped ($why, $how, exit status $status) at $((SECONDS - T0)) s" >&2

helper summary --metrics "$RUN/metrics.jsonl" --parts "$PARTS" --disk "$DISK" \
  --checkpoints "$RUN/checkpoints" "${schedule[@]}" --soak-s "$SOAK_S" \
  --tandem-version "$($B --version 2>/dev/null)" --host-every "$HOST_EVERY" \
  --checkpoint-every "$CHECKPOINT_EVERY" | tee -a "$OUT/soak.jsonl"
cp "$RUN/metrics.jsonl" "$OUT/soak.metrics.jsonl" 2>/dev/null
cp "$DISK" "$OUT/soak_disk.jsonl" 2>/dev/null
cp "$PARTS" "$OUT/soak_parts.jsonl"
tail -c 2000000 "$W/soak-part$PART.log" > "$OUT/soak-part$PART.log"
if [[ ${SOAK_KEEP:-0} != 1 ]] && tail -n 1 "$OUT/soak.jsonl" | grep -q '"done": true'; then
  rm -rf "$RUN/checkpoints" "$HOST_DIR"
fi
echo "soak: part $PART done at $((SECONDS - T0)) s" >&2
# The exit status: 0 when the summary says "ok" (so far).
tail -n 1 "$OUT/soak.jsonl" | grep -q '"ok": true'
