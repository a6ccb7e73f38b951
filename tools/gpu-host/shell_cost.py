#!/usr/bin/env python3
"""The control endpoint's cost on the step time (issue 17), with the shell attached.

    python tools/gpu-host/shell_cost.py --tandem build/bin/tandem --config W/run.toml
        --run-dir W/shell [--phase-s 20] [--phases 8] [--poll-ms 100] [--out DIR]
        [--set KEY=VALUE]...

Starts `tandem run CONFIG` (its own process group, --set run.output_dir=RUN_DIR), waits for
RUN_DIR/control.json and 10 steps (graph capture and warm-up), then alternates phases of
--phase-s seconds: even phases with no client, odd ones with a client that polls the
endpoint every --poll-ms ms as a dashboard would (GET /v1/status, /v1/tree and
/v1/steps?n=10 in turn). A phase's steps are those reported between the coordinator's step
at its start and at its end (read from /v1/status); its step time is the mean interval of
the step reports' `time_s` over the phase and, beside it, the median of compute_ms + wait_ms.
In the middle of the first polled phase it saves `tandem shell RUN_DIR -c top` (and tree,
ledger, show drafter 0, graphs) into --out. At the end `tandem shell RUN_DIR -c stop` ends the run
(checkpoint, exit 0), and one JSON line reports the phases, the means with and without the
client, and their difference as a percentage of the step.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def get(ep, path, timeout=10):
    req = urllib.request.Request(ep["url"] + path, headers={"Authorization": "Bearer " + ep["token"]})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def steps_of(path):
    rows = []
    with open(path) as f:
        for line in f:
            try:
                x = json.loads(line)
            except json.JSONDecodeError:
                continue
            if x.get("event") == "step":
                rows.append(x)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tandem", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--phase-s", type=float, default=20.0)
    p.add_argument("--phases", type=int, default=8)
    p.add_argument("--poll-ms", type=float, default=100.0)
    p.add_argument("--out", default=".")
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    cmd = [a.tandem, "run", a.config, "--set", f"run.output_dir={a.run_dir}", "--set", "train.max_steps=0",
           "--set", "data.epochs=1000", "--set", "checkpoint.on_signal=true"]
    for kv in a.set:
        cmd += ["--set", kv]
    log = open(os.path.join(a.out, "shell_cost_run.log"), "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.time()

    def fail(msg):
        print(json.dumps({"case": "shell_cost", "error": msg}))
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        sys.exit(1)

    cj = os.path.join(a.run_dir, "control.json")
    while not os.path.exists(cj):
        if proc.poll() is not None or time.time() - t0 > 300:
            fail(f"no {cj} (run exited {proc.returncode})")
        time.sleep(0.5)
    time.sleep(0.2)
    ep = json.load(open(cj))
    while get(ep, "/v1/status")["coordinator"]["step"] < 10:
        if proc.poll() is not None or time.time() - t0 > 400:
            fail("fewer than 10 steps")
        time.sleep(0.5)
    print(f"shell_cost: training after {time.time() - t0:.0f} s", file=sys.stderr, flush=True)

    def shell(*args):
        r = subprocess.run([a.tandem, "shell", a.run_dir, *args], capture_output=True, text=True, timeout=60)
        return r.returncode, r.stdout + r.stderr

    phases = []
    requests, latencies, errors = 0, [], 0
    for k in range(a.phases):
        polled = k % 2 == 1
        s0 = get(ep, "/v1/status")["coordinator"]["step"]
        start = time.time()
        saved = False
        paths = ["/v1/status", "/v1/tree", "/v1/steps?n=10"]
        i = 0
        while time.time() - start < a.phase_s:
            if polled:
                t = time.time()
                try:
                    get(ep, paths[i % 3])
                    latencies.append((time.time() - t) * 1e3)
                except Exception:  # noqa: BLE001 - counted, reported
                    errors += 1
                requests += 1
                i += 1
                if not saved and time.time() - start > a.phase_s / 2:
                    saved = True
                    for name, args in (("top", ["-c", "top"]), ("tree", ["-c", "tree"]),
                                       ("ledger", ["-c", "ledger"]), ("show", ["-c", "show drafter 0"]),
                                       ("graphs", ["-c", "graphs"])):
                        rc, text = shell(*args)
                        with open(os.path.join(a.out, f"shell_{name}.txt"), "w") as f:
                            f.write(text)
                time.sleep(max(0.0, a.poll_ms / 1e3 - (time.time() - t)))
            else:
                time.sleep(0.05)
        s1 = get(ep, "/v1/status")["coordinator"]["step"]
        phases.append({"phase": k, "polled": polled, "first_step": s0 + 1, "last_step": s1})
        print(f"shell_cost: phase {k} polled={polled} steps {s0 + 1}..{s1}", file=sys.stderr, flush=True)

    rc, text = shell("-c", "stop")
    with open(os.path.join(a.out, "shell_stop.txt"), "w") as f:
        f.write(text)
    try:
        code = proc.wait(timeout=300)
    except subprocess.TimeoutExpired:
        fail("the run did not end within 300 s of stop")
    rows = steps_of(os.path.join(a.run_dir, "metrics.jsonl"))
    by_step = {}
    for x in rows:
        by_step.setdefault(x["step"], x)
    for ph in phases:
        xs = [by_step[s] for s in range(ph["first_step"], ph["last_step"] + 1) if s in by_step]
        ph["steps"] = len(xs)
        if len(xs) >= 3:
            ph["interval_ms"] = (xs[-1]["time_s"] - xs[0]["time_s"]) / (len(xs) - 1) * 1e3
            ph["step_ms_median"] = statistics.median(x["compute_ms"] + x["wait_ms"] for x in xs)

    def mean(polled, key):
        v = [ph[key] for ph in phases if ph["polled"] == polled and key in ph and ph["phase"] > 0]
        return statistics.mean(v) if v else None

    res = {"case": "shell_cost", "poll_ms": a.poll_ms, "phase_s": a.phase_s, "requests": requests,
           "request_errors": errors, "exit_code": code, "stop_reply": text.strip()[-200:],
           "latency_ms_median": statistics.median(latencies) if latencies else None,
           "latency_ms_p99": sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else None,
           "phases": phases}
    for key in ("interval_ms", "step_ms_median"):
        off, on = mean(False, key), mean(True, key)
        res[key + "_without_client"] = off
        res[key + "_with_client"] = on
        if off and on:
            res[key + "_difference_pct"] = (on - off) / off * 100
    # The first phase (no client) is left out of the means: the allocator and caches settle.
    print(json.dumps(res))
    return 0 if code == 0 and errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
