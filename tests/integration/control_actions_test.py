#!/usr/bin/env python3
"""The control endpoint's steering actions against real `tandem run`s (issue 17).

    control_actions_test.py TANDEM PYTHON FIXTURES

Four runs of the tiny run_test.toml on the CPU (two epochs, log_every 1):

- U, undisturbed: the reference losses and learning rates.
- A, steered through `tandem shell -c` while paused at its start: `set lr-scale 0.5 at 25`,
  `fault drafter 0 throw at 35`, then resumed; paused again after step 40 for `set log-every 3`
  and `watch loss`, then resumed. Steps 1..24 are
  bit-equal to U's; from step 25 every lr is exactly half of U's and the losses move off
  U's; the fault ends in a visible restart (drafter_failed naming the injected fault,
  drafter_restarted) and the run completes both epochs with an exact ledger (every sample
  committed once per epoch); after the log_every change only every third step is logged;
  every action is a "control" event naming the shell; /v1/status shows the schedule.
  Bad requests: an unknown fault kind, a drafter that does not exist, a negative or
  missing multiplier, a step already taken, log_every 0 -> 4xx, the run unharmed; through
  the shell each is misuse (exit 2) but the step already taken (409, exit 1). After
  `set log-every 3`, `status` and `config` show it.
- S: only `lr_scale 0.5 at 25` (HTTP), run through.
- B: as S, paused after step 30 (held while a shell attaches), stopped (POST /v1/stop) there
  and resumed with `tandem run --resume`:
  the multiplier travels in the checkpoint, so every step's loss and lr equal S's, bit
  for bit. An interactive `tandem shell --follow` attached to B says the run ended, waits,
  and reconnects to the resumed run.
- W: checkpoints every 20 steps; after the first, `lr_scale 0.5` from the next step and a
  fault that aborts the worker process two steps later. The restarted worker resumes from
  step 20's checkpoint, which lacks the change; RUN_DIR/lr_schedule.json keeps it: the
  steps before the change equal U's bit for bit, the lr of every step from it is half U's.

~50 s on 2 cores.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from control_lib import Checks, lines, tiny_run_folder

tandem, python, fixtures = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
work = tiny_run_folder(python, fixtures, "tandem-actions-")
check = Checks()



def by_step(path):
    return {x["step"]: x for x in lines(path, "step")}




def start(name, *extra):
    out = os.path.join(work, name)
    log = open(out + ".log", "a")
    p = subprocess.Popen([tandem, "run", os.path.join(work, "run.toml"), "--set", f"run.output_dir={out}",
                          "--set", "checkpoint.host_every=0", *extra], stdout=log, stderr=subprocess.STDOUT, cwd=work)
    return p, out


def wait_control(proc, out):
    cf = os.path.join(out, "control.json")
    deadline = time.time() + 60
    while time.time() < deadline and not os.path.exists(cf) and proc.poll() is None:
        time.sleep(0.05)
    if not os.path.exists(cf):
        print(open(out + ".log").read()[-2000:])
        sys.exit(f"FAILED: no {cf}")
    time.sleep(0.05)
    return json.load(open(cf))


def http(ctl, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    req = urllib.request.Request(ctl["url"] + path, method=method, data=data)
    req.add_header("Authorization", "Bearer " + ctl["token"])
    try:
        with urllib.request.urlopen(req, timeout=15) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def shell(out, *cmd):
    r = subprocess.run([tandem, "shell", out, "-c", " ".join(cmd)], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stdout + r.stderr


def finish(proc, what, timeout=180):
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = None
    check(code == 0, f"{what} ended with {code}")


# U: undisturbed.
u, u_dir = start("u")
finish(u, "U")
U = by_step(os.path.join(u_dir, "metrics.jsonl"))
check(len(U) >= 50, f"U logged {len(U)} steps")

# A: steered through the shell.
a, a_dir = start("a")
ctl = wait_control(a, a_dir)
status, body = http(ctl, "POST", "/v1/pause")
check(status == 200, f"A: pause {status} {body}")
rc, text = shell(a_dir, "set", "lr-scale", "0.5", "at", "25")
check(rc == 0 and "from step 25" in text, f"A: set lr-scale: {rc} {text}")
rc, text = shell(a_dir, "fault", "drafter", "0", "throw", "at", "35")
check(rc == 0 and "armed on drafter 0 for step 35" in text, f"A: fault: {rc} {text}")
# Bad requests, each a clear 4xx that changes nothing.
for path, req, want, what in (
        ("/v1/fault", {"drafter": 0, "kind": "explode"}, 400, "an unknown kind"),
        ("/v1/fault", {"drafter": 7, "kind": "throw"}, 404, "a drafter that does not exist"),
        ("/v1/fault", {"drafter": 0, "kind": "cuda_sticky"}, 400, "a CUDA fault for a drafter on the CPU"),
        ("/v1/fault", {"kind": "throw"}, 400, "no drafter"),
        ("/v1/fault", {"drafter": -1, "kind": "throw"}, 400, "a negative drafter"),
        ("/v1/lr_scale", {"value": -1}, 400, "a negative multiplier"),
        ("/v1/lr_scale", {}, 400, "no value"),
        ("/v1/lr_scale", {"value": "half"}, 400, "a value that is not a number"),
        ("/v1/log_every", {"value": 0}, 400, "log_every 0"),
        ("/v1/log_every", {"value": 2.5}, 400, "log_every 2.5")):
    status, body = http(ctl, "POST", path, req)
    check(status == want and "error" in body, f"A: {what}: {status} (want {want}) {body}")
# Misuse exits 2 whether the shell or the endpoint (400, 404) refuses it.
rc, text = shell(a_dir, "fault", "drafter", "0", "explode")
check(rc == 2 and "kind" in text, f"A: shell fault with a bad kind is misuse: {rc} {text}")
rc, text = shell(a_dir, "fault", "drafter", "7", "throw")
check(rc == 2 and "no drafter 7: the only drafter is 0" in text, f"A: shell fault on a drafter the run lacks is misuse: {rc} {text}")
rc, text = shell(a_dir, "set", "lr-scale", "oops")
check(rc == 2, f"A: shell set with a bad value is misuse: {rc} {text}")
rc, text = shell(a_dir, "set", "lr-scale", "0")
check(rc == 2 and "positive multiplier" in text, f"A: shell set lr-scale 0 (the endpoint's 400) is misuse: {rc} {text}")
status, body = http(ctl, "GET", "/v1/status")
check(body.get("coordinator", {}).get("lr_changes") == [{"from_step": 25, "scale": 0.5}],
      f"A: status lr_changes {body.get('coordinator', {}).get('lr_changes')}")
status, body = http(ctl, "POST", "/v1/resume")
check(status == 200, f"A: resume {status}")
a_metrics = os.path.join(a_dir, "metrics.jsonl")
deadline = time.time() + 120
while time.time() < deadline and max(by_step(a_metrics) or [0]) < 40 and a.poll() is None:
    time.sleep(0.05)
http(ctl, "POST", "/v1/pause")  # the tiny run is quick: held while the shell looks
status, body = http(ctl, "POST", "/v1/lr_scale", {"value": 2, "at_step": 1})
check(status == 409 and "error" in body, f"A: a step already taken: {status} (want 409) {body}")
rc, text = shell(a_dir, "set", "lr-scale", "2", "at", "1")
check(rc == 1 and "done or under way" in text, f"A: shell set at a step taken (409) fails, exit 1: {rc} {text}")
rc, text = shell(a_dir, "set", "log-every", "3")
check(rc == 0 and "every 3 steps" in text, f"A: set log-every: {rc} {text}")
rc, text = shell(a_dir, "status")
check(rc == 0 and "lr-scale 0.5 for the next step (0.5 from step 25); log-every 3" in text,
      f"A: status shows the multiplier and log-every 3: {rc} {text}")
rc, text = shell(a_dir, "config")
check(rc == 0 and "log_every = 3  # set while running (at the start: 1)" in text,
      f"A: config shows log-every 3: {rc} {text[-300:]}")
rc, text = shell(a_dir, "watch", "loss")
check(rc == 0 and "drafter 0" in text and "last" in text, f"A: watch loss: {rc} {text}")
http(ctl, "POST", "/v1/resume")
finish(a, "A")
A = by_step(a_metrics)
early = [s for s in range(1, 25) if s in U]
check(early and all(A.get(s, {}).get("loss") == U[s]["loss"] and A[s]["lr"] == U[s]["lr"] for s in early),
      "A: steps 1..24 bit-equal to U")
late = [s for s in sorted(A) if s >= 25 and s in U]
check(late and all(A[s]["lr"] == U[s]["lr"] * 0.5 for s in late),
      f"A: lr halved from step 25: {[(s, A[s]['lr'], U[s]['lr']) for s in late[:3]]}")
check(any(A[s]["loss"] != U[s]["loss"] for s in late if s > 25), "A: the losses move off U's after step 25")
failed = lines(a_metrics, "drafter_failed")
check(len(failed) == 1 and "injected fault" in failed[0].get("reason", ""), f"A: one injected failure: {failed}")
check(len(lines(a_metrics, "drafter_restarted")) == 1, "A: one restart")
summary = json.loads(subprocess.run([python, os.path.join(here, "run_summary.py"), a_metrics], capture_output=True,
                                    text=True, check=True).stdout)
check(summary["committed_per_epoch"] == {"0": 64, "1": 64} and summary["end"] == "epochs",
      f"A: exact ledger: {summary}")
controls = lines(a_metrics, "control")
check([c["action"] for c in controls] == ["pause", "lr_scale", "fault", "resume", "pause", "log_every", "resume"],
      f"A: control events {[c['action'] for c in controls]}")
check(all("tandem-shell" in c["source"] or "Python-urllib" in c["source"] for c in controls),
      f"A: each names its source: {[c['source'] for c in controls]}")
log_change = [c["step"] for c in controls if c["action"] == "log_every"]
if log_change:
    after = [s for s in A if s > log_change[0] + 3]
    check(after and all(s % 3 == 0 for s in after), f"A: every third step logged after log_every 3: {after[:8]}")

# S: the multiplier alone, through; B: stopped after step 30 and resumed.
s_proc, s_dir = start("s")
ctl = wait_control(s_proc, s_dir)
http(ctl, "POST", "/v1/pause")
status, body = http(ctl, "POST", "/v1/lr_scale", {"value": 0.5, "at_step": 25})
check(status == 200, f"S: lr_scale {status} {body}")
http(ctl, "POST", "/v1/resume")
finish(s_proc, "S")
S = by_step(os.path.join(s_dir, "metrics.jsonl"))

b, b_dir = start("b")
ctl = wait_control(b, b_dir)
http(ctl, "POST", "/v1/pause")
http(ctl, "POST", "/v1/lr_scale", {"value": 0.5, "at_step": 25})
http(ctl, "POST", "/v1/resume")
b_metrics = os.path.join(b_dir, "metrics.jsonl")
deadline = time.time() + 120
while time.time() < deadline and max(by_step(b_metrics) or [0]) < 30 and b.poll() is None:
    time.sleep(0.02)
# Held where it is until the stop: the tiny run is quick, and left running while the shell
# below starts and connects it could train every step first (then the stop finds nothing
# left, the resumed run has no step to train and ends before its control.json is read).
status, body = http(ctl, "POST", "/v1/pause")
check(status == 200, f"B: pause after step 30: {status} {body}")
# An interactive shell with --follow outlives the stop and reconnects to the resumed run.
follower = subprocess.Popen([tandem, "shell", b_dir, "--follow"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
said = []
threading.Thread(target=lambda: [said.append(line) for line in follower.stdout], daemon=True).start()


def follower_says(text, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(text in line for line in said):
            return True
        time.sleep(0.1)
    return False


check(follower_says("connected to run"), f"B: the --follow shell connected: {said}")
status, body = http(ctl, "POST", "/v1/stop")
check(status == 200, f"B: stop {status} {body}")
finish(b, "B (stopped)")
stopped_at = max(by_step(b_metrics) or [0])
# A stop before the last step, or the resume below would have nothing to show.
check(30 <= stopped_at < max(S), f"B: stopped at step {stopped_at}, within 30..{max(S) - 1}")
follower.stdin.write("status\n")
follower.stdin.flush()
check(follower_says("waiting for the run to come back"), f"B: the shell waits: {said}")
b2, _ = start("b", "--resume")
ctl2 = wait_control(b2, b_dir)
http(ctl2, "POST", "/v1/pause")  # held until the shell is back (pause and resume change no step)
check(follower_says("reconnected to run"), f"B: the shell reconnected to the resumed run: {said}")
http(ctl2, "POST", "/v1/resume")
follower.stdin.write("quit\n")
follower.stdin.flush()
try:
    check(follower.wait(timeout=30) == 0, "B: the --follow shell left on quit")
except subprocess.TimeoutExpired:
    follower.kill()
    check(False, "B: the --follow shell did not leave on quit")
finish(b2, "B (resumed)")
B = by_step(b_metrics)
check(any(x.get("event") == "resumed" for x in lines(b_metrics)) or "resuming" in open(b_dir + ".log").read(),
      "B: resumed from its checkpoint")
check(set(B) == set(S), f"B: the same steps as S ({len(B)} vs {len(S)}; stopped at {stopped_at})")
diff = [s for s in S if s in B and (B[s]["loss"] != S[s]["loss"] or B[s]["lr"] != S[s]["lr"])]
check(not diff, f"B (stopped at {stopped_at}, resumed) bit-equal to S: differing steps {diff[:5]}")

# W: a change made after the newest checkpoint survives a worker restart
# (the schedule is kept in lr_schedule.json; the checkpoint of step 20 lacks it).
w, w_dir = start("w", "--set", "checkpoint.every_steps=20")
ctl = wait_control(w, w_dir)
w_metrics = os.path.join(w_dir, "metrics.jsonl")
deadline = time.time() + 120
while time.time() < deadline and not lines(w_metrics, "checkpoint") and w.poll() is None:
    time.sleep(0.01)
http(ctl, "POST", "/v1/pause")
status, body = http(ctl, "POST", "/v1/lr_scale", {"value": 0.5})
frm = int(body.get("result", "from step 0").rsplit(" ", 1)[-1]) if status == 200 else 0
check(status == 200 and 20 < frm < 40, f"W: lr_scale after the checkpoint of step 20: {status} {body}")
status, body = http(ctl, "POST", "/v1/fault", {"drafter": 0, "kind": "abort", "at_step": frm + 2})
check(status == 200, f"W: fault abort {status} {body}")
kept_file = os.path.join(w_dir, "lr_schedule.json")
deadline = time.time() + 10
while time.time() < deadline and not os.path.exists(kept_file):
    time.sleep(0.02)
kept = json.load(open(kept_file)) if os.path.exists(kept_file) else {}
check(kept.get("lr_scale") == [[frm, 0.5]], f"W: the schedule kept beside metrics.jsonl: {kept}")
http(ctl, "POST", "/v1/resume")
finish(w, "W (a worker restart)")
W = by_step(w_metrics)
check(len(lines(w_metrics, "worker_restarted")) == 1, "W: the worker was restarted once")
check(set(W) == set(U), f"W: the same steps as U ({len(W)} vs {len(U)})")
check(all(W[s]["lr"] == U[s]["lr"] and W[s]["loss"] == U[s]["loss"] for s in W if s < frm),
      f"W: before step {frm} bit-equal to U")
late = [(s, W[s]["lr"], U[s]["lr"]) for s in sorted(W) if s >= frm]
check(late and all(lw == lu * 0.5 for _, lw, lu in late), f"W: from step {frm} the lr is half U's: {late[:3]}")

print(f"control actions: {check.passed} checks passed, {len(check.failures)} failed")
if check.failures:
    for name in ("a", "b", "w"):
        print(f"--- {name}.log"); print(open(os.path.join(work, name + ".log")).read()[-1500:])
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
