# On the GPU host (see tools/gpu-host/pack): the seed topology of issue 7 at
# Qwen3-8B shapes on random weights, with one drafter killed mid-run, as far
# as this host's GPUs allow:
#   8 GPUs: 5 targets (cuda:0-4) + 3 data-parallel drafters (cuda:5-7);
#   4 GPUs: 2 targets + 2 drafters;
#   2 GPUs: 1 target on cuda:0 + 2 drafters on cuda:0 and cuda:1 (cuda:0 shared).
# One JSON line each (bench/pipeline.py): samples/s, per-drafter compute
# and data wait, and the recovery from the kill.  Logs go to $OUT.
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
gpus=$(nvidia-smi --list-gpus | wc -l)
case $gpus in
  8|9|1[0-9]) t=cuda:0,cuda:1,cuda:2,cuda:3,cuda:4; d=cuda:5,cuda:6,cuda:7 ;;
  4|5|6|7)    t=cuda:0,cuda:1; d=cuda:2,cuda:3 ;;
  2|3)        t=cuda:0; d=cuda:0,cuda:1 ;;
  *) echo "seed.sh: needs at least 2 GPUs, this host has $gpus"; exit 0 ;;
esac
steps=${SEED_STEPS:-80}
# The run stops after SEED_TIMEOUT s (default 480) with a partial line rather than
# none: at 8b the setup, the checkpoints (12.6 GB each) and the restart take minutes.
timeout 560 $TANDEM_PYTHON bench/pipeline.py --tandem build/bin/tandem --size 8b \
  --timeout ${SEED_TIMEOUT:-480} \
  --target-device $t --drafter-device $d --steps $steps --work /tmp/seed \
  --fault drafter=1,kind=throw,at_step=$((steps / 2)) --set checkpoint.every_steps=20 \
  --set runtime.group_timeout_s=20 2>>$OUT/seed.err | tee -a $OUT/seed.jsonl
