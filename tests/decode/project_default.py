#!/usr/bin/env python3
"""How long the "long" tests (decode.default_whole + decode.default_claim) will
take on this machine, projected from the one-epoch run the test command's
decode.drafter_fixture leaves behind (its steps' times and its evaluation's).

    project_default.py FIXTURE_RUN DEFAULT_CONFIG

prints one JSON line: {"projected_s": ..., "seconds_per_step": ..., ...}.
.ci/run runs the long tests only when the projection fits in what is left of
CI's time; the whole default's time varies between 2-core machines (0.12 s a
step on one, 0.29-0.33 s on an AMD EPYC VM, where MKL's sgemm is slower at
these shapes), so a fixed guess does not do.
Exit 2, naming the file and what is missing, when it cannot project.
"""
import json
import math
import sys
import tomllib
from pathlib import Path

MARGIN = 1.15  # for the projection's own error (its rates are the first epoch's)


def fail(msg):
    print(f"project_default.py: {msg}", file=sys.stderr)
    sys.exit(2)


def main():
    if len(sys.argv) != 3:
        fail("usage: project_default.py FIXTURE_RUN DEFAULT_CONFIG")
    run, default = Path(sys.argv[1]), Path(sys.argv[2])
    metrics, fixture_cfg = run / "metrics.jsonl", run / "config.toml"
    for p in (metrics, fixture_cfg, default):
        if not p.is_file():
            fail(f"{p}: missing (did decode.drafter_fixture run?)")
    lines = []
    for n, line in enumerate(metrics.read_text().splitlines(), 1):
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError as e:
            fail(f"{metrics}:{n}: not JSON ({e})")
    steps = [l for l in lines if l.get("event") == "step"]
    evals = [l for l in lines if l.get("event") == "eval" and "seconds" in l]
    end = [l for l in lines if l.get("event") == "end"]
    if not steps or not evals or not end:
        fail(f"{metrics}: needs step, eval and end events (has {len(steps)}, {len(evals)}, {len(end)})")
    try:
        fixture = tomllib.loads(fixture_cfg.read_text())
        whole = tomllib.loads(default.read_text())
        fixture_epochs = fixture["data"]["epochs"]
        epochs = whole["data"]["epochs"]
        eval_every = whole["eval"]["every_steps"]
        eval_count = whole["eval"]["count"]
        eval_prompts = default.parent / whole["eval"]["prompts"]
    except (tomllib.TOMLDecodeError, KeyError) as e:
        fail(f"{fixture_cfg} or {default}: {e!r}")
    if eval_count <= 0:  # 0: all of the file's prompts
        if not eval_prompts.is_file():
            fail(f"{eval_prompts}: missing (eval.prompts of {default})")
        eval_count = sum(1 for l in eval_prompts.read_text().splitlines() if l.strip())
    seconds_per_step = steps[-1]["time_s"] / steps[-1]["step"]
    seconds_per_prompt = sum(e["seconds"] for e in evals) / sum(e["prompts"] for e in evals)
    whole_steps = end[-1]["steps"] * epochs / fixture_epochs
    evaluations = math.floor(whole_steps / eval_every) + 1  # every eval_every steps, and at the end
    prompts = eval_count
    train_s = whole_steps * seconds_per_step + evaluations * prompts * seconds_per_prompt
    # decode.default_claim: `tandem eval --references` decodes each prompt four
    # ways (the drafter, the untrained drafter, prompt lookup, target only).
    claim_s = 4 * prompts * seconds_per_prompt + 30
    print(json.dumps({
        "projected_s": round(MARGIN * (train_s + claim_s)),
        "seconds_per_step": round(seconds_per_step, 4),
        "seconds_per_prompt": round(seconds_per_prompt, 3),
        "whole_steps": round(whole_steps),
        "train_s": round(train_s),
        "claim_s": round(claim_s),
        "margin": MARGIN,
    }))


if __name__ == "__main__":
    main()
