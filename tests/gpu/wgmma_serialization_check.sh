#!/usr/bin/env bash
# Fails when ptxas serializes a kernel's wgmma pipeline.  Its "Potential Performance Loss:
# wgmma.mma_async instructions are serialized ..." and "warpgroup.wait/arrive is injected"
# infos (C7514-C7520) are not warnings, so a build passes while every wgmma of a kernel
# waits for the one before: the DFlash backward's key-major role ran 11% slower that way
# for many sessions (docs/bench.md, "fifth pass").  Compiles each kernel file that uses
# wgmma for sm_90a as the build does, with -Xptxas -v (about 90 s a file on 2 cores; no GPU).
#   usage: wgmma_serialization_check.sh NVCC REPO_ROOT
set -euo pipefail
nvcc=$1 root=$2
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
fail=0
files=$(grep -l 'gpu/kernels/wgmma.cuh' "$root"/gpu/kernels/*.cu)
[[ -n "$files" ]] || { echo "no kernel includes gpu/kernels/wgmma.cuh: nothing to check"; exit 1; }
for f in $files; do
  if ! "$nvcc" -std=c++17 -O3 -c -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -I"$root" \
       "$f" -o "$tmp/k.o" > "$tmp/log" 2>&1; then
    cat "$tmp/log"; exit 1
  fi
  if grep -E "wgmma.mma_async instructions are serialized|warpgroup\.(wait|arrive) is injected" \
       "$tmp/log" > "$tmp/hits"; then
    echo "FAIL ${f#$root/}: ptxas serialized wgmma ($(wc -l < "$tmp/hits") kernels):"
    sed -E 's/.*\((C75[0-9]+)\)(.*) in (the )?function .(_Z[^ ]*).*/  \1 \4/' "$tmp/hits" | head -20
    fail=1
  else
    echo "ok ${f#$root/}: $(grep -c 'Compiling entry' "$tmp/log") kernels, no wgmma serialized"
  fi
done
exit $fail
