#!/usr/bin/env bash
# tools/gpu-host/cluster2.sh --dry-run on the CPU (the two-GPU cluster script
# checked without GPUs, so a broken script or a config it can no longer run
# is found here, not on a rented host):
#   1. it passes: exit 0; the three parts' commands printed (each run's
#      placement, each node's --devices, the forced NCCL transport);
#      "SKIPPED (dry run): 14 commands not run";
#      cluster2.jsonl with one line per part and no failed check;
#   2. it can fail: --extra-set runtime.group_timeout_s=1000 (not less than
#      runtime.step_timeout_s, which only data-parallel drafters need) leaves
#      part 1 passing and fails the runs of parts 2 and 3, and their nodes
#      with no leader:
#      exit 1, the reason printed.
#   3. tools/gpu-host/two_gpu.sh --dry-run passes, and fails on the same
#      bad override in the seed's (two drafters) check only.
# ~35 s on 2 cores (most of it loading the binary 20 times).
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="$here/../../tools/gpu-host/cluster2.sh"
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }
# dry NAME [ARGS...]: the dry run, its output in NAME.log, its logs and
# cluster2.jsonl in NAME/; sets rc.
dry() {
  local name=$1; shift
  rc=0
  OUT="$work/$name" "$script" --dry-run --tandem "$tandem" --python "$python" --fixtures "$fixtures" "$@" \
    > "$work/$name.log" 2>&1 || rc=$?
}
# printed TEXT: a command line the dry run printed ("+ ...") holds TEXT.
printed() { awk -v t="$1" 'substr($0, 1, 2) == "+ " && index($0, t) { f = 1 } END { exit !f }' "$work/ok.log"; }
# parts FILE 'CASE CHECKED FAILED'...: cluster2.jsonl holds exactly these lines.
parts() {
  "$python" - "$@" <<'EOF'
import json, sys
got = [json.loads(line) for line in open(sys.argv[1])]
want = [dict(zip(("case", "checked", "failed"), (c, int(k), int(f)))) for c, k, f in map(str.split, sys.argv[2:])]
got = [{k: j[k] for k in ("case", "checked", "failed")} for j in got if j.get("dry_run")]
assert got == want, (got, want)
EOF
}

# 1. The dry run passes.
dry ok
cat "$work/ok.log"
check test "$rc" = 0
check grep -qxF "SKIPPED (dry run): 14 commands not run" "$work/ok.log"
check test "$(grep -c "^+ timeout [0-9]* $tandem " "$work/ok.log")" = 13
check printed "$tandem run $(sed -n 's/^work: \([^,]*\),.*/\1/p' "$work/ok.log")/run.toml"
check printed "--set placement.targets=cuda:0 --set placement.drafters=cuda:1"
check printed "--listen 127.0.0.1:0 --set cluster.join_timeout_s=60 --set placement.targets=gpu-a:cuda:0 --set placement.drafters=gpu-b:cuda:1"
check printed "$tandem node --join 127.0.0.1:"
check printed "--name gpu-a --devices cuda:0 --heartbeat-s 0.5 --timeout-s 5"
check printed "--name gpu-b --devices cuda:0,cuda:1 --heartbeat-s 0.5 --timeout-s 5"
check printed "tests/integration/compare_losses.py"
check printed "--set placement.targets=cuda:0 --set placement.drafters=cuda:0,cuda:1"
check printed "--set placement.targets=gpu-a:cuda:0 --set placement.drafters=gpu-b:cuda:0,gpu-c:cuda:1"
check printed "--name gpu-c --devices cuda:0,cuda:1 --heartbeat-s 0.5 --timeout-s 5"
check printed "--set placement.drafters=gpu-b:cuda:0,gpu-c:cuda:1 --set cluster.transport=nccl"
check parts "$work/ok/cluster2.jsonl" "cluster2_tiny 6 0" "cluster2_dp 8 0" "cluster2_dp_nccl 7 0"

# 2. A bad override fails it, in part 2 only.
dry bad --extra-set runtime.group_timeout_s=1000
check test "$rc" = 1
check grep -qxF "SKIPPED (dry run): 14 commands not run" "$work/bad.log"
check grep -q "FAILED: dp_leader" "$work/bad.log"
check grep -q "'runtime.group_timeout_s' (1000.0) must be less than 'runtime.step_timeout_s'" "$work/bad.log"
check parts "$work/bad/cluster2.jsonl" "cluster2_tiny 6 0" "cluster2_dp 5 5" "cluster2_dp_nccl 4 4"
[[ $failed -eq 0 ]] || cat "$work/bad.log"

# 3. tools/gpu-host/two_gpu.sh --dry-run (the two-GPU issue's parts 1 and 3):
# it passes, and the same bad override fails the seed's two drafters only.
two="$here/../../tools/gpu-host/two_gpu.sh"
rc=0; OUT="$work/two" "$two" --dry-run --tandem "$tandem" --python "$python" > "$work/two.log" 2>&1 || rc=$?
check test "$rc" = 0
check grep -qxF "dry run: 7 checks, 0 failed" "$work/two.log"
check grep -qxF "SKIPPED (dry run): 4 commands not run" "$work/two.log"
check grep -q "^+ timeout 500 .*bench/pipeline.py .*--size 8b --target-device cuda:0 --drafter-device cuda:1" "$work/two.log"
rc=0; OUT="$work/two_bad" "$two" --dry-run --tandem "$tandem" --python "$python" \
  --extra-set runtime.group_timeout_s=1000 > "$work/two_bad.log" 2>&1 || rc=$?
check test "$rc" = 1
check grep -q "checked: pipeline: config and placement cuda:0 / cuda:1 accepted" "$work/two_bad.log"
check grep -q "FAILED: seed: config and placement cuda:0 / cuda:0,cuda:1 accepted" "$work/two_bad.log"
[[ $failed -eq 0 ]] || cat "$work/two.log" "$work/two_bad.log"

echo "gpu_host_dryrun: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
