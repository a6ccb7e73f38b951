#!/usr/bin/env bash
# An installed Tandem works without its build and source trees (~40 s on 2
# cores): `cmake --install` into a temporary prefix, then, in a mount
# namespace where the build tree and the source tree are hidden (empty
# tmpfs over both; when unshare is not allowed, they stay visible and the
# checks of the installed paths still run), `tandem info` names the prefix's
# share/tandem as its resources, `tandem prepare` runs its installed Python
# half, and a short `tandem run` of the installed embedded default trains.
set -euo pipefail
build="$1"; python="$2"; source_dir="$3"
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT; echo "work: $work"
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }

prefix="$work/prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; exit 1; }
tandem="$prefix/bin/tandem"
check test -x "$tandem"
check test -f "$prefix/share/tandem/tools/prepare/tandem_prepare.py"
check test -f "$prefix/share/tandem/config/default.toml"
# Nothing of the build tree in the installed binary's search path.
runpath=$(readelf -d "$tandem" | awk '/RUNPATH|RPATH/ {print $NF}')
echo "RUNPATH: $runpath"
if [[ "$runpath" == *"$build"* ]]; then failed=$((failed+1)); echo "FAILED: RUNPATH names the build tree"; else passed=$((passed+1)); fi

"$python" "$source_dir/tools/prepare/make_test_tokenizer.py" "$work/tok" > /dev/null
"$python" - "$work/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(20):
        f.write(json.dumps({"messages": [
            {"role": "user", "content": f"Write function number {i}."},
            {"role": "assistant", "content": f"def f_{i}(x):\n    return x * {i}\n" * 3}]}) + "\n")
PY

# What runs with the trees hidden (a script, so that unshare can run it).
cat > "$work/installed.sh" <<SH
set -euo pipefail
cd "$work"
"$tandem" info --json > "$work/info.json"
"$tandem" prepare --tokenizer "$work/tok" --output "$work/data" --block-size 4 "$work/chat.jsonl" \
  > "$work/prepare.log" 2>&1
"$tandem" run "$prefix/share/tandem/config/default.toml" --set run.output_dir="$work/run" \
  --set metrics.progress=false --set train.max_steps=4 --set train.log_every=2 --set eval.count=8 \
  --set placement.targets=cpu --set placement.drafters=cpu > "$work/run.log" 2>&1
SH
hidden=no
if unshare --mount --propagation private true 2> /dev/null; then
  hidden=yes
  unshare --mount --propagation private bash -c \
    "mount -t tmpfs none '$build' && mount -t tmpfs none '$source_dir' && test ! -e '$source_dir/CMakeLists.txt' && bash '$work/installed.sh'" \
    || { cat "$work"/*.log 2> /dev/null; echo "FAIL: the installed tandem, build and source trees hidden"; exit 1; }
else
  echo "note: unshare is not allowed here: the build and source trees stay visible"
  bash "$work/installed.sh" || { cat "$work"/*.log 2> /dev/null; echo "FAIL: the installed tandem"; exit 1; }
fi
echo "build and source trees hidden: $hidden"
check "$python" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["resources"] == sys.argv[2], j["resources"]' \
  "$work/info.json" "$prefix/share/tandem"
check test -f "$work/data/manifest.json"
check test -f "$work/run/data/manifest.json"
check grep -q "tandem run: max_steps after 4 steps" "$work/run.log"
echo "$passed passed, $failed failed"
test "$failed" -eq 0
