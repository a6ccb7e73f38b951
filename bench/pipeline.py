#!/usr/bin/env python3
"""End-to-end pipeline benchmark: `tandem run` with targets and drafters on their own GPUs
(default one of each, cuda:0 and cuda:1) at Qwen3-8B DFlash shapes, on random weights and
synthetic token data, and one JSON line: samples/s, tokens/s, step time, the drafters'
data-wait share (overall and per drafter).

    python bench/pipeline.py --tandem build/bin/tandem [--work DIR] [--steps 60]
                                   [--target-device cuda:0[,cuda:1...]]
                                   [--drafter-device cuda:1[,cuda:2...]]
                                   [--size 8b|tiny] [--keep] [--timeout S]
                                   [--fault SPEC]... [--set KEY=VALUE]... [--setup-only]

Several drafter devices make data-parallel drafters (one NCCL group, lockstep steps); the
seed topology is --target-device cuda:0,cuda:1,cuda:2,cuda:3,cuda:4
--drafter-device cuda:5,cuda:6,cuda:7.

It writes (into --work, default a temp folder, deleted unless --keep):
  target/   a random-weight Qwen3 folder (config.json + safetensors shards; 8b: 36 layers,
            hidden 4096, vocab 151936, bf16, std 0.02; drawn on the first GPU, ~16 GB)
  data/     a token data set in Tandem's shard format (docs/data.md): 2,000 samples of
            500-3,000 random tokens, the first third of each unsupervised
  run.toml  5-layer drafter, S 3072, N 512, Bs 16, credits 4, checkpoint only at the end
then runs `tandem run run.toml` and reads its metrics.jsonl.  The data-wait share is
Σ wait_ms / Σ (wait_ms + compute_ms) over the steps after the first `--skip` (default 5,
the graph warm-up and capture), leaving out each drafter's first step after a failure,
whose wait was for the recovery (reported as recovery_wait_s;
data_wait_share_incl_recovery counts it).  `--setup-only` writes target/, data/ and
run.toml into --work and stops there (tools/gpu-host/soak.sh runs `tandem run` itself).
Writing the target and data needs torch, numpy and safetensors; reading metrics does not
(tools/gpu-host/soak_summary.py imports workers() and recoveries() from here).

`tandem run` supervises a worker process: a worker that dies (a signal, or exit status 75
after a sticky CUDA error) is replaced by a new one resuming from the newest restore point,
and each worker's metrics clock (`time_s`) starts near 0 again (see workers()).  Step
statistics are therefore taken per worker and summed: each worker skips its own first
--skip steps (it captures its graphs again), the span is the sum of the workers' spans, and
`recoveries` lists each drafter failure (kind "drafter") and each worker restart (kind
"worker": the exit, steps lost, the restore tier, the time to training again).

Progress goes to stderr while it runs (setup phases, every 10th step, failures, restarts,
group formations, checkpoints).  `--timeout S` bounds the run; when it expires, or when
this script gets SIGTERM/SIGINT (a `timeout` wrapper), `tandem run` is stopped and the
JSON line still comes, from the steps so far, with "complete": false and "stopped" saying
why (a partial line, not an error).
"""
import argparse
import hashlib
import json
import os
import signal
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PEAK_TFLOPS = 989.0  # dense bf16, H100/H200: the MFU denominator (docs/bench.md)

SIZES = {
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, vocab_size=151936, mask=151669, drafter_layers=5,
               seq=3072, anchors=512),
    "tiny": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64, vocab_size=4096, mask=4095, drafter_layers=2,
                 seq=512, anchors=32),
}


def make_target(out, s, device):
    import torch
    from safetensors.torch import save_file as save_torch

    os.makedirs(out)
    cfg = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
           "hidden_size": s["hidden_size"], "intermediate_size": s["intermediate_size"],
           "num_hidden_layers": s["num_hidden_layers"], "num_attention_heads": s["num_attention_heads"],
           "num_key_value_heads": s["num_key_value_heads"], "head_dim": s["head_dim"],
           "vocab_size": s["vocab_size"], "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "attention_bias": False}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    g = torch.Generator(device=device).manual_seed(0)
    d, i, h, kv, hd = (s["hidden_size"], s["intermediate_size"], s["num_attention_heads"],
                       s["num_key_value_heads"], s["head_dim"])

    def rnd(*shape):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02).to(
            torch.bfloat16).cpu()

    def ones(n):
        return torch.ones(n, dtype=torch.bfloat16)

    index, shard, n_shard, size = {}, {}, 0, 0

    def flush():
        nonlocal shard, n_shard, size
        if not shard:
            return
        name = f"model-{n_shard:05d}.safetensors"
        save_torch(shard, os.path.join(out, name), metadata={"format": "pt"})
        for k in shard:
            index[k] = name
        shard, n_shard, size = {}, n_shard + 1, 0

    def put(name, t):
        nonlocal size
        shard[name] = t
        size += t.numel() * 2
        if size > 4 << 30:
            flush()

    put("model.embed_tokens.weight", rnd(s["vocab_size"], d))
    for l in range(s["num_hidden_layers"]):
        p = f"model.layers.{l}."
        put(p + "self_attn.q_proj.weight", rnd(h * hd, d))
        put(p + "self_attn.k_proj.weight", rnd(kv * hd, d))
        put(p + "self_attn.v_proj.weight", rnd(kv * hd, d))
        put(p + "self_attn.o_proj.weight", rnd(d, h * hd))
        put(p + "self_attn.q_norm.weight", ones(hd))
        put(p + "self_attn.k_norm.weight", ones(hd))
        put(p + "mlp.gate_proj.weight", rnd(i, d))
        put(p + "mlp.up_proj.weight", rnd(i, d))
        put(p + "mlp.down_proj.weight", rnd(d, i))
        put(p + "input_layernorm.weight", ones(d))
        put(p + "post_attention_layernorm.weight", ones(d))
    put("model.norm.weight", ones(d))
    put("lm_head.weight", rnd(s["vocab_size"], d))
    flush()
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": index}, f)


def make_data(out, vocab, samples, lo, hi, mask_token):
    """Random token samples that never hold the drafter's mask token (tandem run
    refuses data that does: it could not tell a masked position from it)."""
    import numpy as np
    from safetensors.numpy import save_file as save_np

    os.makedirs(out)
    rng = np.random.default_rng(0)
    toks, masks, lens = [], [], []
    for _ in range(samples):
        n = int(rng.integers(lo, hi))
        t = rng.integers(0, vocab - 3, size=n)
        t[t >= mask_token] += 1  # uniform over [0, vocab - 2) without the mask token
        toks.append(t.astype(np.int32))
        m = np.zeros(n, dtype=np.uint8)
        m[n // 3:] = 1
        masks.append(m)
        lens.append(n)
    tokens, mask = np.concatenate(toks), np.concatenate(masks)
    offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    shard = os.path.join(out, "shard-00000.safetensors")
    save_np({"tokens": tokens, "loss_mask": mask, "offsets": offsets}, shard,
            metadata={"format": "tandem.shard.v1", "num_samples": str(samples),
                      "num_tokens": str(len(tokens))})
    with open(shard, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    manifest = {"format": "tandem.dataset.v1", "created_by": "bench/pipeline.py",
                "tokenizer": {"source": "synthetic", "vocab_size": vocab, "sha256": "",
                              "chat_template_sha256": None},
                "options": {}, "inputs": [],
                "shards": [{"file": "shard-00000.safetensors", "num_samples": samples,
                            "num_tokens": int(len(tokens)), "num_supervised": int(mask.sum()),
                            "sha256": digest}],
                "totals": {"samples": samples, "tokens": int(len(tokens)), "supervised": int(mask.sum())},
                "report": {}, "content_hash": hashlib.sha256(digest.encode()).hexdigest()}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


class metrics_reader:
    """metrics.jsonl as it grows: each read() appends the lines completed since the last one
    to .rows (a line still being written waits for the next read)."""

    def __init__(self, path):
        self.path, self.offset, self.rows = path, 0, []

    def read(self):
        if not os.path.exists(self.path):
            return self.rows
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read()
        done = chunk.rfind(b"\n") + 1
        for line in chunk[:done].splitlines():
            self.rows.append(json.loads(line))
        self.offset += done
        return self.rows


def workers(rows):
    """Which worker process wrote each row, and when on the wall clock.

    `tandem run` is a parent process that supervises one worker process at a time.  When
    the worker dies (a signal, or exit status 75 after a sticky CUDA error) the parent
    starts another, which appends {"event": "worker_restarted", "exit", "restart",
    "budget", "unix_s": the death, wall clock} and {"event": "resumed", "step", "from",
    "tier", "unix_s"} as it starts.  Each worker's metrics clock (`time_s`, on every line)
    starts near 0, so a line of a later worker is at  resumed.unix_s - resumed.time_s +
    time_s  on the wall clock (resumed.unix_s and its time_s must be one moment).

    Returns (worker, wall): per row its worker (0 until the first `worker_restarted` line,
    which opens worker 1, and so on) and its wall-clock time (a line's own unix_s where it
    has one), None where no `resumed` line anchors its worker's clock (the first worker's,
    unless it was itself resumed)."""
    worker, base = [], [None]
    for x in rows:
        if x.get("event") == "worker_restarted":
            base.append(None)
        k = len(base) - 1
        if x.get("event") == "resumed" and base[k] is None and "unix_s" in x and "time_s" in x:
            base[k] = x["unix_s"] - x["time_s"]
        worker.append(k)

    def wall(x, k):
        if "unix_s" in x:
            return x["unix_s"]
        if base[k] is not None and "time_s" in x:
            return base[k] + x["time_s"]
        return None

    return worker, [wall(x, k) for x, k in zip(rows, worker)]


def seconds_between(rows, worker, wall, i, j):
    """Row j's time minus row i's: on their worker's clock when they share one, else on the
    wall clock; None when that is unknown, or when j is None."""
    if j is None:
        return None
    if worker[i] == worker[j] and "time_s" in rows[i] and "time_s" in rows[j]:
        return rows[j]["time_s"] - rows[i]["time_s"]
    if wall[i] is not None and wall[j] is not None:
        return wall[j] - wall[i]
    return None


def recoveries(rows):
    """Each recovery, in the order of the failures:
      kind "drafter": a `drafter_failed` line (the drafter was restarted inside its worker
        process): when (`at_s`, on its worker's clock), why, `steps_lost` and
        `restore_from` as the line says, and the seconds from it to the next group formed
        and to the next step report;
      kind "worker": a `worker_restarted` line (the worker process died, `exit` says how,
        and the parent started another): `steps_lost` = the last step reported before the
        death minus the step the next worker resumed at, `restore_from` = that worker's
        restore tier ("host" or "disk"), `training_again_after_s` = from the death to the
        first step report after its `resumed` line (wall clock).  A worker that never
        resumed (the restart budget spent, or the run stopped) leaves those None."""
    worker, wall = workers(rows)

    def first(i, event, stop=None):
        """The index of the first row after row i with `event`, or None (or at `stop`)."""
        for j in range(i + 1, len(rows)):
            if rows[j].get("event") == event:
                return j
            if rows[j].get("event") == stop:
                return None
        return None

    out, last_step = [], None
    for i, x in enumerate(rows):
        ev = x.get("event")
        if ev == "step":
            last_step = x["step"]
        elif ev == "drafter_failed":
            out.append({
                "kind": "drafter", "worker": worker[i], "drafter": x.get("drafter"), "at_s": x.get("time_s"),
                "reason": x.get("reason", "")[:120], "steps_lost": x.get("steps_lost"),
                "restore_from": x.get("restore_from", "checkpoint"),
                "group_formed_after_s": seconds_between(rows, worker, wall, i, first(i, "group_formed")),
                "training_again_after_s": seconds_between(rows, worker, wall, i, first(i, "step"))})
        elif ev == "worker_restarted":
            r = first(i, "resumed", stop="worker_restarted")
            resumed = rows[r] if r is not None else {}
            again = first(r, "step", stop="worker_restarted") if r is not None else None
            # From the death (the line's unix_s, not its time_s: the new
            # worker wrote it) on the wall clock.
            since = (wall[again] - x["unix_s"]
                     if again is not None and wall[again] is not None and "unix_s" in x else None)
            out.append({
                "kind": "worker", "worker": worker[i], "exit": x.get("exit"), "restart": x.get("restart"),
                "budget": x.get("budget"), "unix_s": x.get("unix_s"), "last_step": last_step,
                "resumed_step": resumed.get("step"),
                "steps_lost": (last_step - resumed["step"]
                               if last_step is not None and "step" in resumed else None),
                "restore_from": resumed.get("tier"), "checkpoint": resumed.get("from"),
                "training_again_after_s": since})
    return out


def summarize(rows, a, targets, drafters, prep_s, run_s):
    """The JSON line from metrics rows (complete or not)."""
    worker, wall = workers(rows)
    of = {id(x): k for x, k in zip(rows, worker)}
    all_steps = [x for x in rows if x.get("event") == "step"]
    # Per worker process, skip its first --skip optimizer steps (every drafter's
    # report of them: the warm-up and the graphs' capture, again in every new
    # worker); its span runs from its first kept report to its last.
    segments = []
    for k in sorted({of[id(x)] for x in all_steps}):
        mine = [x for x in all_steps if of[id(x)] == k]
        skipped = set(sorted({x["step"] for x in mine})[:a.skip])
        mine = [x for x in mine if x["step"] not in skipped]
        if mine:
            segments.append(mine)
    steps = [x for seg in segments for x in seg]
    if not steps:
        return {"case": "pipeline", "error": "no steps after --skip", "rows": len(rows)}
    kept = {x["step"] for x in steps}
    # A drafter's first step after a failure waited for the recovery (its own
    # restart, or the group re-formed around it, or a new worker process), not
    # for data: that wait is reported apart (recovery_wait_s) and left out of
    # data_wait_share.
    recovering, flagged = set(), set()
    for x in rows:
        if x.get("event") in ("drafter_failed", "worker_restarted"):
            recovering = {y.get("drafter", 0) for y in all_steps}
        elif x.get("event") == "step" and x.get("drafter", 0) in recovering:
            recovering.discard(x.get("drafter", 0))
            flagged.add(id(x))

    def data_wait(xs):
        return sum(x["wait_ms"] for x in xs if id(x) not in flagged)

    wait = data_wait(steps)
    wait_all = sum(x["wait_ms"] for x in steps)
    compute = sum(x["compute_ms"] for x in steps)
    # Each worker's span on its own clock; a worker restart's gap (the death,
    # the new process, its model loading) is in `recoveries`, not here.
    span_s = sum(seg[-1]["time_s"] - seg[0]["time_s"] for seg in segments)
    # Optimizer steps in the spans (one report per drafter each): each
    # worker's first kept step starts its span.
    n = len(kept) - len(segments)
    # (step, wall ms since the step before it, its compute + wait ms): per
    # segment, each step's last report (a group's drafters each report it).
    gaps = []
    for seg in segments:
        at, work = {}, {}
        for x in seg:
            at[x["step"]] = max(at.get(x["step"], x["time_s"]), x["time_s"])
            work[x["step"]] = max(work.get(x["step"], 0.0), x["compute_ms"] + x["wait_ms"])
        order = sorted(at)
        gaps += [(b, 1e3 * (at[b] - at[a]), work[b]) for a, b in zip(order, order[1:])]
    firsts = set()
    for seg in segments:
        start = min(x["step"] for x in seg)
        firsts |= {id(x) for x in seg if x["step"] == start}
    batches = [x.get("batch") for x in steps]
    tokens = sum(x.get("tokens", 0) for x in steps if id(x) not in firsts)
    per_drafter = {}
    for d in sorted({x.get("drafter", 0) for x in steps}):
        mine = [x for x in steps if x.get("drafter", 0) == d]
        w, c = data_wait(mine), sum(x["compute_ms"] for x in mine)
        flop = sum(x.get("tflop", 0) for x in mine)
        per_drafter[str(d)] = {"compute_ms_median": statistics.median(x["compute_ms"] for x in mine),
                               "data_wait_share": w / (w + c) if w + c > 0 else None,
                               # useful work over the drafter's step time (its collective
                               # and any wait for its peers included) at the bf16 peak
                               "mfu": flop / (c / 1e3) / PEAK_TFLOPS if flop > 0 and c > 0 else None}
    out = {"case": "pipeline", "size": a.size, "target_device": a.target_device,
           "drafter_device": a.drafter_device, "targets": len(targets), "drafters": len(drafters),
           "steps_measured": n, "per_drafter": per_drafter,
           "drafter_mfu": (statistics.mean(v["mfu"] for v in per_drafter.values())
                           if all(v["mfu"] is not None for v in per_drafter.values()) else None),
           "failures": sum(1 for x in rows if x.get("event") == "drafter_failed"),
           "worker_restarts": sum(1 for x in rows if x.get("event") == "worker_restarted"),
           "step_ms_median": statistics.median(x["compute_ms"] + x["wait_ms"] for x in steps),
           "compute_ms_median": statistics.median(x["compute_ms"] for x in steps),
           "wait_ms_median": statistics.median(x["wait_ms"] for x in steps),
           "data_wait_share": wait / (wait + compute),
           "data_wait_share_incl_recovery": wait_all / (wait_all + compute),
           "recovery_wait_s": round((wait_all - wait) / 1000, 3),
           "steps_per_s": n / span_s if span_s > 0 else None,
           # The wall clock between optimizer steps: its mean (what a run's
           # throughput is) beside its median (what step_ms_median is), and
           # the steps whose wall time most exceeds their compute + wait: a
           # stall outside the drafter's step (a snapshot's buffers, a restore
           # point) shows there and not in the medians.
           "wall_ms_per_step": 1e3 * span_s / n if n > 0 else None,
           "wall_ms_median": statistics.median(g[1] for g in gaps) if gaps else None,
           "slowest_steps": [{"step": st, "wall_ms": round(w, 1), "step_ms": round(c, 1)}
                             for st, w, c in sorted(gaps, key=lambda g: g[2] - g[1])[:3]],
           "tokens_per_s": tokens / span_s if span_s > 0 else None,
           "samples_per_s": None, "setup_s": round(prep_s, 1), "run_s": round(run_s, 1),
           "last_loss": steps[-1]["loss"], "unique_batches": len(set(batches))}
    out["recoveries"] = recoveries(rows)
    end = [x for x in rows if x.get("event") == "checkpoint"]
    if end and span_s > 0:
        # committed samples over the run from its first line to the last step
        # report, start-up included (one row per step packs ~S/avg samples);
        # past a worker restart on the wall clock, from the first death on (the
        # first worker's clock has no wall-clock anchor: its time from its last
        # line to its death is left out)
        last = max(i for i, x in enumerate(rows) if x.get("event") == "step")
        death = next((i for i, x in enumerate(rows) if x.get("event") == "worker_restarted"), None)
        if death is None or last < death:
            run = rows[last]["time_s"] - rows[0].get("time_s", 0)
        elif wall[last] is not None and wall[death] is not None:
            before = max(x["time_s"] for x in rows[:death] if "time_s" in x)
            run = before - rows[0].get("time_s", 0) + wall[last] - wall[death]
        else:
            run = None
        if run is not None:
            out["samples_per_s"] = end[-1].get("committed", 0) / (run + 1e-9)
    return out


def progress(rows, seen, total):
    """One stderr line per new event worth seeing; returns the new count seen."""
    for x in rows[seen:]:
        ev = x.get("event")
        if ev == "step" and (x.get("step", 0) % 10 == 0 or x.get("step") == total) and x.get("drafter", 0) == 0:
            print(f"pipeline: step {x['step']}/{total} loss {x.get('loss', 0):.3f} "
                  f"compute {x.get('compute_ms', 0):.1f} ms wait {x.get('wait_ms', 0):.2f} ms",
                  file=sys.stderr, flush=True)
        elif ev in ("drafter_failed", "drafter_restarted", "group_formed", "checkpoint",
                    "budget_exhausted", "end", "worker_restarted", "resumed"):
            keep = {k: x[k] for k in ("drafter", "step", "reason", "restore_from", "steps_lost", "dir",
                                      "exit", "restart", "budget", "tier", "from") if k in x}
            print(f"pipeline: {ev} {json.dumps(keep)[:300]}", file=sys.stderr, flush=True)
    return len(rows)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tandem", required=True)
    p.add_argument("--work")
    p.add_argument("--size", choices=sorted(SIZES), default="8b")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--skip", type=int, default=5)
    p.add_argument("--target-device", default="cuda:0")
    p.add_argument("--drafter-device", default="cuda:1")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--fault", action="append", default=[],
                   help="passed to tandem run: drafter=N,kind=K,at_step=S, K one of throw, nan, "
                        "hang (past runtime.step_timeout_s), slow_snapshot, throw_in_snapshot, "
                        "cuda_error (a non-sticky CUDA error: the drafter restarts in its process), "
                        "cuda_sticky (an illegal address: the worker process exits 75 and is "
                        "restarted), abort (the worker process aborts and is restarted); each "
                        "fires once per run.  The line then reports each recovery")
    p.add_argument("--set", action="append", default=[], help="passed to tandem run (KEY=VALUE)")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds for `tandem run` (0: none); past it the line is partial")
    p.add_argument("--setup-only", action="store_true",
                   help="write target/, data/ and run.toml into --work (kept), print a line and stop")
    a = p.parse_args()
    if a.setup_only and not a.work:
        p.error("--setup-only needs --work (a temporary folder would be deleted)")
    stop = {"why": None}

    def on_signal(sig, _frame):
        stop["why"] = f"signal {sig}"

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    s = SIZES[a.size]
    work = a.work or tempfile.mkdtemp(prefix="tandem_pipeline_")
    t0 = time.time()
    try:
        if not os.path.exists(os.path.join(work, "target", "config.json")):
            shutil.rmtree(os.path.join(work, "target"), ignore_errors=True)
            import torch
            gen_device = a.target_device.split(",")[0] if torch.cuda.is_available() else "cpu"
            print(f"pipeline: writing a random {a.size} target into {work}/target", file=sys.stderr, flush=True)
            make_target(os.path.join(work, "target"), s, gen_device)
        if not os.path.exists(os.path.join(work, "data", "manifest.json")):
            shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
            make_data(os.path.join(work, "data"), s["vocab_size"], 2000, s["seq"] // 6, s["seq"], s["mask"])
        prep_s = time.time() - t0
        targets = [d.strip() for d in a.target_device.split(",") if d.strip()]
        drafters = [d.strip() for d in a.drafter_device.split(",") if d.strip()]
        # A group step needs one batch per drafter in flight.
        credits = max(4, -(-2 * len(drafters) // len(targets)))
        quoted = lambda ds: ", ".join(f'"{d}"' for d in ds)
        with open(os.path.join(work, "run.toml"), "w") as f:
            f.write(f"""[model]
target = "target"
[drafter]
layers = {s['drafter_layers']}
mask_token_id = {s['mask']}
[data]
path = "data"
seq_len = {s['seq']}
anchors = {s['anchors']}
[train]
max_steps = {a.steps}
log_every = 1
[placement]
targets = [{quoted(targets)}]
drafters = [{quoted(drafters)}]
[runtime]
credits = {credits}
[checkpoint]
every_steps = 0
on_signal = false
[metrics]
progress = false
[run]
output_dir = "out"
""")
        if a.setup_only:
            print(json.dumps({"case": "pipeline", "setup_only": True, "size": a.size, "work": work,
                              "setup_s": round(prep_s, 1)}))
            return 0
        shutil.rmtree(os.path.join(work, "out"), ignore_errors=True)
        t1 = time.time()
        cmd = [a.tandem, "run", os.path.join(work, "run.toml")]
        for f in a.fault:
            cmd += ["--fault", f]
        for kv in a.set:
            cmd += ["--set", kv]
        if stop["why"]:
            print(json.dumps({"case": "pipeline", "error": f"stopped during setup ({stop['why']})"}))
            return 1
        metrics = metrics_reader(os.path.join(work, "out", "metrics.jsonl"))
        print(f"pipeline: setup {time.time() - t0:.0f} s; {' '.join(cmd)}", file=sys.stderr, flush=True)
        stopped = None
        seen = 0
        with open(os.path.join(work, "tandem.stderr"), "w+") as err:
            # Its own process group: `tandem run` and the worker process it
            # supervises are stopped together.
            # stdout too: the actors' log lines (spdlog's default logger,
            # e.g. the drafter's "starting it held the drafter") go there.
            proc = subprocess.Popen(cmd, stdout=err, stderr=err, start_new_session=True)
            while proc.poll() is None:
                time.sleep(1)
                seen = progress(metrics.read(), seen, a.steps)
                if a.timeout and time.time() - t1 > a.timeout:
                    stop["why"] = f"--timeout {a.timeout:g} s"
                if stop["why"]:
                    stopped = stop["why"]
                    print(f"pipeline: stopping tandem run ({stopped})", file=sys.stderr, flush=True)
                    # (a SIGTERM would write a checkpoint first: minutes at 8b)
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    proc.wait()
                    break
            progress(metrics.read(), seen, a.steps)
            err.seek(0)
            stderr_all = err.read()
            stderr_tail = stderr_all[-2000:]
            # A process of the run that died of a fatal signal prints its stack
            # (report_crashes), even where nothing was restarted (teardown).
            crashes = [l for l in stderr_all.splitlines() if ": fatal signal " in l]
            # Snapshots whose start held a drafter (actors/drafter.cpp says so past 250 ms).
            held = [l.strip() for l in stderr_all.splitlines() if "starting it held the drafter" in l]
        run_s = time.time() - t1
        if proc.returncode != 0 and not stopped:
            print(json.dumps({"case": "pipeline", "error": f"tandem run exited {proc.returncode}",
                              "stderr_tail": stderr_tail}))
            return 1
        rows = metrics.read()
        out = summarize(rows, a, targets, drafters, prep_s, run_s)
        out["fatal_signals"] = crashes
        out["snapshot_holds"] = held
        if crashes:
            # The stacks go to this script's stderr too: --work is often deleted
            # right after (tools/gpu-host/ratios.sh removes its 16 GB target).
            first = stderr_all.find(crashes[0])
            print(f"pipeline: {len(crashes)} fatal signal(s), stacks in {err.name}:\n"
                  f"{stderr_all[first:first + 12000]}", file=sys.stderr, flush=True)
        if stopped:
            out.update(complete=False, stopped=stopped)
        if "error" in out:
            print(json.dumps(out))
            return 1
        print(json.dumps(out))
        return 0
    finally:
        if not a.keep and not a.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
