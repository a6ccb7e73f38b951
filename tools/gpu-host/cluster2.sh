#!/usr/bin/env bash
# On a GPU host with 2 GPUs (see tools/gpu-host/pack): issue 18 across two
# GPUs, every process on this host, against the tiny config (two epochs).
#   1. target on cuda:0 and drafter on cuda:1: one process, then three (a
#      leader; gpu-a --devices cuda:0 holds the target, gpu-b the drafter).
#      A node counts its GPUs from cuda:0, in order, so gpu-b, placed on
#      cuda:1, joins with --devices cuda:0,cuda:1 (and CUDA_VISIBLE_DEVICES
#      unset, or naming both GPUs).  Features cross devices and processes
#      through CUDA IPC.  Every step's loss bit-equal
#      (tests/integration/compare_losses.py); the nodes' sharing costs.
#   2. two data-parallel drafters in two processes, one NCCL group across
#      them (gpu-b:cuda:0, gpu-c:cuda:1), the target on gpu-a:cuda:0,
#      against one process with drafters cuda:0,cuda:1: on both, the checks
#      of tests/integration/dp_run_test.sh part 1 (both epochs exact, the
#      loss falls, one group, both drafters at every step), and each step's
#      losses (one per drafter, as a sorted pair) bit-equal.
#   3. part 2 again with cluster.transport = "nccl": every process an NCCL
#      host of its own, so the drafters pull batches and features from the
#      target over NCCL links and their all-reduce runs through NCCL's
#      network transport — the cross-host path, on one host.  The same
#      checks, the losses within 1e-3 of the one-process run (the network
#      all-reduce may sum in another order).
# Logs into $OUT (default /tmp): cluster2_*.log, and one JSON line per part
# in cluster2.jsonl ("ok" and, when false, "why").  Each run is bounded by
# RUN_S (default 120 s), a member by RUN_S + 30: ~12 min at most in all.
# Exit status: 0 when every part is ok, 1 otherwise, 2 for a bad setup
# (fewer than 2 GPUs, no binary, no fixtures).
#
# usage (from anywhere; it works in the repository root):
#   tools/gpu-host/cluster2.sh [--dry-run] [--tandem PATH] [--python PATH]
#                              [--fixtures DIR] [--extra-set KEY=VALUE]...
#   --tandem      the binary (default build/bin/tandem: on a GPU host with a
#                 packed build, .devbin/bin.tar.xz, tools/gpu-host/env.sh
#                 unpacks it there first)
#   --python      with numpy and safetensors (default $TANDEM_PYTHON, else python3)
#   --fixtures    the parity fixtures, holding qwen3_tiny (default build/fixtures)
#   --extra-set   one more --set for every `tandem run` (repeatable)
#   --dry-run     needs no GPU (CI: tests/integration/gpu_host_dryrun_test.sh):
#     makes the data set and config, prints every command, runs none of them,
#     and checks each one as far as the binary goes without GPUs.  `tandem
#     run` has no validate-only mode, so each run starts as a cluster leader
#     with CUDA_VISIBLE_DEVICES empty (a one-process run's cuda:N placed on
#     a member "dryrun" instead): that parses the config and the overrides,
#     resolves the placement (members are assumed to have the GPUs it
#     names), checks the target and the data set, and writes cluster.json
#     naming the nodes it waits for; it is stopped there.  Each `tandem node`
#     is checked against that leader: its name is one it waits for, its
#     --devices cover the cuda:N its placement names, and the command itself
#     gets as far as counting the host's GPUs (it stops there, exit 2: "this
#     host has 0 GPU(s)").  Not checked: the plan on the members' real
#     devices, checkpoint space, anything on a GPU.  Exit 1 if a check fails.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
abs() { if [[ $1 == */* && $1 != /* ]]; then echo "$PWD/$1"; else echo "$1"; fi; }
DRY=0 B=$ROOT/build/bin/tandem PY='' FIX=$ROOT/build/fixtures
extra=()
while (($#)); do
  case $1 in
    --dry-run) DRY=1; shift; continue ;;
    -h|--help) sed -n '2,/^set -uo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --tandem|--python|--fixtures|--extra-set) [[ $# -ge 2 ]] || { echo "cluster2: $1 needs a value" >&2; exit 2; } ;;
    *) echo "cluster2: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  case $1 in
    --tandem) B=$(abs "$2") ;;
    --python) PY=$(abs "$2") ;;
    --fixtures) FIX=$(abs "$2") ;;
    --extra-set) extra+=(--set "$2") ;;
  esac
  shift 2
done
cd "$ROOT" || exit 2
RUN_S=${RUN_S:-120}
NODE_S=$((RUN_S + 30))

if ((!DRY)); then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if ((gpus < 2)); then
    echo "cluster2: needs 2 GPUs, but nvidia-smi -L lists ${gpus}: nothing run (--dry-run checks the commands without GPUs)"
    exit 2
  fi
  # env.sh replaces build/bin with the packed build: only where there is one.
  if [[ -f ${TANDEM_DEVBIN:-.devbin}/bin.tar.xz ]]; then
    # shellcheck source=/dev/null
    source tools/gpu-host/env.sh
  else
    echo "cluster2: no packed build (${TANDEM_DEVBIN:-.devbin}/bin.tar.xz): $B as it is"
  fi
fi
export NCCL_NVLS_ENABLE=0
PY=${PY:-${TANDEM_PYTHON:-python3}}
[[ -x $B ]] || { echo "cluster2: no tandem binary at $B (--tandem PATH)"; exit 2; }
[[ -d $FIX/qwen3_tiny ]] || { echo "cluster2: no $FIX/qwen3_tiny (--fixtures DIR; tools/setup --test makes them)"; exit 2; }

T=$(mktemp -d -t cluster2.XXXXXX)
if ((DRY)); then OUT=${OUT:-$T}; else OUT=${OUT:-/tmp}; fi
mkdir -p "$OUT"
pids=()
# shellcheck disable=SC2317  # (run by the trap)
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  if ((DRY)) && [[ -z ${KEEP_WORK:-} ]]; then rm -rf "$T"; fi
}
trap cleanup EXIT
echo "work: $T, logs: $OUT, NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE$( ((DRY)) && echo ', dry run')"
"$PY" tests/integration/make_run_dataset.py "$T/data" > /dev/null || { echo "cluster2: making the data set failed"; exit 1; }
sed "s|@TARGET@|$FIX/qwen3_tiny|" tests/integration/run_test.toml > "$T/run.toml"

shown=0 checked=0 bad=0
# show CMD...: prints a command as it would be typed.
show() {
  shown=$((shown + 1))
  local a line="+"
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
  done
  echo "$line"
}
# verdict WHAT OK? [LOG]: a dry run's check, said; a failure shows the log's end.
verdict() {
  checked=$((checked + 1))
  if [[ $2 == 0 ]]; then echo "  checked: $1"; return; fi
  bad=$((bad + 1)); echo "  FAILED: $1"
  if [[ -n ${3:-} ]]; then tail -n 5 "$3" | sed 's/^/    | /'; fi
}
# port_of DIR PID: the leader's port once it listens (cluster.json), while it lives.
port_of() {
  local _
  for _ in $(seq 1 1200); do
    if [[ -s $1/cluster.json ]]; then
      "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$1/cluster.json"; return
    fi
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
# start LOG DIR CMD...: a leader in the background; sets lpid, port, lead_dir.
start() {
  local log=$OUT/cluster2_$1.log dir=$2; shift 2
  if ((DRY)); then CUDA_VISIBLE_DEVICES='' "$@" > "$log" 2>&1 &  # (port_of gives up after 60 s)
  else timeout "$RUN_S" "$@" > "$log" 2>&1 &
  fi
  lpid=$! lead_dir=$dir
  pids+=("$lpid")
  port=$(port_of "$dir" "$lpid")
}
# stop: a dry run's leader, waiting for its nodes (SIGKILL: it holds
# nothing yet, and its worker process dies with it).
stop() { kill -KILL "$lpid" 2>/dev/null; wait "$lpid" 2>/dev/null; }
declare -A rc mpid

# one LOG DIR [ARGS...]: a one-process run.
one() {
  local name=$1 dir=$2; shift 2
  local cmd=("$B" run "$T/run.toml" --set run.output_dir="$dir" "$@" "${extra[@]}")
  show timeout "$RUN_S" "${cmd[@]}"
  if ((!DRY)); then
    timeout "$RUN_S" "${cmd[@]}" > "$OUT/cluster2_$name.log" 2>&1
    rc[$name]=$?
    tail -n 1 "$OUT/cluster2_$name.log"
    return
  fi
  # Its cuda:N as the member dryrun's, behind a leader.
  local a moved=()
  for a in "${cmd[@]}"; do
    if [[ $a == placement.targets=* || $a == placement.drafters=* ]]; then
      a=$(sed -E 's/([=,])(cuda:)/\1dryrun:\2/g' <<< "$a")
    fi
    moved+=("$a")
  done
  start "$name" "$dir" "${moved[@]}" --listen 127.0.0.1:0
  [[ -n $port ]]
  verdict "$name: config, overrides and placement (its devices on a member) accepted" $? "$OUT/cluster2_$name.log"
  stop
}
# lead LOG DIR [ARGS...]: the cluster's leader, in the background.
lead() {
  local name=$1 dir=$2; shift 2
  local cmd=("$B" run "$T/run.toml" --set run.output_dir="$dir" --listen 127.0.0.1:0
             --set cluster.join_timeout_s=60 "$@" "${extra[@]}")
  show timeout "$RUN_S" "${cmd[@]}"
  start "$name" "$dir" "${cmd[@]}"
  members=()
  if [[ -n $port ]]; then
    mapfile -t members < <("$PY" -c 'import json,sys; print(*json.load(open(sys.argv[1]))["members"], sep="\n")' \
                                    "$dir/cluster.json")
  fi
  if ((DRY)); then
    [[ -n $port ]]
    verdict "$name: config, overrides and placement accepted${port:+; it waits for ${members[*]}}" $? \
      "$OUT/cluster2_$name.log"
  elif [[ -z $port ]]; then
    echo "the leader did not listen:"; tail -n 5 "$OUT/cluster2_$name.log"
  fi
}
# member NODE DEVICES LOG: a node of the leader just started, in the background.
member() {
  local node=$1 devices=$2 log=$OUT/cluster2_$3.log
  local cmd=("$B" node --join "127.0.0.1:${port:-PORT}" --name "$node" --devices "$devices" --heartbeat-s 0.5
             --timeout-s 5)
  show timeout "$NODE_S" "${cmd[@]}"
  if [[ -z $port ]]; then
    ((DRY)) && verdict "$node: no leader to join" 1
    return
  fi
  if ((!DRY)); then
    timeout "$NODE_S" "${cmd[@]}" > "$log" 2>&1 &
    mpid[$node]=$!
    pids+=("$!")
    return
  fi
  # The leader's placement, as it read it (config.toml): the cuda:N it names
  # on this node must be among the node's --devices (resolve_placement's
  # rule, checked here: the leader checks it only once the node has joined).
  "$PY" - "$lead_dir" "$node" "$devices" > "$log.check" 2>&1 <<'EOF'
import json, sys, tomllib
folder, node, devices = sys.argv[1:]
members = json.load(open(f"{folder}/cluster.json"))["members"]
placement = tomllib.load(open(f"{folder}/config.toml", "rb"))["placement"]
gpus = 0 if devices == "cpu" else len(devices.split(","))
if node not in members:
    sys.exit(f"the leader waits for {', '.join(members)}, not {node}")
for field in ("targets", "drafters"):
    for entry in placement[field]:
        name, _, device = entry.partition(":")
        if name == node and device.startswith("cuda:") and int(device[5:]) >= gpus:
            sys.exit(f"placement.{field} names {entry}, but --devices {devices} gives {node} {gpus} GPU(s), "
                     "counted from cuda:0")
EOF
  verdict "$node: a node the leader waits for, --devices $devices cover its placement" $? "$log.check"
  CUDA_VISIBLE_DEVICES='' timeout 10 "${cmd[@]}" > "$log" 2>&1
  [[ $? == 2 ]] && grep -qF -- "--devices $devices: this host has 0 GPU(s)" "$log"
  verdict "$node: the node command parses up to counting GPUs" $? "$log"
}
# finish: waits for the leader and its members (exit statuses in rc), or
# stops a dry run's leader.
finish() {
  local n
  if ((DRY)); then stop; return; fi
  [[ -n $port ]] || kill -TERM "$lpid" 2>/dev/null  # it did not listen: nothing joined
  wait "$lpid"
  rc[leader]=$?
  for n in "${!mpid[@]}"; do wait "${mpid[$n]}"; rc[$n]=$?; done
  pids=()
  local said=""
  for n in "${!rc[@]}"; do said+="$n ${rc[$n]}, "; done
  echo "exit statuses: ${said%, }"
}
cost() { grep -h "shared payloads" "$@" 2>/dev/null | sed 's/^/  /'; }

# summarize CASE ONE_DIR CLUSTER_DIR NODE=LOG...: the part's JSON line.
read -r -d '' SUMMARY_PY <<'EOF'
import json, os, re, subprocess, sys
case, one_dir, many_dir, exits, *node_logs = sys.argv[1:]
dp = case.endswith("_dp")

def events(folder):
    try:
        return [json.loads(line) for line in open(f"{folder}/metrics.jsonl")]
    except OSError:
        return []

def summary(folder):
    """tests/integration/run_summary.py's fields, and the drafters' group's."""
    r = subprocess.run([sys.executable, "tests/integration/run_summary.py", f"{folder}/metrics.jsonl"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    s = json.loads(r.stdout)
    ev = events(folder)
    by_step = {}
    for x in ev:
        if x["event"] == "step":
            by_step.setdefault(x["step"], set()).add(x["drafter"])
    s["groups_formed"] = sum(1 for x in ev if x["event"] == "group_formed")
    s["group_steps"] = len(by_step)
    s["steps_with_both"] = sum(1 for d in by_step.values() if d == {0, 1})
    return s

def losses(folder):
    """step -> its losses (one per drafter), sorted: which drafter took which batch may differ."""
    out = {}
    for x in events(folder):
        if x["event"] == "step":
            out.setdefault(x["step"], []).append(x["loss"])
    return {k: sorted(v, key=lambda l: (l is None, l or 0.0)) for k, v in out.items()}

def cost(path):
    try:
        t = open(path).read()
    except OSError:
        return None
    g = re.search(r"(\d+) published \(([\d.]+) ms each\), (\d+) mapped \(([\d.]+) ms each\), (\d+) released "
                  r"\(([\d.]+) ms each\); CUDA IPC: (\d+) published, (\d+) mapped, (\d+) allocations opened", t)
    if not g:
        return None
    return {"published": int(g[1]), "publish_ms": float(g[2]), "mapped": int(g[3]), "map_ms": float(g[4]),
            "released": int(g[5]), "release_ms": float(g[6]), "ipc_published": int(g[7]),
            "ipc_mapped": int(g[8]), "ipc_opened": int(g[9])}

exit_status = {k: int(v) for k, v in (e.split("=") for e in exits.split())}
dp = dp or case.endswith("_dp_nccl")
close_enough = case.endswith("_nccl")  # a network all-reduce may sum in another order
one, many = summary(one_dir), summary(many_dir)
a, b = losses(one_dir), losses(many_dir)
same = [k for k in a if a[k] == b.get(k)]
diffs = [abs(x - y) for k in a if k in b and len(a[k]) == len(b[k])
         for x, y in zip(a[k], b[k]) if x is not None and y is not None]
why = [f"{k} exited {v}" for k, v in exit_status.items() if v != 0]
for label, s in (("one process", one), ("cluster", many)):
    if s is None:
        why.append(f"{label}: no metrics")
        continue
    if s["end"] != "epochs":
        why.append(f"{label}: ended {s['end']}")
    if s["committed_per_epoch"] != {"0": 64, "1": 64}:
        why.append(f"{label}: committed {s['committed_per_epoch']}")
    if dp and s["groups_formed"] != 1:
        why.append(f"{label}: {s['groups_formed']} groups formed")
    if dp and s["steps_with_both"] < s["group_steps"] - 2:
        why.append(f"{label}: both drafters at {s['steps_with_both']} of {s['group_steps']} steps")
    if dp and not s["last"] < s["first"] - 0.5:
        why.append(f"{label}: the loss fell from {s['first']:.3f} to {s['last']:.3f} only")
if not a or sorted(a) != sorted(b):
    why.append(f"losses: {len(a)} steps in one process, {len(b)} in the cluster run")
elif close_enough and max(diffs, default=1.0) > 1e-3:
    why.append(f"losses: differ by up to {max(diffs, default=1.0):.3g} (> 1e-3)")
elif not close_enough and len(same) != len(a):
    why.append(f"losses: {len(same)} of {len(a)} steps bit-equal")
print(json.dumps({"case": case, "ok": not why, "why": why, "tandem": os.environ.get("TANDEM_VERSION"),
                  "gpus": os.environ.get("GPU_NAMES"), "exit": exit_status, "one": one, "cluster": many,
                  "losses": {"steps": len(a), "bit_equal": len(same), "max_abs_diff": max(diffs, default=None)},
                  "nodes": {n.split("=")[0]: cost(n.split("=", 1)[1]) for n in node_logs}}))
EOF
summarize() {
  local case=$1 one_dir=$2 many_dir=$3 n exits=""; shift 3
  for n in "${!rc[@]}"; do exits+="$n=${rc[$n]} "; done
  TANDEM_VERSION=$("$B" --version) GPU_NAMES=$(nvidia-smi --query-gpu=name --format=csv,noheader | paste -sd,) \
    "$PY" -c "$SUMMARY_PY" "$case" "$one_dir" "$many_dir" "$exits" "$@" | tee -a "$OUT/cluster2.jsonl" \
    | "$PY" -c 'import json,sys; j=json.load(sys.stdin); print(j["case"], "ok" if j["ok"] else "NOT ok: " + "; ".join(j["why"])); sys.exit(0 if j["ok"] else 1)'
}
# part CASE: a dry run's line for the part just checked.
part_bad=0 part_checked=0
part() {
  echo "{\"case\": \"$1\", \"dry_run\": true, \"checked\": $((checked - part_checked)), \"failed\": $((bad - part_bad))}" \
    | tee -a "$OUT/cluster2.jsonl"
  part_checked=$checked part_bad=$bad
}
ok=0

echo "== 1. tiny config, target on cuda:0 and drafter on cuda:1: one process vs three"
rc=() mpid=()
one tiny_one "$T/one" --set placement.targets=cuda:0 --set placement.drafters=cuda:1
lead tiny_leader "$T/three" --set placement.targets=gpu-a:cuda:0 --set placement.drafters=gpu-b:cuda:1
member gpu-a cuda:0 tiny_a
member gpu-b cuda:0,cuda:1 tiny_b
finish
steps=STEPS  # the one-process run's
((DRY)) || steps=$(grep -c '"event":"step"' "$T/one/metrics.jsonl" 2>/dev/null)
show "$PY" tests/integration/compare_losses.py "$T/one/metrics.jsonl" "$T/three/metrics.jsonl" "$steps"
if ((DRY)); then
  part cluster2_tiny
else
  "$PY" tests/integration/compare_losses.py "$T/one/metrics.jsonl" "$T/three/metrics.jsonl" "$steps" \
    | tee "$OUT/cluster2_tiny_compare.log"
  cost "$OUT/cluster2_tiny_a.log" "$OUT/cluster2_tiny_b.log"
  summarize cluster2_tiny "$T/one" "$T/three" gpu-a="$OUT/cluster2_tiny_a.log" gpu-b="$OUT/cluster2_tiny_b.log" \
    || ok=1
fi

echo "== 2. data-parallel drafters in two processes (one NCCL group) vs one process"
rc=() mpid=()
one dp_one "$T/dp_one" --set placement.targets=cuda:0 --set placement.drafters=cuda:0,cuda:1
lead dp_leader "$T/dp_three" --set placement.targets=gpu-a:cuda:0 --set placement.drafters=gpu-b:cuda:0,gpu-c:cuda:1
member gpu-a cuda:0 dp_a
member gpu-b cuda:0 dp_b
member gpu-c cuda:0,cuda:1 dp_c
finish
if ((DRY)); then
  part cluster2_dp
else
  cost "$OUT/cluster2_dp_a.log" "$OUT/cluster2_dp_b.log" "$OUT/cluster2_dp_c.log"
  summarize cluster2_dp "$T/dp_one" "$T/dp_three" gpu-a="$OUT/cluster2_dp_a.log" gpu-b="$OUT/cluster2_dp_b.log" \
    gpu-c="$OUT/cluster2_dp_c.log" || ok=1
fi

echo "== 3. part 2 with cluster.transport = nccl: NCCL links and the all-reduce across processes"
rc=() mpid=()
lead dp_nccl_leader "$T/dp_nccl" --set placement.targets=gpu-a:cuda:0 \
  --set placement.drafters=gpu-b:cuda:0,gpu-c:cuda:1 --set cluster.transport=nccl
member gpu-a cuda:0 dp_nccl_a
member gpu-b cuda:0 dp_nccl_b
member gpu-c cuda:0,cuda:1 dp_nccl_c
finish
if ((DRY)); then
  part cluster2_dp_nccl
else
  grep -h "NCCL links" "$OUT"/cluster2_dp_nccl_*.log 2>/dev/null | sed 's/^/  /'
  summarize cluster2_dp_nccl "$T/dp_one" "$T/dp_nccl" gpu-a="$OUT/cluster2_dp_nccl_a.log" \
    gpu-b="$OUT/cluster2_dp_nccl_b.log" gpu-c="$OUT/cluster2_dp_nccl_c.log" || ok=1
fi

if ((DRY)); then
  # The summary's Python at least compiles.
  "$PY" -c 'import sys; compile(sys.argv[1], "summary", "exec")' "$SUMMARY_PY"
  verdict "the parts' summary (Python) compiles" $?
  echo "dry run: $checked checks, $bad failed"
  echo "SKIPPED (dry run): $shown commands not run"
  ((bad == 0))
  exit
fi
exit $ok
