#!/usr/bin/env bash
# On the GPU host (see tools/gpu-host/pack): issue 19's runs at Qwen3-8B
# shapes with target and drafter on cuda:0, each a JSON line of
# bench/pipeline.py in $OUT/reliability.jsonl (its `recoveries` give, per
# drafter failure or worker restart, steps lost, the restore tier and the
# time to training again) plus the run's metrics.jsonl ($OUT/NAME.metrics.jsonl)
# and pipeline.py's stderr ($OUT/NAME.err).  60 steps each; every case but
# repro, sticky40, abort40 and host sets checkpoint.host_every = 0 (no
# restore points in shared memory), so that their step times stay comparable:
#   repro      a checkpoint only at the end (the run that used to lose all
#              its training at the final snapshot), every restore tier at its
#              default (memory every step, shared memory every 25): beside
#              nomem's step time, what the tiers cost;
#   throw40    a throw at step 40, checkpoints every 20 (restore points in
#              device memory on, the default);
#   throw40-disk  the same with checkpoint.memory_every = 0 (the checkpoint);
#   nomem      without restore points in device memory nor in shared memory:
#              the step time beside repro's measures their cost;
#   cudaerr40  a non-sticky CUDA error in step 40 (the drafter restarts in its
#              process, like throw40), checkpoints every 20;
#   nan40      a non-finite loss at step 40, checkpoints every 20;
#   hang40     step 40 hangs (2 x step_timeout_s + 1 = 41 s), caught by the
#              step watchdog (runtime.step_timeout_s = 20), checkpoints every 20;
#   sticky40   an illegal-address kernel in step 40 (a sticky error: the
#              worker process exits 75 and `tandem run` starts a new one),
#              checkpoints every 20, restore points in shared memory every 10
#              (checkpoint.host_every; the new worker resumes from the newest);
#   abort40    the worker process aborts in step 40 (SIGABRT), as sticky40;
#   host       no checkpoint but at the end, restore points in shared memory
#              every 10: the step time beside repro's measures their cost;
#   oom        runtime.gpu_memory_fraction = 0.15 (21 GB of the H200's 141):
#              the 8B shapes do not fit, and the run must end at once with an
#              error naming the allocation and the keys that lower it (oom.err).
# The shared-memory restore points go to /dev/shm/tandem-reliability-NAME,
# removed after each case.  CASES picks some (default all).  ~2 min each
# after the first (which makes the 16 GB random target in $W, kept for the
# others); hang40, sticky40 and abort40 up to a minute more (the hang; the
# new worker loads the target again).  All ten do not fit one 10-minute
# device call: three a call, e.g. CASES="repro host nomem", "throw40
# throw40-disk cudaerr40", "nan40 hang40", "sticky40 abort40" (a warm host
# keeps $W's target; a fresh one makes it again).
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
W=${W:-/tmp/pipe}
B=build/bin/tandem
CASES=${CASES:-"repro throw40 throw40-disk nomem cudaerr40 nan40 hang40 sticky40 abort40 host oom"}
one() {
  local name=$1; shift
  echo "== $name: $*" >&2
  timeout 330 $TANDEM_PYTHON bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 --drafter-device cuda:0 \
    --work "$W" --keep --timeout 300 "$@" 2> >(tee "$OUT/$name.err" >&2) \
    | sed "s/^{/{\"case\": \"$name\", /" | tee -a "$OUT/reliability.jsonl"
  cp "$W/out/metrics.jsonl" "$OUT/$name.metrics.jsonl" 2>/dev/null
  rm -rf "$W/out" "$SHM-$name"
}
# Checkpoints every 20 steps, no restore points in shared memory.
every20=(--set checkpoint.every_steps=20 --set checkpoint.host_every=0)
SHM=/dev/shm/tandem-reliability
for c in $CASES; do
  case $c in
    repro) one repro --steps 60 --set checkpoint.every_steps=0 --set checkpoint.host_dir=$SHM-repro ;;
    oom) one oom --steps 20 --set runtime.gpu_memory_fraction=0.15 --set checkpoint.host_every=0 ;;
    throw40) one throw40 --steps 60 "${every20[@]}" --fault drafter=0,kind=throw,at_step=40 ;;
    throw40-disk) one throw40-disk --steps 60 "${every20[@]}" --set checkpoint.memory_every=0 \
                    --fault drafter=0,kind=throw,at_step=40 ;;
    nomem) one nomem --steps 60 --set checkpoint.every_steps=0 --set checkpoint.memory_every=0 \
             --set checkpoint.host_every=0 ;;
    cudaerr40) one cudaerr40 --steps 60 "${every20[@]}" --fault drafter=0,kind=cuda_error,at_step=40 ;;
    nan40) one nan40 --steps 60 "${every20[@]}" --fault drafter=0,kind=nan,at_step=40 ;;
    hang40) one hang40 --steps 60 "${every20[@]}" --set runtime.step_timeout_s=20 \
              --fault drafter=0,kind=hang,at_step=40 ;;
    sticky40) one sticky40 --steps 60 --set checkpoint.every_steps=20 --set checkpoint.host_every=10 \
                --set checkpoint.host_dir=$SHM-sticky40 --fault drafter=0,kind=cuda_sticky,at_step=40 ;;
    abort40) one abort40 --steps 60 --set checkpoint.every_steps=20 --set checkpoint.host_every=10 \
               --set checkpoint.host_dir=$SHM-abort40 --fault drafter=0,kind=abort,at_step=40 ;;
    host) one host --steps 60 --set checkpoint.every_steps=0 --set checkpoint.host_every=10 \
            --set checkpoint.host_dir=$SHM-host ;;
    *) echo "reliability.sh: unknown case '$c'" >&2 ;;
  esac
done
