"""The CPU soak's helpers (tests/integration/soak_test.sh), one subcommand each:

  plan SEED LAST_STEP EVERY [SPEC]
      The seeded fault schedule over a run of LAST_STEP steps with a checkpoint
      every EVERY steps, as JSON: a list of segments (one `tandem run` process
      each; all but the first `--resume`), each with its in-process faults
      (`--fault` arguments: throw, nan, hang, slow_snapshot) and how it ends
      (`sigterm` or `sigkill` once metrics.jsonl shows step `at`, or `end`).
      SPEC (optional) replaces the random draw by fixed events, e.g.
      "throw@30,sigkill@45" (a reproduction or a single-fault experiment).
  wait METRICS OFFSET STEP PID TIMEOUT_S
      Polls METRICS (from byte OFFSET: this segment's lines) until a step
      record with step >= STEP appears (exit 0), process PID ends (exit 2)
      or TIMEOUT_S passes (exit 3).
  ledger METRICS EPOCHS SAMPLES
      The exactly-once accounting over every segment's records (the file is
      appended to by each resumed process), as JSON; exit 1 if not exact.
  same CHECKPOINT_A CHECKPOINT_B
      Whether two checkpoints hold the same training state bit for bit: every
      tensor of weights.safetensors and optimizer.safetensors (dtype, shape,
      bytes), the step, the drafter's generator state and the ledger; exit 1
      with the differences otherwise.
  losses METRICS_A METRICS_B
      The first step whose loss differs between two runs (the last record of
      each step counts: a step re-trained after a rollback is logged again).
  events METRICS
      The run's events other than steps and checkpoints (resumes, failures,
      restarts, ends), one a line after the last step logged before it: where
      a difference found by `losses` came in.

Everything is read from structured output (JSON lines, safetensors bytes).
"""
import json
import os
import random
import struct
import sys
import time

IN_PROCESS = ["throw", "nan", "hang", "slow_snapshot"]


def plan(seed, last_step, every, spec=""):
    """Segments: [{"faults": [[kind, step], ...], "end": "sigterm"|"sigkill"|"end", "at": step}]."""
    events = []  # (step, kind)
    if spec:
        for item in spec.split(","):
            kind, step = item.split("@")
            events.append((int(step), kind))
    else:
        rng = random.Random(seed)
        # Every kind once, a second SIGKILL, three more in-process faults of
        # random kinds.
        kinds = IN_PROCESS + ["sigterm", "sigkill", "sigkill"] + [rng.choice(IN_PROCESS) for _ in range(3)]
        used = set()
        for kind in kinds:
            while True:
                step = rng.randint(3, last_step - 3)
                if kind in ("sigterm", "sigkill"):  # after the first checkpoint, for --resume
                    step = max(step, every + 3)
                if kind == "slow_snapshot":  # its snapshot (the first at or after the step) must come
                    step = max(every, step // every * every)
                if all(abs(step - u) >= 4 for u in used):
                    break
            used.add(step)
            events.append((step, kind))
    events.sort()
    segments, current = [], {"faults": []}
    for step, kind in events:
        if kind in ("sigterm", "sigkill"):
            current.update(end=kind, at=step)
            segments.append(current)
            current = {"faults": []}
        else:
            current["faults"].append([kind, step])
    current.update(end="end", at=last_step)
    segments.append(current)
    return segments


def wait(path, offset, step, pid, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path, "rb") as f:
                f.seek(offset)
                for line in f.read().split(b"\n"):
                    try:
                        x = json.loads(line)
                    except ValueError:
                        continue  # empty, or not yet complete
                    if x.get("event") == "step" and x["step"] >= step:
                        return 0
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return 2
        time.sleep(0.05)
    return 3


def records(path):
    out = []
    for n, line in enumerate(open(path, "rb"), 1):
        try:
            out.append(json.loads(line))
        except ValueError:
            sys.exit(f"{path}:{n}: not a JSON record: {line[:120]!r}")
    return out


def walk_ledger(rows, samples=None):
    """The per-checkpoint part of the ledger check, over metrics lines in order: at an
    epoch line (a fresh epoch, or a resumed one with `already_committed`) the epoch's count
    starts there, never below what a checkpoint had committed; each checkpoint must then
    add exactly `committed_now`, and never pass the epoch's samples (`samples`, or each
    epoch line's own count when None).  Returns (problems, count, final, samples per epoch
    seen): the last count and the last checkpoint's count per epoch."""
    problems, count, final, seen, epoch = [], {}, {}, {}, None
    for x in rows:
        if x["event"] == "epoch":
            epoch = x["epoch"]
            seen[epoch] = x["samples"] if samples is None else samples
            if epoch in count and x["already_committed"] < count[epoch]:
                # A resumed process must start from the newest checkpoint.
                problems.append(f"epoch {epoch} resumed with {x['already_committed']} committed, "
                                f"after a checkpoint had committed {count[epoch]}")
            count[epoch] = x["already_committed"]
        elif x["event"] == "checkpoint":
            if epoch is None:
                problems.append(f"checkpoint at step {x['step']} before any epoch")
                continue
            want = count[epoch] + x["committed_now"]
            if x["committed"] != want:
                problems.append(f"checkpoint at step {x['step']} (epoch {epoch}): committed {x['committed']}, "
                                f"expected {count[epoch]} + {x['committed_now']}")
            if x["committed"] > seen[epoch]:
                problems.append(f"checkpoint at step {x['step']}: {x['committed']} > {seen[epoch]} committed")
            count[epoch] = final[epoch] = x["committed"]
    return problems, count, final, seen


def ledger(path, epochs, samples):
    """Walks every segment's records (walk_ledger).  Exact: every epoch ends with all
    samples committed, and no segment re-commits what an earlier one committed (the
    counts would overshoot or disagree)."""
    problems, _, final, _ = walk_ledger(records(path), samples)
    for e in range(epochs):
        if final.get(e) != samples:
            problems.append(f"epoch {e}: {final.get(e)} of {samples} samples committed")
    if sorted(final) != list(range(epochs)):
        problems.append(f"epochs seen {sorted(final)}, expected 0..{epochs - 1}")
    return {"committed_per_epoch": {str(e): c for e, c in sorted(final.items())}, "problems": problems}


def safetensors(path):
    """name -> (dtype, shape, raw bytes), straight from the file's header."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def same(a, b):
    diffs = []
    for name in ("weights.safetensors", "optimizer.safetensors"):
        ta, tb = safetensors(os.path.join(a, name)), safetensors(os.path.join(b, name))
        if sorted(ta) != sorted(tb):
            diffs.append(f"{name}: tensors {sorted(set(ta) ^ set(tb))} in one only")
        for k in sorted(set(ta) & set(tb)):
            if ta[k] != tb[k]:
                diffs.append(f"{name}: {k} differs{describe(ta[k], tb[k])}")
    sa = json.load(open(os.path.join(a, "state.json")))
    sb = json.load(open(os.path.join(b, "state.json")))
    if sa.get("step") != sb.get("step"):
        diffs.append(f"state.json: step {sa.get('step')} != {sb.get('step')}")
    if sa.get("generator") != sb.get("generator"):
        diffs.append("state.json: generator state differs")
    la, lb = json.loads(sa["extra"]), json.loads(sb["extra"])
    for key in ("ledger", "step", "epoch"):
        if la.get(key) != lb.get(key):
            diffs.append(f"state.json extra: {key} {la.get(key)} != {lb.get(key)}")
    return diffs


def describe(x, y):
    """The largest difference, for float32 tensors of one shape."""
    if x[0] != "F32" or x[:2] != y[:2]:
        return f": {x[:2]} vs {y[:2]}"
    n = len(x[2]) // 4
    u, v = struct.unpack(f"<{n}f", x[2]), struct.unpack(f"<{n}f", y[2])
    d = [abs(p - q) for p, q in zip(u, v)]
    return f" (max |a-b| {max(d):.3g}, {sum(1 for e in d if e)} of {n} elements)"


def events(path):
    last = None
    for x in records(path):
        if x["event"] == "step":
            last = x["step"]
        elif x["event"] not in ("checkpoint", "epoch"):
            keep = ("reason", "restore_from", "restore_step", "from", "step", "tier")
            print(f"after step {last}: {x['event']} {json.dumps({k: x[k] for k in keep if k in x})}")


def first_loss_difference(a, b):
    def losses(path):
        # (a non-finite step's record carries the step before it)
        return {x["step"]: x["loss"] for x in records(path) if x["event"] == "step" and x["finite"]}
    la, lb = losses(a), losses(b)
    for k in sorted(set(la) | set(lb)):
        if la.get(k) != lb.get(k):
            return {"step": k, "a": la.get(k), "b": lb.get(k)}
    return None


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "plan":
        print(json.dumps(plan(int(args[0]), int(args[1]), int(args[2]), args[3] if len(args) > 3 else "")))
    elif cmd == "wait":
        sys.exit(wait(args[0], int(args[1]), int(args[2]), int(args[3]), float(args[4])))
    elif cmd == "ledger":
        r = ledger(args[0], int(args[1]), int(args[2]))
        print(json.dumps(r))
        sys.exit(1 if r["problems"] else 0)
    elif cmd == "same":
        d = same(args[0], args[1])
        for line in d:
            print(line)
        sys.exit(1 if d else 0)
    elif cmd == "losses":
        print(json.dumps(first_loss_difference(args[0], args[1])))
    elif cmd == "events":
        events(args[0])
    else:
        sys.exit(f"unknown subcommand {cmd}")
