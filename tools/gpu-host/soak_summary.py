"""The H200 soak's helpers (tools/gpu-host/soak.sh), one subcommand each:

  faults --seed N --every STEPS --count K --metrics M --parts P
      The seeded fault schedule (plan()) as `--fault` arguments, one a line, leaving out
      the faults at or before the last step M reports (a part that continues the soak
      passes only those still ahead).
  wait --metrics M --parts P --soak-s S --deadline UNIX_S --pid PID
      Polls M until the soak has trained S seconds in all (exit 0), the wall clock passes
      UNIX_S (exit 3) or process PID ends (exit 2); a progress line to stderr every 30 s.
  summary --metrics M --parts P --disk D --checkpoints DIR --seed N --every STEPS
          --count K --soak-s S [--tandem-version V] [--host-every H] [--checkpoint-every C]
      The soak's JSON line (below).

The files: M is the run's metrics.jsonl, appended to by every part (each part is one
`tandem run`, the later ones `--resume`; inside a part, `tandem run` restarts dead worker
processes itself).  P has two lines per part written by soak.sh: {"part", "event": "start",
"offset": M's size in bytes when it started, "unix_s", "resume", "faults"} and {"part",
"event": "stop", "unix_s", "how": "sigterm" | "sigkill" | "exited", "rc", "why"}.  D has a
line every 10 s: {"unix_s", "part", "checkpoints_bytes", "host_bytes", "disk_free_bytes",
"shm_free_bytes"}.

Training seconds: every worker process's metrics clock (`time_s`) starts near 0, so the
soak's training time is the sum over parts and their workers of the span from the worker's
first step report to its last (bench/pipeline.py, workers()); a worker restart's gap and
each part's start-up and stop are not in it.

The summary line: schema 1; training_s, run_s (the parts' wall time from start to stop),
steps (the last step reported), step_ms_median; faults: the planned ones that came due
(at a step the run reached, or one past it when a recovery is left for that one: it fired
in the step that was never reported) against the recoveries seen (bench/pipeline.py,
recoveries()), paired in order within each class (throw, nan, cuda_error and hang are
recovered inside the worker: a `drafter_failed` line; cuda_sticky and abort by a new
worker: a `worker_restarted` line, exit "status 75" and "signal 6 (Aborted)"), per kind the steps
lost, the restore tier and the seconds to training again, and the faults without a
recovery and the recoveries without a fault; ledger: the exactly-once check of
tests/integration/soak_schedule.py, ledger(), over every complete epoch (the last epoch may
be partial: its counts must add up, but it need not be complete); disk: the largest bytes
under the checkpoint folder and the shared-memory folder and the least free bytes of their
file systems; restore_points: the restore points written in shared memory (and their
errors); final_checkpoint: the step and folder of the newest complete checkpoint; ok:
steps trained, the ledger exact, every due fault recovered as its kind should be, no
recovery unexplained.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(_root, "bench"))
sys.path.insert(0, os.path.join(_root, "tests", "integration"))
import pipeline  # noqa: E402  (workers(), recoveries(); imports no torch)
import soak_schedule  # noqa: E402  (walk_ledger())

# The fault kinds the soak cycles through, and how each must be recovered.
IN_WORKER = ["throw", "nan", "cuda_error", "hang"]  # drafter_failed, a restart in the worker
# worker_restarted, its exit (before any " (signal name)")
NEW_WORKER = {"cuda_sticky": "status 75", "abort": "signal 6"}
KINDS = IN_WORKER + list(NEW_WORKER)


def plan(seed, every, count):
    """[[kind, step], ...]: `count` faults about `every` steps apart (the k-th at k * every,
    give or take every / 4, drawn from `seed`), their kinds a seeded order of KINDS, over
    and over (every kind once in each run of six)."""
    rng = random.Random(seed)
    order = KINDS[:]
    rng.shuffle(order)
    return [[order[k % len(order)], (k + 1) * every + rng.randint(-(every // 4), every // 4)]
            for k in range(count)]


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path, "rb") as f:
        return [json.loads(line) for line in f if line.strip()]


def parts_of(path):
    """(starts, stops): the parts file's lines by kind, each in part order."""
    lines = read_lines(path)
    starts = sorted((x for x in lines if x.get("event") == "start"), key=lambda x: x["part"])
    stops = sorted((x for x in lines if x.get("event") == "stop"), key=lambda x: x["part"])
    return starts, stops


def metrics_by_part(path, starts):
    """The metrics rows of each part (a `tandem run` process with its own clocks), split at
    the byte offsets the parts file gives; a line still being written is left out."""
    if not os.path.exists(path):
        return [[] for _ in starts]
    with open(path, "rb") as f:
        data = f.read()
    data = data[:data.rfind(b"\n") + 1]
    offsets = [x["offset"] for x in starts] + [len(data)]
    out = []
    for lo, hi in zip(offsets, offsets[1:]):
        out.append([json.loads(line) for line in data[lo:hi].splitlines() if line.strip()])
    return out


def training_seconds(parts):
    """Σ over the parts and their worker processes of the first step report to the last."""
    total = 0.0
    for rows in parts:
        worker, _ = pipeline.workers(rows)
        first, last = {}, {}
        for x, k in zip(rows, worker):
            if x.get("event") == "step":
                first.setdefault(k, x["time_s"])
                last[k] = x["time_s"]
        total += sum(last[k] - first[k] for k in last)
    return total


def last_step(parts):
    steps = [x["step"] for rows in parts for x in rows if x.get("event") == "step"]
    return max(steps) if steps else 0


def ledger(rows):
    """soak_schedule.py's ledger check for a run that is stopped rather than ended: its
    walk_ledger over the lines (each epoch's samples from its epoch line), then every epoch
    but the last must end with all its samples committed, and the epochs come in order."""
    problems, count, final, samples = soak_schedule.walk_ledger([x for x in rows if "event" in x])
    last = max(count) if count else None
    for e in sorted(count):
        if e != last and final.get(e) != samples[e]:
            problems.append(f"epoch {e}: {final.get(e)} of {samples[e]} samples committed before epoch {e + 1}")
    if last is not None and sorted(count) != list(range(last + 1)):
        problems.append(f"epochs seen {sorted(count)}, expected 0..{last}")
    complete = [e for e in sorted(final) if final[e] == samples[e]]
    return {"exact": not problems, "complete_epochs": len(complete),
            "committed_per_epoch": {str(e): c for e, c in sorted(final.items())},
            "samples_per_epoch": samples.get(last), "problems": problems}


def match(planned, recs, reached):
    """Pairs the faults that came due with the recoveries seen, in order within each class;
    a fault one step past the last one reported counts when a recovery is left for it
    (it fired in the step that did not come).  Returns (pairs, missing, unexpected)."""
    pairs, missing, unexpected = [], [], []
    for cls, kinds in (("drafter", set(IN_WORKER)), ("worker", set(NEW_WORKER))):
        faults = sorted((f for f in planned if f[0] in kinds and f[1] <= reached + 1), key=lambda f: f[1])
        seen = [r for r in recs if r["kind"] == cls]
        for i, f in enumerate(faults):
            if i < len(seen):
                pairs.append((f, seen[i]))
            elif f[1] <= reached:
                missing.append({"kind": f[0], "at_step": f[1]})
        unexpected += seen[len(faults):]
    pairs.sort(key=lambda p: p[0][1])
    return pairs, missing, unexpected


def per_kind(pairs):
    """Per fault kind: how many, and each one's steps lost, restore tier and seconds to
    training again (with the largest)."""
    out = {}
    for (kind, at), r in pairs:
        k = out.setdefault(kind, {"injected": 0, "at_steps": [], "steps_lost": [], "restore_from": [],
                                  "training_again_after_s": []})
        k["injected"] += 1
        k["at_steps"].append(at)
        k["steps_lost"].append(r.get("steps_lost"))
        k["restore_from"].append(r.get("restore_from"))
        t = r.get("training_again_after_s")
        k["training_again_after_s"].append(round(t, 2) if t is not None else None)
    for k in out.values():
        times = [t for t in k["training_again_after_s"] if t is not None]
        k["training_again_max_s"] = max(times) if times else None
    return out


def problems_of(pairs):
    """A recovery of the wrong class cannot be paired (match() pairs within a class); here:
    a new worker whose exit is not the fault's, or that never resumed or trained again."""
    out = []
    for (kind, at), r in pairs:
        if kind in NEW_WORKER:
            if str(r.get("exit")).split(" (")[0] != NEW_WORKER[kind]:
                out.append(f"{kind} at step {at}: the worker ended with {r.get('exit')!r}, "
                           f"expected {NEW_WORKER[kind]!r}")
            if r.get("training_again_after_s") is None:
                out.append(f"{kind} at step {at}: no step after the worker restarted")
        elif r.get("training_again_after_s") is None:
            out.append(f"{kind} at step {at}: no step after the drafter failed")
    return out


def restore_points(rows):
    """The `restore_point` lines (each restore point written outside the device: tier
    "host", in shared memory): how many per tier, and the first errors."""
    lines = [x for x in rows if x.get("event") == "restore_point"]
    tiers = {}
    for x in lines:
        tiers[x.get("tier")] = tiers.get(x.get("tier"), 0) + 1
    return {"written": tiers, "errors": [f"step {x.get('step')}: {x['error']}" for x in lines if x.get("error")][:5]}


def disk(path):
    rows = read_lines(path)

    def most(key):
        return max((x[key] for x in rows if x.get(key) is not None), default=None)

    def least(key):
        return min((x[key] for x in rows if x.get(key) is not None), default=None)

    return {"samples": len(rows), "checkpoints_max_bytes": most("checkpoints_bytes"),
            "host_max_bytes": most("host_bytes"), "disk_free_min_bytes": least("disk_free_bytes"),
            "shm_free_min_bytes": least("shm_free_bytes")}


def newest_checkpoint(folder):
    """{"step", "dir"} of the newest complete step-<k> folder (a state.json), or None."""
    if not os.path.isdir(folder):
        return None
    done = [d for d in os.listdir(folder)
            if d.startswith("step-") and d[5:].isdigit() and os.path.exists(os.path.join(folder, d, "state.json"))]
    if not done:
        return None
    newest = max(done, key=lambda d: int(d[5:]))
    with open(os.path.join(folder, newest, "state.json")) as f:
        step = json.load(f).get("step")
    return {"step": step, "dir": os.path.join(folder, newest)}


def summary(a):
    starts, stops = parts_of(a.parts)
    parts = metrics_by_part(a.metrics, starts)
    rows = [x for p in parts for x in p]
    planned = plan(a.seed, a.every, a.count)
    recs = [r for p in parts for r in pipeline.recoveries(p)]
    reached = last_step(parts)
    pairs, missing, unexpected = match(planned, recs, reached)
    trained = training_seconds(parts)
    steps = [x for x in rows if x.get("event") == "step"]
    led = ledger(rows)
    problems = problems_of(pairs)
    ends = [{k: x.get(k) for k in ("reason", "steps", "durable_step", "error")}
            for x in rows if x.get("event") == "end"]
    stop_of = {x["part"]: x for x in stops}
    out = {
        "case": "soak", "schema": 1, "tandem": a.tandem_version, "parts": len(starts),
        "seed": a.seed, "fault_every_steps": a.every, "checkpoint_every": a.checkpoint_every,
        "host_every": a.host_every, "soak_s": a.soak_s, "done": trained >= a.soak_s,
        "training_s": round(trained, 1),
        "run_s": round(sum(stop_of[s["part"]]["unix_s"] - s["unix_s"] for s in starts if s["part"] in stop_of), 1),
        "steps": reached, "step_reports": len(steps),
        "step_ms_median": (statistics.median(x["compute_ms"] + x["wait_ms"] for x in steps) if steps else None),
        "faults": {"planned": len(planned), "due": len(pairs) + len(missing),
                   "recovered": len(pairs), "per_kind": per_kind(pairs), "missing": missing,
                   "unexpected": [{k: r.get(k) for k in ("kind", "exit", "reason", "at_s", "unix_s")}
                                  for r in unexpected],
                   "problems": problems},
        "drafter_failures": sum(1 for r in recs if r["kind"] == "drafter"),
        "worker_restarts": sum(1 for r in recs if r["kind"] == "worker"),
        "restore_points": restore_points(rows),
        "ledger": led, "disk": disk(a.disk), "final_checkpoint": newest_checkpoint(a.checkpoints),
        "ends": ends,
        "part_stops": [{k: stop_of[s["part"]].get(k) for k in ("part", "how", "rc", "why")}
                       for s in starts if s["part"] in stop_of],
    }
    out["ok"] = bool(steps) and led["exact"] and not missing and not unexpected and not problems
    return out


def wait(a):
    deadline, said = a.deadline, 0.0
    while True:
        starts, _ = parts_of(a.parts)
        parts = metrics_by_part(a.metrics, starts)
        trained = training_seconds(parts)
        if time.time() - said >= 30:
            recs = [r for p in parts for r in pipeline.recoveries(p)]
            print(f"soak: {trained:.0f} of {a.soak_s:g} s trained, step {last_step(parts)}, "
                  f"{sum(r['kind'] == 'drafter' for r in recs)} drafter failures, "
                  f"{sum(r['kind'] == 'worker' for r in recs)} worker restarts", file=sys.stderr, flush=True)
            said = time.time()
        if trained >= a.soak_s:
            return 0
        try:
            os.kill(a.pid, 0)
        except ProcessLookupError:
            return 2
        if time.time() > deadline:
            return 3
        time.sleep(2)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("faults", "wait", "summary"):
        s = sub.add_parser(name)
        s.add_argument("--metrics", required=True)
        s.add_argument("--parts", required=True)
        if name in ("faults", "summary"):
            s.add_argument("--seed", type=int, required=True)
            s.add_argument("--every", type=int, required=True)
            s.add_argument("--count", type=int, required=True)
        if name in ("wait", "summary"):
            s.add_argument("--soak-s", type=float, required=True)
    w = sub.choices["wait"]
    w.add_argument("--deadline", type=float, required=True)
    w.add_argument("--pid", type=int, required=True)
    s = sub.choices["summary"]
    s.add_argument("--disk", required=True)
    s.add_argument("--checkpoints", required=True)
    s.add_argument("--tandem-version", default="")
    s.add_argument("--host-every", type=int)
    s.add_argument("--checkpoint-every", type=int)
    a = p.parse_args()
    if a.cmd == "faults":
        starts, _ = parts_of(a.parts)
        reached = last_step(metrics_by_part(a.metrics, starts))
        for kind, step in plan(a.seed, a.every, a.count):
            if step > reached:
                print("--fault")
                print(f"drafter=0,kind={kind},at_step={step}")
        return 0
    if a.cmd == "wait":
        return wait(a)
    print(json.dumps(summary(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
