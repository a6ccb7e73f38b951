#!/usr/bin/env python3
"""The control endpoint and `tandem shell` against a real `tandem run` (issue 17).

    control_test.py TANDEM PYTHON FIXTURES

The tiny run of run_test.toml on the CPU (long enough to be watched), then:

- control.json: mode 0600, the address and a 64-hex-digit token;
- no token, a wrong one -> 401, counted in /v1/status;
- bad input, the run unharmed: malformed HTTP -> 400, a 16 KiB header -> 431,
  a 128 KiB body -> 413, a body that is not JSON -> 400, an unknown path or
  actor -> 404 (an actor named with what the run has, `show` exiting 2), a
  wrong method -> 405;
- reads: /v1/tree (every actor of the plan, the drafter's state and steps;
  every actor's vitals: thread, messages, last message, the target's forward
  times, the prefetch's cursor and padding),
  /v1/steps (the same losses as metrics.jsonl's step lines), /v1/ledger,
  /v1/events, /v1/config (the effective config), `tandem shell -c` and
  `--json` with the same answers;
- pause: no step for 2 s; resume: steps again; checkpoint: a checkpoint
  event and folder; stop: exit 0, a final checkpoint, control.json gone;
  every action a "control" event in metrics.jsonl naming its source;
- the loss of every step equals an undisturbed run's (same steps, bit for bit);
- `control.listen` off loopback is refused at start without TLS (exit 2, naming the
  field); with a certificate (a CA made by the openssl CLI) it serves HTTPS on all
  addresses: verified clients (Python's ssl, `tandem shell --ca`) get answers, plain HTTP
  and a shell without the CA do not.

~40 s on 2 cores.
"""
import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
import urllib.error

from control_lib import Checks, lines, tiny_run_folder

tandem, python, fixtures = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
work = tiny_run_folder(python, fixtures, "tandem-control-")
check = Checks()



common = ["--set", "data.epochs=100", "--set", "train.max_steps=2000", "--set", "checkpoint.every_steps=0",
          "--set", "checkpoint.host_every=0"]


def start(name, *extra):
    out = os.path.join(work, name)
    log = open(out + ".log", "w")
    p = subprocess.Popen([tandem, "run", os.path.join(work, "run.toml"), "--set", f"run.output_dir={out}", *common,
                          *extra], stdout=log, stderr=subprocess.STDOUT, cwd=work)
    return p, out


# Refused at start: off loopback without TLS.
r = subprocess.run([tandem, "run", os.path.join(work, "run.toml"), "--set", "control.listen=0.0.0.0:0",
                    "--set", f"run.output_dir={work}/refused"], capture_output=True, text=True)
check(r.returncode == 2 and "control.listen" in r.stderr and "loopback" in r.stderr,
      f"control.listen off loopback refused (exit {r.returncode}): {r.stderr[-300:]}")
r = subprocess.run([tandem, "run", os.path.join(work, "run.toml"), "--set", "control.listen=127.0.0.1:http",
                    "--set", f"run.output_dir={work}/refused"], capture_output=True, text=True)
check(r.returncode == 2 and "control.listen" in r.stderr, f"a bad control.listen refused: {r.stderr[-300:]}")

proc, run_dir = start("run")
control_file = os.path.join(run_dir, "control.json")
metrics = os.path.join(run_dir, "metrics.jsonl")
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(control_file) and len(lines(metrics, "step")) >= 5):
    if proc.poll() is not None:
        break
    time.sleep(0.2)
if not os.path.exists(control_file):
    print(open(run_dir + ".log").read()[-2000:])
    sys.exit("FAILED: no control.json")
ctl = json.load(open(control_file))
mode = stat.S_IMODE(os.stat(control_file).st_mode)
check(mode == 0o600, f"control.json mode {oct(mode)}")
check(len(ctl["token"]) == 64 and all(c in "0123456789abcdef" for c in ctl["token"]), "a 64-hex-digit token")
base = ctl["url"]


def http(method, path, body=None, token=ctl["token"], headers=None):
    req = urllib.request.Request(base + path, method=method, data=body)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=15) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def raw(data):
    """Sends bytes as they are; the status code of the answer (0: none)."""
    s = socket.create_connection((ctl["host"], ctl["port"]), timeout=15)
    s.sendall(data)
    got = b""
    try:
        while b"\r\n" not in got:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    finally:
        s.close()
    parts = got.split(b" ")
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0


# Authentication.
check(http("GET", "/v1/status", token=None)[0] == 401, "no token: 401")
check(http("GET", "/v1/status", token="0" * 64)[0] == 401, "a wrong token: 401")
check(http("GET", "/v1/status", token=ctl["token"][:-1])[0] == 401, "a token one digit short: 401")
code, status = http("GET", "/v1/status")
check(code == 200 and status["unauthorized"] == 3, f"the refused requests are counted: {status}")

# Bad input.
auth = f"Authorization: Bearer {ctl['token']}\r\n".encode()
check(raw(b"GARBAGE\r\n\r\n") == 400, "malformed HTTP: 400")
check(raw(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n" + auth + b"X-Big: " + b"a" * 16384 + b"\r\n\r\n") == 431,
      "a 16 KiB header: 431")
check(raw(b"POST /v1/pause HTTP/1.1\r\nHost: x\r\n" + auth + b"Content-Length: 131072\r\n\r\n" + b"{" * 131072)
      == 413, "a 128 KiB body: 413")
check(http("POST", "/v1/pause", body=b"{not json")[0] == 400, "a body that is not JSON: 400")
check(http("GET", "/v1/nothing")[0] == 404, "an unknown path: 404")
check(http("GET", "/v1/actors/drafter/7")[0] == 404, "an unknown actor: 404")
check(http("GET", "/v1/actors/drafter/x")[0] == 400, "a bad actor index: 400")
code, body = http("GET", "/v1/actors/drafter/-1")
check(code == 404 and body.get("error", "").startswith("no drafter -1: the only drafter is 0"),
      f"a negative index is named with the run's drafters: {code} {body}")
check(http("GET", "/v1/pause")[0] == 405, "GET of an action: 405")
check(http("POST", "/v1/tree")[0] == 405, "POST of a read: 405")
check(http("DELETE", "/v1/tree")[0] == 405, "DELETE: 405")
check(http("GET", "/v1/steps?n=abc")[0] == 400, "a bad query: 400")

# Reads.
code, tree = http("GET", "/v1/tree")
roles = sorted((a["role"], a["index"]) for a in tree["actors"])
check(code == 200 and ("drafter", 0) in roles and ("target", 0) in roles and ("prefetch", 0) in roles
      and ("coordinator", 0) in roles, f"the tree lists the plan's actors: {roles}")
drafter = [a for a in tree["actors"] if a["role"] == "drafter"][0]
check(drafter["state"] in ("idle", "stepping") and drafter["steps_handled"] >= 5 and drafter["device"] == "cpu",
      f"the drafter's row: {drafter}")
# Every actor's vitals: its thread, messages handled, the last one, its figures.
rows = {(a["role"], a["index"]): a for a in tree["actors"]}
missing = [k for k, a in rows.items() if "messages_handled" not in a]
check(not missing, f"every actor answered with its vitals: {missing} did not")
# (The question counts; an actor asked nothing else yet has no last message.)
odd = [(k, a) for k, a in rows.items() if not (a.get("messages_handled", 0) >= 1 and a.get("thread", 0) > 0
       and a.get("uptime_s", -1) >= 0 and (a.get("messages_handled", 0) == 1 or a.get("last_message")))]
check(not odd, f"vitals: messages, thread, uptime, last message: {odd}")
check(rows[("drafter", 0)]["own_thread"] and rows[("target", 0)]["own_thread"] and rows[("prefetch", 0)]["own_thread"]
      and not rows[("coordinator", 0)]["own_thread"], "GPU actors on threads of their own, the coordinator pooled")
check(len({rows[k]["thread"] for k in (("drafter", 0), ("target", 0), ("prefetch", 0))}) == 3,
      "drafter, target and prefetch on three different threads")
# (Its own step, of the same answer: the tree's steps_handled is the control
# actor's count when the slowest actor answered, a few steps later.)
d0 = rows[("drafter", 0)]
check(d0["figures"]["step"] >= 1 and d0["messages_handled"] > d0["figures"]["step"],
      f"the drafter handled a work item per step and more: {d0['messages_handled']} for step {d0['figures']['step']}")
tf = rows[("target", 0)]["figures"]
check(tf["batches"] >= drafter["steps_handled"] and tf["forward_ms_mean"] > 0 and tf["queue_depth"] >= 0,
      f"the target's figures: {tf}")
pf = rows[("prefetch", 0)]["figures"]
check(pf["epoch_samples"] == 64 and 0 <= pf["epoch_sent"] <= 64 and 0 <= pf["padding_waste"] < 1
      and pf["tokens_per_s"] > 0, f"the prefetch's figures: {pf}")
code, detail = http("GET", "/v1/actors/target/0")
check(code == 200 and detail["figures"]["batches"] >= tf["batches"], "target 0 in detail: its figures")
code, detail = http("GET", "/v1/actors/drafter/0")
check(code == 200 and "last_report" in detail and sum(b["count"] for b in detail["step_ms_histogram"])
      == detail["steps_handled"], "drafter 0 in detail: last report, a histogram of every step")
code, steps = http("GET", "/v1/steps?n=5")
check(code == 200 and len(steps["steps"]) == 5, "the last 5 steps")
logged = {l["step"]: l["loss"] for l in lines(metrics, "step")}
check(all(logged.get(s["step"]) == s["loss"] for s in steps["steps"] if s["step"] in logged)
      and any(s["step"] in logged for s in steps["steps"]), "the steps' losses equal metrics.jsonl's")
code, ledger = http("GET", "/v1/ledger")
check(code == 200 and set(ledger["samples"]) == {"pending", "issued", "trained", "committed"}
      and sum(ledger["samples"].values()) == 64, f"the ledger covers the epoch's 64 samples: {ledger}")
cursor = ledger["prefetch"][0] if ledger.get("prefetch") else {}
# (The run moves on between the coordinator's answer and the prefetch's: an
# epoch of 64 samples is short, so only the cursor's bounds are exact.)
check(cursor.get("index") == 0 and cursor.get("epoch_samples") == 64 and 0 <= cursor.get("epoch_sent", -1) <= 64
      and cursor.get("epoch", -1) >= ledger["epoch"], f"the ledger's prefetch cursor: {cursor}")
code, cfg = http("GET", "/v1/config")
check(code == 200 and "max_steps = 2000" in cfg["toml"], "the effective config")
code, events = http("GET", "/v1/events")
check(code == 200 and events["events"] and events["events"][0]["event"] == "epoch", "the event log")
# events --since SEQ: only the events after SEQ (the run goes on: later ones may come too).
first = events["events"][0]["seq"]
shell = subprocess.run([tandem, "shell", run_dir, "--json", "-c", f"events --since {first}"], capture_output=True,
                       text=True, timeout=30)
after = [json.loads(l)["seq"] for l in shell.stdout.splitlines() if l.strip()]
check(shell.returncode == 0 and all(q > first for q in after)
      and (after[:1] == [first + 1] or len(events["events"]) == 1), f"shell events --since {first}: {after}")
shell = subprocess.run([tandem, "shell", run_dir, "-c", "tree", "-c", "status", "-c", "ledger", "-c", "steps 3",
                        "-c", "show drafter 0", "-c", "top"], capture_output=True, text=True, timeout=60)
check(shell.returncode == 0 and "drafter 0" in shell.stdout and "committed" in shell.stdout,
      f"tandem shell -c: {shell.returncode} {shell.stderr[-300:]}")
shell = subprocess.run([tandem, "shell", run_dir, "--json", "-c", "tree"], capture_output=True, text=True, timeout=30)
check(shell.returncode == 0 and json.loads(shell.stdout)["actors"], "tandem shell --json")
# Every command's --json answer is JSON: the views (top, watch) one object a refresh.
for cmd, key in (("help", "commands"), ("dashboard", "url"), ("top", "actors"), ("watch loss", "drafters")):
    shell = subprocess.run([tandem, "shell", run_dir, "--json", "-c", cmd], capture_output=True, text=True, timeout=30)
    try:
        answer = json.loads(shell.stdout)
    except ValueError:
        answer = {}
    check(shell.returncode == 0 and key in answer, f"tandem shell --json -c {cmd!r}: {shell.stdout[:200]!r}")
shell = subprocess.run([tandem, "shell", run_dir, "-c", "frobnicate"], capture_output=True, text=True, timeout=30)
check(shell.returncode == 2 and "unknown command" in shell.stderr, "an unknown shell command: exit 2")

# Words a command does not take are refused (exit 2), not ignored: "pause now" is no pause.
for line, says in (("pause now", "'now' is more than it takes"), ("steps x", "N is a count of steps"),
                   ("events foo", "'foo' is not -f or --since SEQ"),
                   ("events --since x", "SEQ is an event's number")):
    shell = subprocess.run([tandem, "shell", run_dir, "-c", line], capture_output=True, text=True, timeout=30)
    check(shell.returncode == 2 and says in shell.stderr, f"shell -c '{line}': exit {shell.returncode}, {shell.stderr!r}")
# Actors the run lacks: named with what it has, exit 2 (misuse) whether the shell or the endpoint refuses.
for line, says in (("show drafter -1", "no drafter -1: the only drafter is 0"),
                   ("show drafter 3", "no drafter 3: the only drafter is 0"),
                   ("show drafer 0", "no role 'drafer': the roles are"),
                   ("show drafter x", "INDEX is a whole number, got 'x'")):
    shell = subprocess.run([tandem, "shell", run_dir, "-c", line], capture_output=True, text=True, timeout=30)
    check(shell.returncode == 2 and says in shell.stderr, f"shell -c '{line}': exit {shell.returncode}, {shell.stderr!r}")
# The status shows what `set` changes.
shell = subprocess.run([tandem, "shell", run_dir, "-c", "status"], capture_output=True, text=True, timeout=30)
check(shell.returncode == 0 and "lr-scale 1.0 for the next step; log-every 1" in shell.stdout,
      f"status shows lr-scale and log-every: {shell.stdout!r}")
shell = subprocess.run([tandem, "shell", f"{ctl['host']}:{ctl['port']}", "-c", "status"], capture_output=True,
                       text=True, timeout=30, env={**os.environ, "TANDEM_TOKEN": "f" * 64})
check(shell.returncode == 1 and "wrong token" in shell.stderr, f"HOST:PORT with a wrong TANDEM_TOKEN: {shell.stderr}")

# Pause, resume, checkpoint.
code, ans = http("POST", "/v1/pause")
check(code == 200 and "paused" in ans["result"], f"pause: {ans}")
time.sleep(1.0)  # the step in progress ends
step_a = http("GET", "/v1/status")[1]["coordinator"]["step"]
time.sleep(2.0)
st = http("GET", "/v1/status")[1]["coordinator"]
check(st["step"] == step_a and st["paused"], f"paused: step {step_a} -> {st['step']}")
check(http("GET", "/v1/tree")[1]["actors"][0]["state"] == "paused", "the coordinator's row says paused")
code, ans = http("POST", "/v1/checkpoint", body=b"{}")
check(code == 200 and "checkpoint" in ans["result"], f"checkpoint: {ans}")
# Paused at an epoch's end, the step is in a checkpoint already: nothing to do, no event.
checkpoint_acted = "already" not in ans["result"]
time.sleep(1.0)
cks = lines(metrics, "checkpoint")
check(any(c["step"] == step_a for c in cks) and os.path.isdir(os.path.join(run_dir, "checkpoints",
                                                                           "step-%08d" % step_a)),
      f"a checkpoint of the paused step {step_a}: {cks}")
# Paused for 4 s: top's step rate is 0, not the rate of the steps before the pause.
shell = subprocess.run([tandem, "shell", run_dir, "--json", "-c", "top"], capture_output=True, text=True, timeout=30)
row = [a for a in json.loads(shell.stdout or "{}").get("actors", []) if a.get("name", "").startswith("drafter")]
check(row and row[0].get("steps_per_s") == 0 and row[0].get("last_report_s", 0) > 2,
      f"paused, top's drafter row: {row}")
code, ans = http("POST", "/v1/resume")
check(code == 200 and "resumed" in ans["result"], f"resume: {ans}")
time.sleep(1.5)
check(http("GET", "/v1/status")[1]["coordinator"]["step"] > step_a, "steps again after resume")

# Stop.
stop = subprocess.run([tandem, "shell", run_dir, "-c", "stop"], capture_output=True, text=True, timeout=30)
check(stop.returncode == 0 and "stopping" in stop.stdout, f"stop: {stop.stdout} {stop.stderr}")
rc = proc.wait(timeout=120)
check(rc == 0, f"the stopped run exits 0 (got {rc})")
end = lines(metrics, "end")
last = end[-1]["steps"] if end else -1
check(end and end[-1]["reason"] == "stopped" and end[-1]["durable_step"] == last and not end[-1].get("error"),
      f"the run ended 'stopped' with everything in a checkpoint: {end}")
check(not os.path.exists(control_file), "control.json is removed at the end")
actions = [(c["action"], "tandem-shell" in c["source"] or "Python-urllib" in c["source"])
           for c in lines(metrics, "control")]
check(actions == [("pause", True)] + [("checkpoint", True)] * checkpoint_acted + [("resume", True), ("stop", True)],
      f"every action is a control event naming its source: {actions}")
after = subprocess.run([tandem, "shell", run_dir, "-c", "status"], capture_output=True, text=True, timeout=30)
check(after.returncode == 2 and "control.json" in after.stderr, "the shell after the run: no control.json")

# The same steps undisturbed: the same losses, bit for bit.
ref, ref_dir = start("reference", "--set", f"train.max_steps={last}", "--set", "control.listen=")
check(ref.wait(timeout=300) == 0, "the undisturbed run")
ref_loss = {l["step"]: l["loss"] for l in lines(os.path.join(ref_dir, "metrics.jsonl"), "step")}
run_loss = {l["step"]: l["loss"] for l in lines(metrics, "step")}
check(len(ref_loss) == last and ref_loss == run_loss,
      f"the loss of each of the {last} steps equals the undisturbed run's "
      f"({sum(ref_loss.get(k) != v for k, v in run_loss.items())} differ)")
check(not os.path.exists(os.path.join(ref_dir, "control.json")), "control.listen = \"\": no endpoint")

# TLS: a CA and a certificate for 127.0.0.1 made with the openssl CLI; the
# endpoint on all addresses (allowed only with TLS); clients verify it.
pki = os.path.join(work, "pki")
os.makedirs(pki)
ext = os.path.join(pki, "ext.cnf")
open(ext, "w").write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
for cmd in (["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=tandem test CA"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj",
             "/CN=localhost"],
            ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out",
             "server.pem", "-days", "1", "-extfile", ext]):
    subprocess.run(["openssl", *cmd], cwd=pki, check=True, capture_output=True)
r = subprocess.run([tandem, "run", os.path.join(work, "run.toml"), "--set", "control.listen=0.0.0.0:0",
                    "--set", f"control.tls_cert={pki}/server.pem", "--set", f"run.output_dir={work}/refused"],
                   capture_output=True, text=True)
check(r.returncode == 2 and "control.tls_key" in r.stderr, f"a certificate without its key is refused: {r.stderr[-200:]}")
tls, tls_dir = start("tls", "--set", "control.listen=0.0.0.0:0", "--set", f"control.tls_cert={pki}/server.pem",
                     "--set", f"control.tls_key={pki}/server.key")
tls_file = os.path.join(tls_dir, "control.json")
deadline = time.time() + 60
while time.time() < deadline and not os.path.exists(tls_file) and tls.poll() is None:
    time.sleep(0.2)
if os.path.exists(tls_file):
    import ssl
    t = json.load(open(tls_file))
    check(t["tls"] and t["url"].startswith("https://127.0.0.1:") and t["listen"] == "0.0.0.0", f"control.json: {t}")
    ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.pem"))
    req = urllib.request.Request(t["url"] + "/v1/status", headers={"Authorization": "Bearer " + t["token"]})
    with urllib.request.urlopen(req, context=ctx, timeout=15) as res:
        body = json.loads(res.read())
        check(res.status == 200 and "coordinator" in body, f"HTTPS with the CA: 200 ({res.status})")
    plain_code = 0
    try:
        plain_code = urllib.request.urlopen(t["url"].replace("https", "http") + "/v1/status", timeout=5).status
    except Exception:
        pass
    check(plain_code == 0, "plain HTTP to the TLS endpoint gets no answer")
    sh = subprocess.run([tandem, "shell", tls_dir, "--ca", os.path.join(pki, "ca.pem"), "-c", "status"],
                        capture_output=True, text=True, timeout=30)
    check(sh.returncode == 0 and "step" in sh.stdout, f"tandem shell --ca: {sh.stdout} {sh.stderr}")
    sh = subprocess.run([tandem, "shell", tls_dir, "-c", "status"], capture_output=True, text=True, timeout=30)
    check(sh.returncode == 1 and "--ca" in sh.stderr, f"tandem shell without the CA refuses the endpoint: {sh.stderr}")
    sh = subprocess.run([tandem, "shell", tls_dir, "--ca", os.path.join(pki, "ca.pem"), "-c", "stop"],
                        capture_output=True, text=True, timeout=30)
    check(sh.returncode == 0, "stop over TLS")
else:
    check(False, "the TLS run wrote no control.json: " + open(tls_dir + ".log").read()[-1000:])
check(tls.wait(timeout=120) == 0, "the TLS run ends 0")

print(f"{check.passed} passed, {len(check.failures)} failed")
if not check.failures and not os.environ.get("KEEP_WORK"):
    subprocess.run(["rm", "-rf", work])
sys.exit(1 if check.failures else 0)
