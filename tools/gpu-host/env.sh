# Sourced on the GPU host from the repository root (see tools/gpu-host/pack):
# unpacks the binaries into build/, makes the build folder they were compiled
# in (their fixture and helper paths are absolute) point here, and puts the
# host's LibTorch, NVIDIA libraries and the packed libraries on the path.
set -o pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
ROOT=$PWD
DEVBIN=${TANDEM_DEVBIN:-.devbin}
# Always unpacked afresh: a warm host keeps the last call's build/ (ignored
# paths survive), which may come from another pack.
# Only with a packed build to put in its place: sourced on a machine without
# one (a script run by mistake, or with --dry-run where it has none), it
# leaves build/ alone.
if [ ! -f "$DEVBIN/bin.tar.xz" ]; then
  echo "tools/gpu-host/env.sh: no packed build ($DEVBIN/bin.tar.xz; bash tools/gpu-host/pack makes it): build/ left as it is" >&2
  exit 1
fi
rm -rf build/bin build/fixtures build/lib build/lib-extra
mkdir -p build && tar -xJf $DEVBIN/bin.tar.xz -C build || exit 1
# The packed OpenSSL/libedit only where the host has none of its own.
for l in build/lib-extra/*; do
  if [[ -e $l ]] && ! ldconfig -p | grep -q "$(basename "$l") "; then cp "$l" build/lib/; fi
done
# Binaries rebuilt after the pack (e.g. only bin/tandem), carried in
# .devbin-patch/, replace the packed ones.
if [ -d .devbin-patch ]; then cp .devbin-patch/* build/bin/; fi
PACKED=$(cat $DEVBIN/build_dir)
if [ "$PACKED" != "$ROOT/build" ]; then mkdir -p "$(dirname "$PACKED")" && ln -sfn "$ROOT/build" "$PACKED"; fi
SP=${TORCH_SITE:-/opt/torch/.venv/lib/python3.12/site-packages}
export LD_LIBRARY_PATH=$ROOT/build/lib:$SP/torch/lib:$(ls -d $SP/nvidia/*/lib | tr '\n' ':')
export TANDEM_PYTHON=${TANDEM_PYTHON:-$(dirname "$(dirname "$(dirname "$SP")")")/bin/python}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
