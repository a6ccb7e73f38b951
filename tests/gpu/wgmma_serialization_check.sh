#!/usr/bin/env bash
# Fails when ptxas serializes a kernel's wgmma pipeline.  Its "Potential Performance Loss:
# wgmma.mma_async instructions are serialized ..." and "warpgroup.wait/arrive is injected"
# infos (C7511-C7520) are not warnings, so a build passes while every wgmma of a kernel
# waits for the one before: the DFlash backward's key-major role ran 11% slower that way
# for many sessions (docs/bench.md, "fifth pass").
#   usage: wgmma_serialization_check.sh NVCC REPO_ROOT ARCHS [OBJECT...]
# ARCHS: the build's CUDA architectures, comma-separated; OBJECTs: tandem_gpu_kernels'
# objects.  Where the build compiled sm_90a, each kernel file that uses wgmma is judged by
# what its own compile printed (OBJECT.nvcc.log, kept by tools/nvcc-log; no GPU, < 1 s);
# a file whose log is missing or older than the source is compiled here for sm_90a
# (about 90 s a file on 2 cores).  First, ptxas must print the infos this check looks for
# on a probe that serializes (the check's words are this ptxas's words).
set -euo pipefail
nvcc=$1 root=$2 archs=$3
shift 3
objects=("$@")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
pattern="wgmma.mma_async instructions are serialized|warpgroup\.(wait|arrive) is injected"

# The probe: an accumulator redefined between two wgmma of one stage.
cat > "$tmp/probe.ptx" <<'PTX'
.version 8.4
.target sm_90a
.address_size 64
.visible .entry serialized_probe(.param .u64 out, .param .u64 da, .param .u64 db)
{
  .reg .f32 %d<4>;
  .reg .b64 %a, %b, %o;
  ld.param.u64 %a, [da];
  ld.param.u64 %b, [db];
  ld.param.u64 %o, [out];
  mov.f32 %d0, 0f00000000;
  mov.f32 %d1, 0f00000000;
  mov.f32 %d2, 0f00000000;
  mov.f32 %d3, 0f00000000;
  wgmma.fence.sync.aligned;
  wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%d0, %d1, %d2, %d3}, %a, %b, 1, 1, 1, 0, 0;
  mov.f32 %d0, 0f3F800000;
  wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%d0, %d1, %d2, %d3}, %a, %b, 1, 1, 1, 0, 0;
  wgmma.commit_group.sync.aligned;
  wgmma.wait_group.sync.aligned 0;
  st.global.f32 [%o], %d0;
  st.global.f32 [%o+4], %d1;
  st.global.f32 [%o+8], %d2;
  st.global.f32 [%o+12], %d3;
  ret;
}
PTX
ptxas="$(dirname "$nvcc")/ptxas"
"$ptxas" --gpu-name sm_90a "$tmp/probe.ptx" -o "$tmp/probe.cubin" > "$tmp/probe.log" 2>&1 || {
  cat "$tmp/probe.log"; echo "FAIL: ptxas did not compile the probe"; exit 1; }
if ! grep -qE "$pattern" "$tmp/probe.log"; then
  echo "FAIL: ptxas ($ptxas) printed none of the infos this check looks for on a probe that serializes:"
  cat "$tmp/probe.log"
  exit 1
fi
echo "ok probe: ptxas names a serialized wgmma as this check expects"

fail=0
files=$(grep -l 'gpu/kernels/wgmma.cuh' "$root"/gpu/kernels/*.cu)
[[ -n "$files" ]] || { echo "no kernel includes gpu/kernels/wgmma.cuh: nothing to check"; exit 1; }
for f in $files; do
  name=${f#$root/}
  log=""
  if [[ ",$archs," == *",90a,"* || ",$archs," == *",90a-real,"* ]]; then
    for o in "${objects[@]}"; do
      if [[ $o == */$(basename "$f").o && -f "$o.nvcc.log" && ! "$o.nvcc.log" -ot "$f" ]]; then
        log="$o.nvcc.log"
      fi
    done
  fi
  if [[ -n $log ]]; then
    how="the build's compile"
  else
    how="compiled here for sm_90a"
    log="$tmp/log"
    if ! "$nvcc" -std=c++17 -O3 -c -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I"$root" \
         "$f" -o "$tmp/k.o" > "$log" 2>&1; then
      cat "$log"; exit 1
    fi
  fi
  if grep -E "$pattern" "$log" > "$tmp/hits"; then
    echo "FAIL $name ($how): ptxas serialized wgmma ($(wc -l < "$tmp/hits") kernels):"
    sed -E "s/.*\((C75[0-9]+)\)(.*) in (the )?function .(_Z[^ ']*).*/  \1 \4/" "$tmp/hits" | head -20
    fail=1
  else
    echo "ok $name ($how): no wgmma serialized"
  fi
done
exit $fail
