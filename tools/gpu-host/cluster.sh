# On the GPU host (see tools/gpu-host/pack): issue 18 on one GPU — a leader,
# a target node and a drafter node as three processes on one host, target
# and drafter both on cuda:0, features through CUDA IPC.
#   1. gpu_tests TransportIpc: CUDA payloads between two processes (bit-equal,
#      each allocation opened once, the cost per payload);
#   2. the tiny config, two epochs, one process and then three: losses
#      compared, the nodes' sharing costs;
#   3. the 8B pipeline (bench/pipeline.py's random Qwen3-8B and 5-layer
#      drafter, S 3072) as three processes, STEPS8 steps (default 80): the
#      IPC path's host cost per batch (publish on the target node, map on the
#      drafter node, release) against the step time; the drafter node
#      SIGKILLed at step ~30 and started again by name: the run ends with
#      every sample of its steps committed once: the final checkpoint's
#      ledger and every step's batch equal a one-process run of the same
#      steps (ONLY3=1 runs only this part; KILL=target kills the target
#      node instead: its target and prefetch are restarted, no rollback;
#      KILL=spare: the drafter node is never started again, a spare device
#      of a third node takes its drafter over).
# LINK=nccl: cluster.transport = "nccl", so batches and features are pulled
# over NCCL links between the processes (gpu/transport/link.hpp) instead of
# CUDA IPC; LINK=hosts: the drafter node poses as another host
# (TANDEM_TEST_HELLO_HOST) and transport "auto" picks the links.  Either way
# the nodes name different NCCL hosts (Tandem sets NCCL_HOSTID: the host
# identity, per process with "nccl"): NCCL refuses two ranks on one GPU of
# one host, and ranks of two hosts talk through its network transport, here
# over loopback (gpu/dev/nccl_hostid_probe.py) — the cross-host path, on one
# GPU.  Part 1 then runs gpu_tests TransportLink too.
# Logs into $OUT: cluster_*.log, cluster.jsonl (one line per part).
if [ $# -gt 0 ]; then  # no options (not even --dry-run: tools/gpu-host/two_gpu.sh --dry-run shows the plan)
  echo "usage: bash tools/gpu-host/cluster.sh  (no options; on the GPU host after tools/gpu-host/pack)" >&2; exit 2
fi
source tools/gpu-host/env.sh
OUT=${OUT:-/tmp}
B=$ROOT/build/bin/tandem
PY=$TANDEM_PYTHON
W=${W:-/tmp/pipe}
node() {
  local envs=()
  [[ -n "${LINK:-}" ]] && envs+=(NCCL_SOCKET_IFNAME=lo)
  [[ "${LINK:-}" == hosts && "$2" == gpu-b ]] && envs+=(TANDEM_TEST_HELLO_HOST="simulated-host-b boot 00000000")
  env ${envs[@]+"${envs[@]}"} "$B" node --join "127.0.0.1:$1" --name "$2" --devices cuda:0 --heartbeat-s 0.5 --timeout-s 5 > "$3" 2>&1 &
}
# The leader's transport setting (LINK=nccl forces the links).
LINKSET=(); [[ "${LINK:-}" == nccl ]] && LINKSET=(--set cluster.transport=nccl)
# KILL=spare (part 3): a third node gpu-c holds a spare device
# (placement.spares); the drafter node is killed and never started again,
# and the drafter restarts on the spare from the newest checkpoint.
SPARESET=(); [[ "${KILL:-}" == spare ]] && SPARESET=(--set placement.spares=gpu-c:cuda:0)
port_of() { for _ in $(seq 1 600); do [[ -s "$1/cluster.json" ]] && { $PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$1/cluster.json"; return; }; sleep 0.1; done; return 1; }
cost() { grep -h "shared payloads\|NCCL links" "$@" | sed 's/^/  /'; }

if [[ -z "${ONLY3:-}" ]]; then
if [[ -z "${SKIP1:-}" ]]; then
echo "== 1. TransportIpc"
timeout 300 build/bin/gpu_tests --gtest_filter='TransportIpc.*' 2>&1 | tee $OUT/cluster_ipc_test.log | grep -E "cuda ipc|OK|FAILED|PASSED|SKIPPED" | head
if [[ -n "${LINK:-}" ]]; then
  NCCL_SOCKET_IFNAME=lo timeout 300 build/bin/gpu_tests --gtest_filter='TransportLink.*' 2>&1 | tee $OUT/cluster_link_test.log \
    | grep -E "nccl link|OK|FAILED|PASSED|SKIPPED" | head
fi

fi
echo "== 2. tiny config, one process vs three"
T=$(mktemp -d)
$PY tests/integration/make_run_dataset.py $T/data > /dev/null
sed "s|@TARGET@|$ROOT/build/fixtures/qwen3_tiny|" tests/integration/run_test.toml > $T/run.toml
timeout 300 "$B" run $T/run.toml --set run.output_dir=$T/one --set placement.targets=cuda:0 \
  --set placement.drafters=cuda:0 > $OUT/cluster_tiny_one.log 2>&1 || echo "one-process run failed"
timeout 300 "$B" run $T/run.toml --set run.output_dir=$T/three --listen 127.0.0.1:0 --set placement.targets=gpu-a:cuda:0 \
  --set placement.drafters=gpu-b:cuda:0 "${LINKSET[@]}" > $OUT/cluster_tiny_leader.log 2>&1 &
lp=$!
p=$(port_of $T/three)
node $p gpu-a $OUT/cluster_tiny_a.log; node $p gpu-b $OUT/cluster_tiny_b.log
wait $lp; echo "leader exit $?"; wait
tail -1 $OUT/cluster_tiny_one.log; tail -1 $OUT/cluster_tiny_leader.log
$PY tests/integration/compare_losses.py $T/one/metrics.jsonl $T/three/metrics.jsonl 80 | tee -a $OUT/cluster_tiny_compare.log
cost $OUT/cluster_tiny_a.log $OUT/cluster_tiny_b.log

fi
# SKIP1=1: part 1 skipped; SKIP3=1: part 3 skipped.
[[ -n "${SKIP3:-}" ]] && exit 0
echo "== 3. 8B pipeline as three processes"
[[ -f $W/run.toml && -f $W/target/config.json ]] || \
  timeout 400 $PY bench/pipeline.py --tandem $B --size 8b --target-device cuda:0 --drafter-device cuda:0 \
    --work "$W" --setup-only > /dev/null || { echo "8b setup failed"; exit 1; }
# The one-process reference of the same steps (ONLY3=1: parts 1-2 skipped).
R1=$W/one; rm -rf $R1
timeout 300 "$B" run $W/run.toml --set run.output_dir=$R1 --set train.max_steps=${STEPS8:-80} \
  --set checkpoint.every_steps=20 --set placement.targets=cuda:0 --set placement.drafters=cuda:0 \
  --set checkpoint.keep=1 > $OUT/cluster_8b_one.log 2>&1 || echo "8b one-process run failed"
# Its final ledger is all the comparison needs: the disk holds few 8B checkpoints.
cp "$(ls -d $R1/checkpoints/step-* | tail -1)/state.json" $R1/final_state.json && rm -rf $R1/checkpoints
R=$W/cluster; rm -rf $R
timeout 420 "$B" run $W/run.toml --set run.output_dir=$R --listen 127.0.0.1:0 --set train.max_steps=${STEPS8:-80} \
  --set checkpoint.every_steps=20 --set checkpoint.keep=1 --set placement.targets=gpu-a:cuda:0 \
  --set placement.drafters=gpu-b:cuda:0 --set cluster.timeout_s=10 --set cluster.heartbeat_s=1 "${LINKSET[@]}" \
  "${SPARESET[@]}" > $OUT/cluster_8b_leader.log 2>&1 &
lp=$!
p=$(port_of $R)
node $p gpu-a $OUT/cluster_8b_a.log; ap=$!; node $p gpu-b $OUT/cluster_8b_b.log; bp=$!
[[ "${KILL:-}" == spare ]] && node $p gpu-c $OUT/cluster_8b_c.log
# KILL=target: the target node is killed instead (its target and prefetch
# are restarted when it joins again; the drafter keeps its state).
if [[ "${KILL:-drafter}" == target ]]; then victim=$ap; vname=gpu-a; else victim=$bp; vname=gpu-b; fi
for _ in $(seq 1 3000); do
  [[ $(grep -c '"event":"step"' $R/metrics.jsonl 2>/dev/null) -ge 30 ]] && break
  kill -0 $lp 2>/dev/null || { echo "the 8B leader ended early: $(tail -2 $OUT/cluster_8b_leader.log)"; exit 1; }
  sleep 0.1
done
grep -h "shared payloads" $OUT/cluster_8b_b.log
kill -9 $victim; echo "${KILL:-drafter} node killed at step $(grep -c '"event":"step"' $R/metrics.jsonl)"
sleep 3
# The cost lines: the target node's and the drafter node's that ran to the end.
if [[ "${KILL:-}" == spare ]]; then
  la=$OUT/cluster_8b_a.log; lb=$OUT/cluster_8b_c.log  # gpu-b stays dead: the spare took over
else
  node $p $vname $OUT/cluster_8b_${vname#gpu-}2.log
  if [[ $vname == gpu-a ]]; then la=$OUT/cluster_8b_a2.log; lb=$OUT/cluster_8b_b.log
  else la=$OUT/cluster_8b_a.log; lb=$OUT/cluster_8b_b2.log; fi
fi
# What the run is doing after the restart, every 15 s (a stall shows here).
( while kill -0 $lp 2>/dev/null; do
    { date +%T; timeout 10 "$B" shell $R -c status 2>&1 | head -40; } >> $OUT/cluster_8b_status.log; sleep 15
  done ) &
wait $lp; echo "leader exit $?"; wait
tail -2 $OUT/cluster_8b_leader.log
cost $la $lb
$PY - "$R/metrics.jsonl" $la $lb "${KILL:-drafter}" "${LINK:-ipc}" <<'PYEOF' | tee -a $OUT/cluster.jsonl
import json, re, sys, statistics
m = [json.loads(l) for l in open(sys.argv[1])]
steps = [x for x in m if x["event"] == "step"]
fails = [x for x in m if x["event"] == "drafter_failed"]
actors = [(x["role"], x["index"]) for x in m if x["event"] == "actor_failed"]
reissued = [x["samples"] for x in m if x["event"] == "reissued"]
ends = [x for x in m if x["event"] == "end"]
cms = [x["compute_ms"] for x in steps[5:] if "compute_ms" in x]
def cost(path, what):
    t = open(path).read()
    g = re.search(r"(\d+) published \(([\d.]+) ms each\), (\d+) mapped \(([\d.]+) ms each\), (\d+) released \(([\d.]+) ms each\)", t)
    return {"published": int(g[1]), "publish_ms": float(g[2]), "mapped": int(g[3]), "map_ms": float(g[4]),
            "released": int(g[5]), "release_ms": float(g[6])} if g else None
def link(path):
    g = re.search(r"NCCL links: (\d+) joined, (\d+) pulls sent \(([\d.]+) MB\), (\d+) received \(([\d.]+) MB, ([\d.]+) ms each", open(path).read())
    return {"joined": int(g[1]), "pulls_sent": int(g[2]), "mb_sent": float(g[3]), "received": int(g[4]),
            "mb_received": float(g[5]), "receive_ms": float(g[6])} if g else None
a, b = cost(sys.argv[2], "a"), cost(sys.argv[3], "b")
la, lb = link(sys.argv[2]), link(sys.argv[3])
step = statistics.median(cms) if cms else 0
# Per batch: the target node publishes a batch and its features and releases them;
# the drafter node maps both.
per_batch = (2 * a["publish_ms"] + 2 * a["release_ms"] + 2 * b["map_ms"]) if a and b else None
print(json.dumps({"case": "cluster_8b_" + ("ipc" if sys.argv[5] == "ipc" else "link_" + sys.argv[5]),
                  "killed": sys.argv[4], "steps": len(steps), "failures": len(fails),
                  "target_link": la, "drafter_link": lb,
                  "link_share_of_step": (lb["receive_ms"] / step) if lb and step else None,
                  "actors_failed": actors, "reissued": reissued,
                  "restore_from": [f.get("restore_from") for f in fails],
                  "end": ends[-1]["reason"] if ends else None, "step_compute_ms_median": step,
                  "target_node": a, "drafter_node": b, "ipc_host_ms_per_batch": per_batch,
                  "ipc_share_of_step": (per_batch / step) if per_batch and step else None}))
PYEOF
# Exact: the final checkpoints commit the same samples, and every step
# 1..N (its last incarnation) trained the same batch as the one-process run.
$PY - "$R1" "$R" <<'PYEOF' | tee -a $OUT/cluster.jsonl
import json, sys, os
def load(d):
    m = [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
    steps = {x["step"]: x for x in m if x["event"] == "step"}
    ck = [x for x in m if x["event"] == "checkpoint"][-1]
    kept = os.path.join(d, "final_state.json")
    extra = json.load(open(kept if os.path.exists(kept) else os.path.join(ck["dir"], "state.json")))["extra"]
    return steps, json.loads(extra) if isinstance(extra, str) else extra
(s1, e1), (s2, e2) = load(sys.argv[1]), load(sys.argv[2])
same_batches = sorted(s1) == sorted(s2) and all(
    (s1[k]["tokens"], s1[k]["scored_tokens"]) == (s2[k]["tokens"], s2[k]["scored_tokens"]) for k in s1)
dl = max(abs(s1[k]["loss"] - s2[k]["loss"]) for k in s1 if k in s2)
print(json.dumps({"case": "cluster_8b_exact", "steps": len(s2), "same_ledger": e1["ledger"] == e2["ledger"],
                  "ledger": e2["ledger"], "same_batches": same_batches, "max_loss_diff": dl}))
PYEOF
