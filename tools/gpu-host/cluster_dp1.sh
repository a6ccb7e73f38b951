# On the GPU host (see tools/gpu-host/pack), ONE GPU: the cluster across
# processes with data-parallel drafters, everything crossing processes by
# NCCL — the rehearsal on one GPU of the two-GPU issue's part 2
# (tools/gpu-host/cluster2.sh needs two GPUs).  A leader, a target node
# gpu-a and two drafter nodes gpu-b and gpu-c, all on cuda:0, with
# cluster.transport = "nccl": every process is an NCCL host of its own
# (NCCL_HOSTID, gpu/transport/link.hpp), so the drafters' gradient
# all-reduce crosses processes through NCCL's network transport (loopback
# sockets here), and each drafter pulls its batches and features from the
# target over an NCCL link.  NCCL refuses two ranks on one GPU of one host;
# as two hosts they are allowed (gpu/dev/nccl_hostid_probe.py).
#   1. the tiny config, two epochs: exit 0 everywhere, both epochs exact
#      (64 samples committed each), one group formed, both drafters at every
#      group step, the loss falls;
#   2. the same with gpu-c SIGKILLed after step 20 and started again by name:
#      the run ends with both epochs exact, a drafter failure handled, and a
#      group formed again.
# Not a performance figure: one GPU is time-sliced and the sockets are
# loopback.  Logs into $OUT: cluster_dp1_*.log and cluster_dp1.jsonl (one
# line per part, "ok" and "why").  Each run is bounded by RUN_S (default
# 150 s): ~6 min at most.
if [ $# -gt 0 ]; then  # no options (not even --dry-run: tools/gpu-host/two_gpu.sh --dry-run shows the plan)
  echo "usage: bash tools/gpu-host/cluster_dp1.sh  (no options; on the GPU host after tools/gpu-host/pack)" >&2; exit 2
fi
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=$ROOT/build/bin/tandem
PY=$TANDEM_PYTHON
RUN_S=${RUN_S:-150}
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
T=$(mktemp -d)
$PY tests/integration/make_run_dataset.py $T/data > /dev/null
sed "s|@TARGET@|$ROOT/build/fixtures/qwen3_tiny|" tests/integration/run_test.toml > $T/run.toml
port_of() { for _ in $(seq 1 600); do [[ -s "$1/cluster.json" ]] && { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$1/cluster.json"; return; }; sleep 0.1; done; return 1; }
node() { timeout $((RUN_S + 30)) "$B" node --join "127.0.0.1:$1" --name "$2" --devices cuda:0 --heartbeat-s 0.5 --timeout-s 5 > "$3" 2>&1 & }

# part NAME KILL: one run; KILL=1 kills gpu-c after step 20 and starts it again.
part() {
  local name=$1 kill=$2 R=$T/$1
  timeout $RUN_S "$B" run $T/run.toml --set run.output_dir=$R --listen 127.0.0.1:0 --set placement.targets=gpu-a:cuda:0 \
    --set placement.drafters=gpu-b:cuda:0,gpu-c:cuda:0 --set cluster.transport=nccl --set runtime.credits=4 \
    --set cluster.timeout_s=5 --set cluster.heartbeat_s=0.5 > $OUT/cluster_dp1_${name}_leader.log 2>&1 &
  local lp=$!
  local p; p=$(port_of $R) || { echo "$name: the leader did not listen"; tail -3 $OUT/cluster_dp1_${name}_leader.log; return; }
  node $p gpu-a $OUT/cluster_dp1_${name}_a.log; local ap=$!
  node $p gpu-b $OUT/cluster_dp1_${name}_b.log; local bp=$!
  node $p gpu-c $OUT/cluster_dp1_${name}_c.log; local cp=$!
  if [[ $kill == 1 ]]; then
    for _ in $(seq 1 1200); do
      [[ $(grep -c '"event":"step"' $R/metrics.jsonl 2>/dev/null) -ge 40 ]] && break  # two reports a group step
      kill -0 $lp 2>/dev/null || break
      sleep 0.1
    done
    pkill -KILL -P $cp; kill -KILL $cp  # the node, and the timeout around it
    echo "$name: gpu-c killed at $(grep -c '"event":"step"' $R/metrics.jsonl) step reports"
    sleep 2
    node $p gpu-c $OUT/cluster_dp1_${name}_c2.log; cp=$!
  fi
  wait $lp; local lrc=$?
  wait $ap; local arc=$?; wait $bp; local brc=$?; wait $cp; local crc=$?
  tail -1 $OUT/cluster_dp1_${name}_leader.log
  grep -h "NCCL links" $OUT/cluster_dp1_${name}_*.log | sed 's/^/  /'
  $PY - "$name" "$R/metrics.jsonl" "$kill" "leader=$lrc gpu-a=$arc gpu-b=$brc gpu-c=$crc" <<'PYEOF' | tee -a $OUT/cluster_dp1.jsonl
import json, subprocess, sys
name, path, kill, exits = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
ev = [json.loads(l) for l in open(path)]
s = json.loads(subprocess.run([sys.executable, "tests/integration/run_summary.py", path],
                              capture_output=True, text=True).stdout)
by_step = {}
for x in ev:
    if x["event"] == "step":
        by_step.setdefault(x["step"], set()).add(x["drafter"])
groups = sum(1 for x in ev if x["event"] == "group_formed")
both = sum(1 for d in by_step.values() if d == {0, 1})
why = [f"{e} exited nonzero" for e in exits.split() if not e.endswith("=0")]
if s["end"] != "epochs": why.append(f"ended {s['end']}")
if s["committed_per_epoch"] != {"0": 64, "1": 64}: why.append(f"committed {s['committed_per_epoch']}")
if not kill and groups != 1: why.append(f"{groups} groups formed")
if kill and (s["failed"] < 1 or groups < 2): why.append(f"{s['failed']} failures, {groups} groups formed")
if not kill and both < len(by_step) - 2: why.append(f"both drafters at {both} of {len(by_step)} steps")
if not s["last"] < s["first"] - 0.5: why.append(f"the loss fell from {s['first']:.3f} to {s['last']:.3f} only")
print(json.dumps({"case": "cluster_dp1_" + name, "ok": not why, "why": why, "exits": exits, "summary": s,
                  "groups_formed": groups, "group_steps": len(by_step), "steps_with_both": both}))
PYEOF
}
# PARTS="clean kill" (the default) or one of them.
for p in ${PARTS:-clean kill}; do part $p $([[ $p == kill ]] && echo 1 || echo 0); done
