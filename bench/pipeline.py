#!/usr/bin/env python3
"""End-to-end pipeline benchmark: `tandem run` with targets and drafters on their own GPUs
(default one of each, cuda:0 and cuda:1) at Qwen3-8B DFlash shapes, on random weights and
synthetic token data, and one JSON line: samples/s, tokens/s, step time, the drafters'
data-wait share (overall and per drafter).

    python bench/pipeline.py --tandem build/bin/tandem [--work DIR] [--steps 60]
                                   [--target-device cuda:0[,cuda:1...]]
                                   [--drafter-device cuda:1[,cuda:2...]]
                                   [--size 8b|tiny] [--keep] [--timeout S]

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
data_wait_share_incl_recovery counts it).  Needs torch, numpy and safetensors.

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

import numpy as np
import torch
from safetensors.numpy import save_file as save_np
from safetensors.torch import save_file as save_torch

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


def make_data(out, vocab, samples, lo, hi):
    os.makedirs(out)
    rng = np.random.default_rng(0)
    toks, masks, lens = [], [], []
    for _ in range(samples):
        n = int(rng.integers(lo, hi))
        toks.append(rng.integers(0, vocab - 2, size=n).astype(np.int32))
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


def summarize(rows, a, targets, drafters, prep_s, run_s):
    """The JSON line from metrics rows (complete or not)."""
    all_steps = [x for x in rows if x.get("event") == "step"]
    # Skip the first --skip optimizer steps (every drafter's report of them).
    numbers = sorted({x["step"] for x in all_steps})
    kept = set(numbers[a.skip:])
    steps = [x for x in all_steps if x["step"] in kept]
    if not steps:
        return {"case": "pipeline", "error": "no steps after --skip", "rows": len(rows)}
    # A drafter's first step after a failure waited for the recovery (its own
    # restart, or the group re-formed around it), not for data: that wait is
    # reported apart (recovery_wait_s) and left out of data_wait_share.
    recovering, flagged = set(), set()
    for x in rows:
        if x.get("event") == "drafter_failed":
            recovering = {y.get("drafter", 0) for y in all_steps}
        elif x.get("event") == "step" and x.get("drafter", 0) in recovering:
            recovering.discard(x.get("drafter", 0))
            flagged.add(id(x))

    def data_wait(xs):
        return sum(x["wait_ms"] for x in xs if id(x) not in flagged)

    wait = data_wait(steps)
    wait_all = sum(x["wait_ms"] for x in steps)
    compute = sum(x["compute_ms"] for x in steps)
    span_s = steps[-1]["time_s"] - steps[0]["time_s"]
    n = len(kept) - 1  # optimizer steps in the span (one report per drafter each)
    first = min(kept)
    batches = [x.get("batch") for x in steps]
    tokens = sum(x.get("tokens", 0) for x in steps if x["step"] != first)
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
           "step_ms_median": statistics.median(x["compute_ms"] + x["wait_ms"] for x in steps),
           "compute_ms_median": statistics.median(x["compute_ms"] for x in steps),
           "wait_ms_median": statistics.median(x["wait_ms"] for x in steps),
           "data_wait_share": wait / (wait + compute),
           "data_wait_share_incl_recovery": wait_all / (wait_all + compute),
           "recovery_wait_s": round((wait_all - wait) / 1000, 3),
           "steps_per_s": n / span_s if span_s > 0 else None,
           "tokens_per_s": tokens / span_s if span_s > 0 else None,
           "samples_per_s": None, "setup_s": round(prep_s, 1), "run_s": round(run_s, 1),
           "last_loss": steps[-1]["loss"], "unique_batches": len(set(batches))}
    # Each failure: when it was detected, when training resumed (the first step
    # report after it), steps lost and how the state was restored.
    recoveries = []
    for i, x in enumerate(rows):
        if x.get("event") != "drafter_failed":
            continue
        after = [y for y in rows[i + 1:] if y.get("event") == "step"]
        formed = [y for y in rows[i + 1:] if y.get("event") == "group_formed"]
        recoveries.append({
            "drafter": x.get("drafter"), "at_s": x.get("time_s"), "reason": x.get("reason", "")[:120],
            "steps_lost": x.get("steps_lost"), "restore_from": x.get("restore_from", "checkpoint"),
            "group_formed_after_s": formed[0]["time_s"] - x["time_s"] if formed else None,
            "training_again_after_s": after[0]["time_s"] - x["time_s"] if after else None})
    out["recoveries"] = recoveries
    end = [x for x in rows if x.get("event") == "checkpoint"]
    if end and span_s > 0:
        # committed samples over the measured span (one row per step packs ~S/avg samples)
        out["samples_per_s"] = end[-1].get("committed", 0) / (steps[-1]["time_s"] - rows[0].get("time_s", 0) + 1e-9)
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
                    "budget_exhausted", "end"):
            keep = {k: x[k] for k in ("drafter", "step", "reason", "restore_from", "steps_lost", "dir")
                    if k in x}
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
                   help="passed to tandem run (drafter=N,kind=throw|nan|hang,at_step=K); the line "
                        "then reports each recovery")
    p.add_argument("--set", action="append", default=[], help="passed to tandem run (KEY=VALUE)")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds for `tandem run` (0: none); past it the line is partial")
    a = p.parse_args()
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
            gen_device = a.target_device.split(",")[0] if torch.cuda.is_available() else "cpu"
            print(f"pipeline: writing a random {a.size} target into {work}/target", file=sys.stderr, flush=True)
            make_target(os.path.join(work, "target"), s, gen_device)
        if not os.path.exists(os.path.join(work, "data", "manifest.json")):
            shutil.rmtree(os.path.join(work, "data"), ignore_errors=True)
            make_data(os.path.join(work, "data"), s["vocab_size"], 2000, s["seq"] // 6, s["seq"])
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
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
            while proc.poll() is None:
                time.sleep(1)
                seen = progress(metrics.read(), seen, a.steps)
                if a.timeout and time.time() - t1 > a.timeout:
                    stop["why"] = f"--timeout {a.timeout:g} s"
                if stop["why"]:
                    stopped = stop["why"]
                    print(f"pipeline: stopping tandem run ({stopped})", file=sys.stderr, flush=True)
                    proc.kill()  # a SIGTERM would write a checkpoint first (minutes at 8b)
                    proc.wait()
                    break
            progress(metrics.read(), seen, a.steps)
            err.seek(0)
            stderr_tail = err.read()[-2000:]
        run_s = time.time() - t1
        if proc.returncode != 0 and not stopped:
            print(json.dumps({"case": "pipeline", "error": f"tandem run exited {proc.returncode}",
                              "stderr_tail": stderr_tail}))
            return 1
        rows = metrics.read()
        out = summarize(rows, a, targets, drafters, prep_s, run_s)
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
