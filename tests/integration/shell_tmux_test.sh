#!/usr/bin/env bash
# `tandem shell` driven as a person would (issue 17): in a tmux pane of 160 x
# 45, against the tiny run on the CPU: typed commands (tree, a completed
# "tr<Tab>"), `top` refreshing and left with q, a fault injected with
# `fault drafter 0 throw` and the restart seen in `tree`, `watch loss` left
# with q, `events -f` left with Ctrl-C, `stop` ending the run with a
# checkpoint (exit 0), the shell saying the run has ended and leaving, and
# the history kept in the file it names.  The pane is read with
# capture-pane.  ~30 s on 2 cores.
set -euo pipefail
tandem="$1"; python="$2"; fixtures="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
command -v tmux > /dev/null || { echo "SKIPPED: no tmux (tools/deps/debian-packages.txt)"; exit 77; }
source "$here/run_lib.sh"
export TANDEM_SHELL_HISTORY="$work/history"
session="tandem-shell-test-$$"
cleanup_tmux() { tmux kill-session -t "$session" 2> /dev/null || true; }
trap 'cleanup_tmux; [[ -n "${KEEP_WORK:-}" ]] || rm -rf "$work"' EXIT

"$tandem" run "$work/run.toml" --set run.output_dir="$work/run" --set data.epochs=100 \
  --set train.max_steps=3000 --set checkpoint.every_steps=0 --set checkpoint.host_every=0 \
  > "$work/run.log" 2>&1 & run_pid=$!
for _ in $(seq 300); do [[ -f "$work/run/control.json" ]] && break; sleep 0.1; done
[[ -f "$work/run/control.json" ]] || { cat "$work/run.log"; fail "no control.json"; }

pane() { tmux capture-pane -p -t "$session"; }
# Waits up to 15 s for the pane to show $1.
wait_for() {
  for _ in $(seq 150); do pane | grep -q -- "$1" && return 0; sleep 0.1; done
  echo "--- pane:"; pane; echo "---"; return 1
}
tmux new-session -d -s "$session" -x 160 -y 45 \
  "env TANDEM_SHELL_HISTORY='$TANDEM_SHELL_HISTORY' '$tandem' shell '$work/run'; echo SHELL-EXIT \$?; sleep 30"
check wait_for "connected to run"
tmux send-keys -t "$session" "tree" Enter
check wait_for "drafter 0 *cpu"
tmux send-keys -t "$session" "tr" Tab Enter   # completion: tr -> tree, a second "tree" in the history
sleep 1
tmux send-keys -t "$session" "top" Enter
check wait_for "tandem top - "
check wait_for "STEPS/S"
s1=$(pane | awk '/tandem top/ {for (i = 1; i <= NF; i++) if ($i == "step") print $(i + 1)}')
sleep 2.5
s2=$(pane | awk '/tandem top/ {for (i = 1; i <= NF; i++) if ($i == "step") print $(i + 1)}')
check test "${s2:-0}" -gt "${s1:-0}"   # it refreshes
tmux send-keys -t "$session" q
check wait_for "tandem>"
# A fault through the shell: the drafter fails, the supervisor restarts it.
tmux send-keys -t "$session" "fault drafter 0 throw" Enter
check wait_for "armed on drafter 0 for its next step"
for _ in $(seq 50); do grep -q '"event":"drafter_restarted"' "$work/run/metrics.jsonl" && break; sleep 0.2; done
tmux send-keys -t "$session" "tree" Enter
check wait_for "incarnation 1"
tmux send-keys -t "$session" "watch loss" Enter
check wait_for "watch loss"
check wait_for "last "
tmux send-keys -t "$session" q
check wait_for "tandem>"
# events -f left with Ctrl-C: the command ends, the shell stays.
tmux send-keys -t "$session" "events -f" Enter
check wait_for "drafter_restarted"
tmux send-keys -t "$session" C-c
tmux send-keys -t "$session" "steps 1" Enter
check wait_for "STEP-MS"
tmux send-keys -t "$session" "stop" Enter
check wait_for "stopping after step"
rc=0; wait "$run_pid" || rc=$?
check test "$rc" = 0
tmux send-keys -t "$session" "status" Enter
check wait_for "the run has ended"
check wait_for "SHELL-EXIT 0"
check test "$(grep -c "^tree" "$TANDEM_SHELL_HISTORY")" = 3   # typed twice, completed once (libedit writes its space as \040)
check grep -qx "stop" "$TANDEM_SHELL_HISTORY"
end=$("$python" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if "\"end\"" in l][-1]["reason"])' \
  "$work/run/metrics.jsonl")
check test "$end" = stopped
echo "shell_tmux: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
