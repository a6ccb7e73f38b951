#!/usr/bin/env python3
"""Prometheus /metrics and TensorBoard event files against a real `tandem run` (issue 17).

    observe_test.py TANDEM PYTHON FIXTURES

The tiny run of run_test.toml on the CPU (log_every 1), paused after 20 steps, then:

- GET /metrics without the token -> 401, counted in tandem_control_unauthorized_total;
- with it: Content-Type text/plain version 0.0.4, parsed by prometheus_client's own text
  parser; the steps, tokens and step-time histogram's count and sum, the last loss,
  accuracy, learning rate and step, the control event of the pause and the coordinator's
  figures equal what metrics.jsonl and /v1/status say;
- resumed, stopped: RUN_DIR/tb/events.out.tfevents.* read by the tensorboard package's
  event reader: the first record's file_version "brain.Event:2", then every logged
  step's scalars (loss, accuracy, lr, sim_accept, ...) equal metrics.jsonl's as float32;
  a byte changed inside the last record makes the reader drop that record (its CRC is
  checked, so the CRCs written are right: an unchanged file reads whole).

~20 s on 2 cores.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from control_lib import Checks, lines, tiny_run_folder

tandem, python, fixtures = sys.argv[1:4]
here = os.path.dirname(os.path.abspath(__file__))
work = tiny_run_folder(python, fixtures, "tandem-observe-")
check = Checks()


def steps(path):
    return lines(path, "step")


run_dir = os.path.join(work, "run")
log = open(run_dir + ".log", "w")
proc = subprocess.Popen([tandem, "run", os.path.join(work, "run.toml"), "--set", f"run.output_dir={run_dir}",
                         "--set", "data.epochs=100", "--set", "train.max_steps=2000",
                         "--set", "checkpoint.every_steps=0", "--set", "checkpoint.host_every=0"],
                        stdout=log, stderr=subprocess.STDOUT, cwd=work)
control_file = os.path.join(run_dir, "control.json")
metrics = os.path.join(run_dir, "metrics.jsonl")
deadline = time.time() + 90
while time.time() < deadline and not (os.path.exists(control_file) and len(steps(metrics)) >= 20):
    if proc.poll() is not None:
        break
    time.sleep(0.2)
if not os.path.exists(control_file) or proc.poll() is not None:
    print(open(run_dir + ".log").read()[-2000:])
    sys.exit("FAILED: the run did not start")
ctl = json.load(open(control_file))


def http(method, path, token=ctl["token"]):
    req = urllib.request.Request(ctl["url"] + path, method=method, data=b"" if method == "POST" else None)
    if token is not None:
        req.add_header("Authorization", "Bearer " + token)
    try:
        with urllib.request.urlopen(req, timeout=15) as res:
            return res.status, res.headers.get("Content-Type", ""), res.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def scrape():
    status, ctype, text = http("GET", "/metrics")
    check(status == 200, f"GET /metrics: {status} {text[:200]}")
    check(ctype.startswith("text/plain; version=0.0.4"), f"/metrics Content-Type {ctype!r}")
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("run", "le"))),
                   s.labels.get("le"))
            samples[key] = s.value
    return samples, text


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items())), None))


# Paused: the steps in progress finish, then nothing moves while we compare.
status, _, _ = http("POST", "/v1/pause")
check(status == 200, f"pause: {status}")
last, still = -1, 0
while still < 10:
    n = len(steps(metrics))
    still = still + 1 if n == last else 0
    last = n
    time.sleep(0.2)

status, _, body = http("GET", "/metrics", token=None)
check(status == 401, f"/metrics without the token: {status}")
status, _, body = http("GET", "/metrics", token="0" * 64)
check(status == 401, f"/metrics with a wrong token: {status}")

samples, text = scrape()
rows = steps(metrics)
d0 = {"drafter": "0"}
check(value(samples, "tandem_steps_total", **d0) == len(rows),
      f"tandem_steps_total {value(samples, 'tandem_steps_total', **d0)} vs {len(rows)} step lines")
check(value(samples, "tandem_tokens_total", **d0) == sum(r["tokens"] for r in rows), "tandem_tokens_total")
check(value(samples, "tandem_scored_tokens_total", **d0) == sum(r["scored_tokens"] for r in rows),
      "tandem_scored_tokens_total")
check(value(samples, "tandem_step_seconds_count", **d0) == len(rows), "tandem_step_seconds_count")
s = value(samples, "tandem_step_seconds_sum", **d0)
want = sum(r["compute_ms"] for r in rows) / 1e3
check(s is not None and abs(s - want) <= 1e-9 * max(1.0, want), f"tandem_step_seconds_sum {s} vs {want}")
check(value(samples, "tandem_data_wait_seconds_count", **d0) == len(rows), "tandem_data_wait_seconds_count")
bucket_inf = samples.get(("tandem_step_seconds_bucket", (("drafter", "0"),), "+Inf"))
check(bucket_inf == len(rows), f"the +Inf bucket {bucket_inf}")
for name, field in (("tandem_loss", "loss"), ("tandem_accuracy", "accuracy"), ("tandem_learning_rate", "lr"),
                    ("tandem_grad_norm", "grad_norm"), ("tandem_sim_accept", "sim_accept"),
                    ("tandem_drafter_step", "step")):
    v = value(samples, name, **d0)
    check(v is not None and abs(v - rows[-1][field]) <= 1e-12 * max(1.0, abs(rows[-1][field])),
          f"{name} {v} vs the last step line's {field} {rows[-1][field]}")
_, _, st = http("GET", "/v1/status")
coord = json.loads(st)["coordinator"]
check(value(samples, "tandem_run", figure="step") == coord["step"], "tandem_run{figure=step} vs /v1/status")
check(value(samples, "tandem_run", figure="paused") == 1, "tandem_run{figure=paused} is 1 while paused")
check(value(samples, "tandem_run", figure="epoch") == coord["epoch"], "tandem_run{figure=epoch}")
check(value(samples, "tandem_events_total", event="control") == 1, "one control event (the pause)")
check(value(samples, "tandem_control_unauthorized_total") == 2, "two refused requests counted")
check("# HELP tandem_loss " in text and "# TYPE tandem_step_seconds histogram" in text, "HELP and TYPE lines")
status, _, _ = http("POST", "/metrics")
check(status == 405, f"POST /metrics: {status}")

# Resume, a few steps more, stop.
http("POST", "/v1/resume")
n0 = len(steps(metrics))
deadline = time.time() + 30
while time.time() < deadline and len(steps(metrics)) < n0 + 5:
    time.sleep(0.2)
http("POST", "/v1/stop")
try:
    code = proc.wait(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    code = None
check(code == 0, f"the run ended with {code}")

# TensorBoard.
rows = steps(metrics)
files = sorted(glob.glob(os.path.join(run_dir, "tb", "events.out.tfevents.*")))
check(len(files) == 1, f"one event file in tb/: {files}")
if files:
    events = list(EventFileLoader(files[0]).Load())
    check(len(events) >= 1 and events[0].file_version == "brain.Event:2",
          f"first record file_version {events[0].file_version if events else None!r}")
    check(len(events) == 1 + len(rows), f"{len(events)} records for {len(rows)} logged steps (+ the version)")
    acc = EventAccumulator(os.path.join(run_dir, "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    for field in ("loss", "accuracy", "lr", "grad_norm", "sim_accept", "compute_ms", "wait_ms", "tokens"):
        tag = "drafter0/" + field
        if tag not in tags:
            check(False, f"scalar {tag} in {tags}")
            continue
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        want = [(r["step"], float(np.float32(r[field]))) for r in rows]
        check(got == want, f"{tag}: {got[:3]}... vs metrics.jsonl {want[:3]}...")
    # A changed byte in the last record's data: the CRC check drops that record.
    bad = os.path.join(work, "bad")
    os.makedirs(bad)
    data = bytearray(open(files[0], "rb").read())
    data[-8] ^= 0x40
    open(os.path.join(bad, os.path.basename(files[0])), "wb").write(bytes(data))
    n_bad = len(list(EventFileLoader(os.path.join(bad, os.path.basename(files[0]))).Load()))
    check(n_bad == len(events) - 1, f"a corrupted last record is dropped: {n_bad} of {len(events)}")

print(f"observe: {check.passed} checks passed, {len(check.failures)} failed")
if check.failures:
    print(open(run_dir + ".log").read()[-1500:])
    sys.exit(1)
shutil.rmtree(work, ignore_errors=True)
