#!/usr/bin/env bash
# A cluster on one machine, on the CPU (issue 18): `tandem run --listen` as
# the leader and `tandem node` members over CAF's middleman on loopback,
# batches and features between processes through shared memory.
#   1. a target node and a drafter node (one started before the leader: it
#      retries) train the tiny config's two epochs: exact ledger, every
#      step's loss bit-equal to the one-process run, every process exits 0,
#      no shared-memory segment left behind;
#   1b. hostile bytes at the leader's port (random, huge lengths, truncated
#      and over-long answers, 200 idle connections): no crash, no stall;
#   2. refusals, each with its reason and exit 2, while the leader waits: a
#      wrong join token, none, another build (named on both sides), a name
#      the placement does not hold, a node on another host; then the
#      leader's join timeout names the missing node (exit 1);
#   3. non-loopback addresses refused without TLS;
#   4. the leader SIGKILLed mid-run: the members say so and exit 1 within
#      the connection timeout;
#   5. the drafter node SIGKILLed mid-run and started again (same name):
#      restored from the newest checkpoint, exact ledger, losses bit-equal;
#   5d. a spare (placement.spares): the drafter node SIGKILLed and never
#      started again, its drafter restarted on the spare from the newest
#      checkpoint, exact ledger, losses bit-equal;
#   4b. the leader SIGKILLed mid-run, then --resume with the same nodes:
#      exact ledger, losses bit-equal; a newest checkpoint on a member that
#      this machine cannot read is named (node, path), exit 2;
#   5b. the target node SIGKILLed mid-run and started again: its target and
#      prefetch restarted, the batches in flight issued again, no rollback,
#      losses bit-equal;
#   5c. the target node aborted by an injected fault: started again, the
#      fault does not fire twice, the run ends exact;
#   6. the drafter node SIGSTOPped: declared lost within the timeout, fenced
#      after SIGCONT (it exits 1), a fresh one finishes the run, losses
#      bit-equal;
#   7. TLS (cluster.certs, --certs): the cluster CA's nodes train bit-equal;
#      another CA's certificate and a member without TLS never get in.
# ~150 s alone on 2 cores (~205 s beside the rest of ctest -j2).
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/run_lib.sh"
pids=()
cleanup_procs() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap 'cleanup_procs; [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"' EXIT

fast=(--set cluster.heartbeat_s=0.5 --set cluster.timeout_s=3)
node_fast=(--heartbeat-s 0.5 --timeout-s 3)
split=(--set placement.targets=gpu-a:cpu --set placement.drafters=gpu-b:cpu)

# The leader's port, once it listens (port 0: any free one).
port_of() {
  for _ in $(seq 1 200); do
    [[ -s "$1/cluster.json" ]] && { "$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$1/cluster.json"; return; }
    sleep 0.05
  done
  echo "no $1/cluster.json" >&2; return 1
}
segments_of() { ls /dev/shm | grep -c "^tandem-$(id -u)-$1-" || true; }

# 1. The reference, then the same run as three processes.
"$tandem" run "$work/run.toml" --set run.output_dir="$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; fail "one-process run"; }
s=$(summary "$work/one/metrics.jsonl"); echo "one process: $s"
check both_epochs_exact "$s"

# A member that starts before its leader keeps retrying.
"$tandem" node --join 127.0.0.1:47391 --name gpu-a --devices cpu "${node_fast[@]}" > "$work/a.log" 2>&1 &
a_pid=$!; pids+=($a_pid)
sleep 1
"$tandem" run "$work/run.toml" --set run.output_dir="$work/two" --listen 127.0.0.1:47391 "${fast[@]}" "${split[@]}" \
  > "$work/leader.log" 2>&1 &
l_pid=$!; pids+=($l_pid)
"$tandem" node --join 127.0.0.1:47391 --name gpu-b --devices cpu "${node_fast[@]}" > "$work/b.log" 2>&1 &
b_pid=$!; pids+=($b_pid)
rc=0; wait $l_pid || rc=$?
check test "$rc" = 0 || cat "$work/leader.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0 || cat "$work/a.log"
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0 || cat "$work/b.log"
check grep -q "waiting for the leader at 127.0.0.1:47391" "$work/a.log"
check grep -q "waiting for nodes: 2 of 2 joined" "$work/leader.log"
check grep -q "gpu-b:cpu: drafter 0" "$work/leader.log"
check grep -q "the run ended (exit 0)" "$work/b.log"
s2=$(summary "$work/two/metrics.jsonl"); echo "cluster: $s2"
check both_epochs_exact "$s2"
check test "$(field "$s2" end)" = epochs
steps=$(field "$s" steps)
check test "$(field "$s2" steps)" = "$steps"
check "$python" "$here/compare_losses.py" "$work/one/metrics.jsonl" "$work/two/metrics.jsonl" "$steps"
check test -d "$work/two/checkpoints/step-$(printf %08d "$steps")"
for p in $a_pid $b_pid $l_pid; do check test "$(segments_of $p)" = 0; done

# 1b. Hostile bytes at the leader's port while it waits (random data,
# header-shaped huge lengths, truncated and over-long gate answers, wrong
# proofs, 200 idle connections, garbage after the nonce): the leader neither
# crashes nor stalls, then the members join and the run is bit-equal.
"$tandem" certs "$work/pki" --nodes gpu-a,gpu-b,gpu-c > /dev/null
"$tandem" run "$work/run.toml" --set run.output_dir="$work/hostile" --listen 127.0.0.1:0 "${fast[@]}" "${split[@]}" \
  --set supervision.worker_restarts=0 --set cluster.secret="$work/pki/cluster.secret" > "$work/hostile.log" 2>&1 &
l_pid=$!; pids+=($l_pid)
port=$(port_of "$work/hostile")
"$python" "$here/cluster_hostile.py" 127.0.0.1 "$port" 6 > "$work/hostile-probe.log" 2>&1 || { cat "$work/hostile-probe.log"; }
cat "$work/hostile-probe.log"
check kill -0 $l_pid
check grep -q "idle: 200 of 200 closed by the leader" "$work/hostile-probe.log"
check grep -q "wrong-proof: .*no a wrong join token" "$work/hostile-probe.log"
"$tandem" node --join "127.0.0.1:$port" --name gpu-a --devices cpu "${node_fast[@]}" \
  --token-file "$work/pki/gpu-a/join.token" > "$work/ha.log" 2>&1 &
a_pid=$!; pids+=($a_pid)
"$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu "${node_fast[@]}" \
  --token-file "$work/pki/gpu-b/join.token" > "$work/hb.log" 2>&1 &
b_pid=$!; pids+=($b_pid)
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/hostile.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0
check "$python" "$here/compare_losses.py" "$work/one/metrics.jsonl" "$work/hostile/metrics.jsonl" "$steps"

# 2. Refusals.  A secret: tokens are checked.
"$tandem" run "$work/run.toml" --set run.output_dir="$work/refuse" --listen 127.0.0.1:0 "${split[@]}" \
  --set cluster.secret="$work/pki/cluster.secret" --set cluster.join_timeout_s=12 > "$work/refuse.log" 2>&1 &
l_pid=$!; pids+=($l_pid)
port=$(port_of "$work/refuse")
join() { "$tandem" node --join "127.0.0.1:$port" --wait-s 10 "${node_fast[@]}" --devices cpu "$@"; }
rc=0; join --name gpu-a --token-file "$work/pki/gpu-c/join.token" > "$work/wrong.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "refused this node: a wrong join token" "$work/wrong.log"
rc=0; join --name gpu-a > "$work/none.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "refused this node: no join token" "$work/none.log"
rc=0; TANDEM_TEST_HELLO_VERSION=0.0.1 join --name gpu-a --token-file "$work/pki/gpu-a/join.token" \
  > "$work/version.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "it runs another build: Tandem 0.0.1 (the leader has " "$work/version.log"
rc=0; join --name gpu-c --token-file "$work/pki/gpu-c/join.token" > "$work/unplaced.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "the placement names no such node (it names: gpu-a, gpu-b)" "$work/unplaced.log"
# gpu-a with its token joins; gpu-b never comes: the leader names it.
join --name gpu-a --token-file "$work/pki/gpu-a/join.token" > "$work/a2.log" 2>&1 &
a_pid=$!; pids+=($a_pid)
# Once gpu-a is in, a gpu-b on another host is refused: payloads cross
# processes through shared memory, one host only.
for _ in $(seq 1 100); do grep -q "node 'gpu-a' (pid" "$work/refuse.log" && break; sleep 0.1; done
rc=0; TANDEM_TEST_HELLO_HOST="elsewhere boot 12345678" join --name gpu-b --token-file "$work/pki/gpu-b/join.token" \
  > "$work/host.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "it runs on host 'elsewhere boot 12345678' but node 'gpu-a' runs on" "$work/host.log"
check grep -q "the CPU path is for tests and demos" "$work/host.log"
rc=0; wait $l_pid || rc=$?
check test "$rc" = 1
check grep -q "nodes gpu-b did not join within 12 s (cluster.join_timeout_s)" "$work/refuse.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 1
check grep -q "refused: a wrong join token" "$work/refuse.log"

# 3. Off loopback: refused at start, before anything listens.
rc=0; "$tandem" run "$work/run.toml" --set run.output_dir="$work/wide" --listen 0.0.0.0:47392 "${split[@]}" \
  > "$work/wide.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "is not a loopback address: between hosts the nodes speak TLS only" "$work/wide.log"
rc=0; "$tandem" node --join 10.1.2.3:47392 --name gpu-a > "$work/wide-node.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "is not a loopback address: between hosts the nodes speak TLS only" "$work/wide-node.log"
# NCCL links between CPU processes: refused at start, naming the key.
rc=0; "$tandem" run "$work/run.toml" --set run.output_dir="$work/nccl-cpu" --listen 127.0.0.1:0 "${split[@]}" \
  --set cluster.transport=nccl > "$work/nccl-cpu.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "'cluster.transport' is \"nccl\" but the placement puts an actor on the CPU" "$work/nccl-cpu.log"

# 4. The leader killed mid-run: its members notice within the timeout.
"$tandem" run "$work/run.toml" --set run.output_dir="$work/lost" --listen 127.0.0.1:0 "${fast[@]}" "${split[@]}" \
  --set supervision.worker_restarts=0 --set data.epochs=40 > "$work/lost.log" 2>&1 &
l_pid=$!; pids+=($l_pid)
port=$(port_of "$work/lost")
"$tandem" node --join "127.0.0.1:$port" --name gpu-a --devices cpu "${node_fast[@]}" > "$work/la.log" 2>&1 &
a_pid=$!; pids+=($a_pid)
"$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu "${node_fast[@]}" > "$work/lb.log" 2>&1 &
b_pid=$!; pids+=($b_pid)
for _ in $(seq 1 400); do [[ $(grep -c '"event":"step"' "$work/lost/metrics.jsonl" 2>/dev/null) -ge 5 ]] && break; sleep 0.05; done
kill -9 $l_pid
t0=$(date +%s)
rc=0; wait $a_pid || rc=$?; check test "$rc" = 1
rc=0; wait $b_pid || rc=$?; check test "$rc" = 1
took=$(( $(date +%s) - t0 )); echo "members gone ${took} s after the leader was killed"
check test "$took" -le 10
check grep -q "the leader at 127.0.0.1:$port is gone" "$work/lb.log"
sleep 0.5
for p in $a_pid $b_pid; do n=$(segments_of $p); [[ "$n" = 0 ]] || echo "note: node $p left $n segment(s) (a node that dies leaves them to the next start's sweep)"; done

# 5. The drafter node SIGKILLed mid-run and started again with its name:
# the leader waits for it, the drafter is restored from the newest
# checkpoint (its restore point in memory went with the process), and the
# run ends with an exact ledger and every step's loss bit-equal to the
# one-process run's (4 epochs, so the kill lands mid-run).
"$tandem" run "$work/run.toml" --set run.output_dir="$work/one4" --set data.epochs=4 > "$work/one4.log" 2>&1 \
  || { cat "$work/one4.log"; fail "one-process 4-epoch run"; }
s4=$(summary "$work/one4/metrics.jsonl")
steps4=$(field "$s4" steps)
lead() {  # lead OUT [args...]: a 4-epoch cluster run in the background; sets l_pid and port
  local out=$1; shift
  "$tandem" run "$work/run.toml" --set run.output_dir="$work/$out" --set data.epochs=4 --listen 127.0.0.1:0 \
    "${fast[@]}" "${split[@]}" "$@" > "$work/$out.log" 2>&1 &
  l_pid=$!; pids+=($l_pid)
  port=$(port_of "$work/$out")
}
member() {  # member NAME LOG: sets m_pid
  "$tandem" node --join "127.0.0.1:$port" --name "$1" --devices cpu "${node_fast[@]}" > "$2" 2>&1 &
  m_pid=$!; pids+=($m_pid)
}
steps_in() { grep -c '"event":"step"' "$1" 2>/dev/null || true; }
lead killed
member gpu-a "$work/ka.log"; a_pid=$m_pid
member gpu-b "$work/kb.log"; b_pid=$m_pid
for _ in $(seq 1 400); do [[ $(steps_in "$work/killed/metrics.jsonl") -ge 45 ]] && break; sleep 0.05; done
kill -9 $b_pid
for _ in $(seq 1 100); do grep -q "node 'gpu-b' is lost" "$work/killed.log" && break; sleep 0.1; done
check grep -q "node 'gpu-b' is lost" "$work/killed.log"
member gpu-b "$work/kb2.log"; b2_pid=$m_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/killed.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b2_pid || rc=$?; check test "$rc" = 0
check grep -q "node 'gpu-b' joined the run again" "$work/killed.log"
sk=$(summary "$work/killed/metrics.jsonl"); echo "drafter node killed: $sk"
check test "$(field "$sk" failed)" = 1
check test "$(field "$sk" restarted)" = 1
check "$python" -c 'import json,sys; f=[j for j in map(json.loads, open(sys.argv[1])) if j["event"] == "drafter_failed"]; assert f[0]["restore_from"] == "checkpoint" and "its node was lost" in f[0]["reason"], f' "$work/killed/metrics.jsonl"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$sk"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/killed/metrics.jsonl" "$steps4"

# 5d. A spare (placement.spares = gpu-c:cpu): the drafter node SIGKILLed and
# never started again; the drafter starts on the spare at once, from the
# newest checkpoint (one file system here), and the run ends exact with
# every loss bit-equal.
lead spare --set placement.spares=gpu-c:cpu
member gpu-a "$work/sa.log"; a_pid=$m_pid
member gpu-b "$work/sb.log"; b_pid=$m_pid
member gpu-c "$work/sc.log"; c_pid=$m_pid
for _ in $(seq 1 400); do [[ $(steps_in "$work/spare/metrics.jsonl") -ge 45 ]] && break; sleep 0.05; done
kill -9 $b_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/spare.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $c_pid || rc=$?; check test "$rc" = 0
check grep -q "drafter 0 of node 'gpu-b' starts on the spare gpu-c:cpu" "$work/spare.log"
check grep -q "drafter 0 starts here, on the spare cpu" "$work/sc.log"
ss=$(summary "$work/spare/metrics.jsonl"); echo "drafter node lost, a spare took over: $ss"
check test "$(field "$ss" failed)" = 1
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$ss"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/spare/metrics.jsonl" "$steps4"
# Checkpoints before the takeover are gpu-b's, those after it gpu-c's (the
# node whose file system holds them: what --resume and the shell look at).
check "$python" -c '
import json, sys
ev = [j for j in map(json.loads, open(sys.argv[1])) if j["event"] in ("checkpoint", "drafter_restarted")]
up = next(i for i, j in enumerate(ev) if j["event"] == "drafter_restarted")
before = {j["node"] for j in ev[:up] if j["event"] == "checkpoint"}
after = {j["node"] for j in ev[up + 1:] if j["event"] == "checkpoint"}
assert before <= {"gpu-b"} and after == {"gpu-c"}, (before, after)' "$work/spare/metrics.jsonl"

# 4b. The leader SIGKILLed mid-run (its members exit 1), then `tandem run
# --resume` with the same nodes: it picks up from the newest checkpoint (on
# the drafter node's file system: here the same machine) and ends with an
# exact ledger and the one-process run's losses.  A newest checkpoint that
# metrics.jsonl places on a member and this machine cannot read is named,
# node and path, and nothing starts (exit 2).
lead lkilled --set supervision.worker_restarts=0
member gpu-a "$work/lka.log"; a_pid=$m_pid
member gpu-b "$work/lkb.log"; b_pid=$m_pid
for _ in $(seq 1 400); do [[ $(steps_in "$work/lkilled/metrics.jsonl") -ge 45 ]] && break; sleep 0.05; done
kill -9 $l_pid
rc=0; wait $a_pid || rc=$?; check test "$rc" = 1
rc=0; wait $b_pid || rc=$?; check test "$rc" = 1
check grep -q '"node":"gpu-b"' "$work/lkilled/metrics.jsonl"  # where each checkpoint lives
# (The new leader replaces the killed one's cluster.json; removed here so
# that port_of cannot read the stale port before the new leader starts.)
mv "$work/lkilled.log" "$work/lkilled-1.log"; rm "$work/lkilled/cluster.json"
lead lkilled --resume
member gpu-a "$work/lka2.log"; a_pid=$m_pid
member gpu-b "$work/lkb2.log"; b_pid=$m_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/lkilled.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0
check grep -q "resuming from $work/lkilled/checkpoints/step-" "$work/lkilled.log"
sl=$(summary "$work/lkilled/metrics.jsonl"); echo "leader killed, resumed: $sl"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$sl"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/lkilled/metrics.jsonl" "$steps4"
echo '{"event":"checkpoint","step":9999,"dir":"/nonexistent/step-00009999","node":"gpu-b"}' >> "$work/lkilled/metrics.jsonl"
rc=0; "$tandem" run "$work/run.toml" --set run.output_dir="$work/lkilled" --set data.epochs=4 --resume \
  --listen 127.0.0.1:0 "${split[@]}" > "$work/lmissing.log" 2>&1 || rc=$?
check test "$rc" = 2
check grep -q "step 9999, was written on node 'gpu-b' at /nonexistent/step-00009999, which this machine cannot read" "$work/lmissing.log"

# 5b. The target node SIGKILLed mid-run and started again: its target and
# prefetch are restarted on it (stateless), the batches in flight issued
# again; the drafter keeps its state (no rollback) and the losses are the
# one-process run's.
lead tkilled
member gpu-a "$work/ta.log"; a_pid=$m_pid
member gpu-b "$work/tb.log"; b_pid=$m_pid
for _ in $(seq 1 400); do [[ $(steps_in "$work/tkilled/metrics.jsonl") -ge 45 ]] && break; sleep 0.05; done
# The shell's tree names each actor's node.
"$tandem" shell "$work/tkilled" -c tree > "$work/tree.txt" 2>&1 || true
kill -9 $a_pid
check grep -qE "^target 0 +gpu-a:cpu" "$work/tree.txt"
check grep -qE "^drafter 0 +gpu-b:cpu" "$work/tree.txt"
check grep -qE "^coordinator 0 +leader:cpu" "$work/tree.txt"
for _ in $(seq 1 100); do grep -q "node 'gpu-a' is lost" "$work/tkilled.log" && break; sleep 0.1; done
check grep -q "node 'gpu-a' is lost" "$work/tkilled.log"
member gpu-a "$work/ta2.log"; a2_pid=$m_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/tkilled.log"
rc=0; wait $a2_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0
st=$(summary "$work/tkilled/metrics.jsonl"); echo "target node killed: $st"
check test "$(field "$st" failed)" = 0
check "$python" -c 'import json,sys; e=[j for j in map(json.loads, open(sys.argv[1]))]; f=sorted(j["role"] for j in e if j["event"] == "actor_failed"); r=[j for j in e if j["event"] == "actor_restarted"]; q=[j for j in e if j["event"] == "reissued"]; assert f == ["prefetch", "target"] and len(r) == 2 and len(q) >= 1, (f, r, q)' "$work/tkilled/metrics.jsonl"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$st"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/tkilled/metrics.jsonl" "$steps4"

# 5c. The target node aborts by an injected fault on its 40th batch: once
# started again it does not fire again (faults fire once per run, recorded
# beside the run's outputs), and the run ends exact.
lead tabort --fault target=0,kind=abort,at_step=40
member gpu-a "$work/tba.log"; a_pid=$m_pid
member gpu-b "$work/tbb.log"; b_pid=$m_pid
rc=0; wait $a_pid || rc=$?; check test "$rc" = 134
member gpu-a "$work/tba2.log"; a2_pid=$m_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/tabort.log"
rc=0; wait $a2_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0
check test -s "$work/tabort/faults-fired-gpu-a"
sa=$(summary "$work/tabort/metrics.jsonl"); echo "target node aborted: $sa"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$sa"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/tabort/metrics.jsonl" "$steps4"

# 6. The drafter node frozen (SIGSTOP) past cluster.timeout_s: the leader
# declares it lost; woken (SIGCONT), it finds its connection closed and
# exits 1 — fenced, never merged back — and a fresh gpu-b finishes the run
# with the same losses.
lead frozen
member gpu-a "$work/fa.log"; a_pid=$m_pid
member gpu-b "$work/fb.log"; b_pid=$m_pid
for _ in $(seq 1 400); do [[ $(steps_in "$work/frozen/metrics.jsonl") -ge 45 ]] && break; sleep 0.05; done
kill -STOP $b_pid
t0=$(date +%s)
for _ in $(seq 1 150); do grep -q "node 'gpu-b' is lost" "$work/frozen.log" && break; sleep 0.1; done
took=$(( $(date +%s) - t0 )); echo "frozen node declared lost after ${took} s (cluster.timeout_s = 3)"
check grep -q "node 'gpu-b' is lost" "$work/frozen.log"
check test "$took" -le 8
kill -CONT $b_pid
rc=0; wait $b_pid || rc=$?; check test "$rc" = 1
check grep -q "the leader at 127.0.0.1:$port is gone" "$work/fb.log"
member gpu-b "$work/fb2.log"; b2_pid=$m_pid
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/frozen.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b2_pid || rc=$?; check test "$rc" = 0
sf=$(summary "$work/frozen/metrics.jsonl"); echo "drafter node frozen: $sf"
check "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64, '2': 64, '3': 64}, s" "$sf"
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/frozen/metrics.jsonl" "$steps4"

# 7. TLS between nodes (cluster.certs, --certs): the nodes of the cluster's
# CA join and train (20 steps, bit-equal); a certificate of another CA, and
# a member without TLS, never reach the hello (they stop after three failed
# handshakes past the gate, exit 2, saying why).
"$tandem" certs "$work/tls" --nodes leader,gpu-a,gpu-b > /dev/null
"$tandem" certs "$work/other" --nodes gpu-b > /dev/null
lead tls --set train.max_steps=20 --set cluster.certs="$work/tls/leader" --set cluster.secret="$work/tls/cluster.secret"
check grep -q "over TLS" "$work/tls.log"
# (With this cluster's join token, so the gate lets them through to TLS.)
rc=0; "$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu --certs "$work/other/gpu-b" \
  --token-file "$work/tls/gpu-b/join.token" --wait-s 3 > "$work/tls-other.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "but the TLS handshake failed 3 times" "$work/tls-other.log"
rc=0; "$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu --token-file "$work/tls/gpu-b/join.token" \
  --wait-s 3 > "$work/tls-plain.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "the leader speaks TLS (cluster.certs); pass --certs" "$work/tls-plain.log"
# Another cluster's token is stopped at the gate.
rc=0; "$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu --certs "$work/other/gpu-b" \
  --token-file "$work/other/gpu-b/join.token" --wait-s 3 > "$work/tls-token.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "refused this node: a wrong join token" "$work/tls-token.log"
check test "$(grep -c "said hello" "$work/tls.log")" = 0
"$tandem" node --join "127.0.0.1:$port" --name gpu-a --devices cpu "${node_fast[@]}" --certs "$work/tls/gpu-a" \
  --token-file "$work/tls/gpu-a/join.token" > "$work/tls-a.log" 2>&1 &
a_pid=$!; pids+=($a_pid)
"$tandem" node --join "127.0.0.1:$port" --name gpu-b --devices cpu "${node_fast[@]}" --certs "$work/tls/gpu-b" \
  --token-file "$work/tls/gpu-b/join.token" > "$work/tls-b.log" 2>&1 &
b_pid=$!; pids+=($b_pid)
rc=0; wait $l_pid || rc=$?; check test "$rc" = 0 || tail -20 "$work/tls.log"
rc=0; wait $a_pid || rc=$?; check test "$rc" = 0
rc=0; wait $b_pid || rc=$?; check test "$rc" = 0
check "$python" "$here/compare_losses.py" "$work/one4/metrics.jsonl" "$work/tls/metrics.jsonl" 20
# Off loopback with certs but without a secret: refused (TLS checks the CA, the token the name).
rc=0; "$tandem" run "$work/run.toml" --set run.output_dir="$work/nosecret" --listen 0.0.0.0:47393 "${split[@]}" \
  --set cluster.certs="$work/tls/leader" > "$work/nosecret.log" 2>&1 || rc=$?
check test "$rc" = 2; check grep -q "'cluster.certs' needs 'cluster.secret' too" "$work/nosecret.log"

echo "cluster: $passed checks passed, $failed failed"
[[ $failed -eq 0 ]]
