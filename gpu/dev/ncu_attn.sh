# On the GPU host, repo root (no pack needed: the harness builds its kernels there): the
# attention backward's kernels under Nsight Compute, one document a row (the harness's
# bench_case) -- the stored-dS form (gpu/dev/stored_ds.patch, applied here to the copy on the
# host) and the one launch: speed of light, memory, warp state, occupancy, launch and source
# counters into $OUT/ncu_ds.txt and $OUT/ncu_fused.txt (docs/bench.md, eighteenth pass).  ~90 s.
set -x
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv
(git apply gpu/dev/stored_ds.patch || patch -p1 < gpu/dev/stored_ds.patch) 2>&1 | tail -2
cd tests/gpu
python ../../gpu/dev/attn_kernel_times.py --variants 0,8192 --docs 1 --reps 3 2>&1 | tail -5
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section SourceCounters"
ncu --clock-control none -k regex:"bwd_dkv_ds_kernel|bwd_dq_kernel" -c 2 $S python ../../gpu/dev/attn_kernel_times.py --variants 8192 --docs 1 --reps 1 > $OUT/ncu_ds.txt 2>&1; echo rc $?
ncu --clock-control none -k regex:"bwd_fused_kernel" -c 1 $S python ../../gpu/dev/attn_kernel_times.py --variants 0 --docs 1 --reps 1 > $OUT/ncu_fused.txt 2>&1; echo rc $?
tail -5 $OUT/ncu_ds.txt
