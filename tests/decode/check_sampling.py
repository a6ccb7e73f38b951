#!/usr/bin/env python3
"""Speculative sampling in `tandem eval` is lossless in distribution (CPU, float32).

    check_sampling.py TANDEM PYTHON_UNUSED SOURCE_DIR DRAFTER WORK [--samples N] [--temperature T]
                      [--expect-fail]

One held-out prompt of the tiny default (config/default/data/eval.jsonl, its first
conversation, the user turn cut after its first ~300 characters) is decoded N times by `tandem eval --temperature T` with DRAFTER (a drafter
Tandem trained), each time for 3 new tokens: the first comes from prefill, the next two from
one speculative cycle (drafted by the drafter, accepted or rejected against the target's
probabilities, a bonus or residual sample after). The exact distribution of the three tokens
under the target alone at temperature T is enumerated with `transformers` (float32; the
`dflash` package's _sampling_probs transform): every prefix of probability >= 1e-5 is
extended, the rest pooled as "other". The statistic is the total-variation distance between
Tandem's empirical distribution of the triples and the exact one. Its threshold is the 99.9th
percentile of the same distance for N draws from the exact distribution itself (2000
simulated runs): a correct sampler fails about once in a thousand runs.

The test is not vacuous: it asserts that the drafter's drafts were accepted in some runs
(a cycle that produced 2 tokens) and rejected in others. With --expect-fail (a planted bug,
TANDEM_TEST_PLANT=always_accept) it exits 0 only if the distance exceeds the threshold.
Exit status 0 pass, 1 fail, 77 (SKIPPED) without torch/transformers/dflash.
"""

import argparse
import collections
import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

NEW_TOKENS = 3
PRUNE = 1e-5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tandem")
    ap.add_argument("python")
    ap.add_argument("source")
    ap.add_argument("drafter")
    ap.add_argument("work")
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--expect-fail", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        from dflash.model import _sampling_probs
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    torch.set_num_threads(2)
    default = os.path.join(args.source, "config", "default")
    target_dir, tok_dir = os.path.join(default, "target"), os.path.join(default, "tokenizer")
    with open(os.path.join(default, "data", "eval.jsonl")) as f:
        conv = json.loads(f.readline())
    # A short prompt (the user turn's first lines): 600 prefills stay cheap on 2 cores.
    user = next(m for m in conv["messages"] if m["role"] == "user")
    user["content"] = user["content"][:user["content"].index("\n", 300) + 1]
    os.makedirs(args.work, exist_ok=True)
    prompts = os.path.join(args.work, "same_prompt.jsonl")
    with open(prompts, "w") as f:
        for _ in range(args.samples):
            f.write(json.dumps(conv) + "\n")

    # Tandem: N speculative samples of the first three new tokens.
    env = dict(os.environ)
    out = subprocess.run([args.tandem, "eval", "--target", target_dir, "--tokenizer", tok_dir,
                          "--drafter", args.drafter, "--prompts", prompts, "--max-new-tokens",
                          str(NEW_TOKENS), "--temperature", str(args.temperature), "--seed",
                          str(args.seed), "--device", "cpu", "--no-baseline", "--json", "--quiet"],
                         check=True, capture_output=True, text=True, env=env)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    triples = [tuple(p["tokens"]) for p in report["prompts"]]
    cycles = [p["acceptance_lengths"] for p in report["prompts"]]
    assert all(len(t) == NEW_TOKENS for t in triples), "a sample ended early (a stop token)"
    accepted = sum(1 for c in cycles if c and c[0] > 1)

    # The exact distribution of the triple under the target alone.
    tok = AutoTokenizer.from_pretrained(tok_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    msgs = conv["messages"]
    cut = next(k for k, m in enumerate(msgs) if m["role"] == "assistant")
    prompt = tok.apply_chat_template(msgs[:cut], add_generation_prompt=True, tokenize=True)["input_ids"]
    exact = {(): 1.0}
    with torch.inference_mode():
        for _ in range(NEW_TOKENS):
            prefixes = list(exact)
            x = torch.tensor([prompt + list(p) for p in prefixes])
            logits = target(x).logits[:, -1].float()
            probs = _sampling_probs(logits, args.temperature).double()
            grown = {}
            for p, row in zip(prefixes, probs):
                mass = exact[p]
                for t in torch.nonzero(row * mass >= PRUNE).flatten().tolist():
                    grown[p + (t,)] = mass * float(row[t])
            exact = grown
    support = list(exact)
    other = max(0.0, 1.0 - sum(exact.values()))
    pmf = torch.tensor([exact[s] for s in support] + [other], dtype=torch.float64)
    pmf = pmf / pmf.sum()
    index = {s: i for i, s in enumerate(support)}
    counts = torch.zeros(len(pmf), dtype=torch.float64)
    for t in triples:
        counts[index.get(t, len(support))] += 1
    tv = 0.5 * float((counts / len(triples) - pmf).abs().sum())

    # The null distribution of the distance: N draws from the exact pmf, 2000 times.
    gen = torch.Generator().manual_seed(12345)
    draws = torch.multinomial(pmf.repeat(2000, 1), len(triples), replacement=True, generator=gen)
    sims = torch.zeros(2000, len(pmf), dtype=torch.float64).scatter_add_(
        1, draws, torch.ones_like(draws, dtype=torch.float64)) / len(triples)
    null = 0.5 * (sims - pmf).abs().sum(1)
    threshold = float(torch.quantile(null, 0.999))
    print(f"{len(triples)} samples at temperature {args.temperature}: {len(support)} enumerated triples "
          f"(+ other, mass {other:.2e}); first cycle accepted a draft in {accepted} runs; "
          f"TV distance {tv:.4f}, threshold {threshold:.4f} (null median {float(null.median()):.4f})")
    failures = []
    if tv > threshold:
        failures.append(f"TV distance {tv:.4f} > {threshold:.4f}: not the target's distribution")
    if accepted == 0:
        failures.append("no run accepted a draft: the test would not exercise acceptance")
    if accepted == len(triples):
        failures.append("every run accepted a draft: the test would not exercise rejection")
    for f in failures:
        print("FAILED:", f)
    if args.expect_fail:
        if any("TV distance" in f for f in failures):
            print(f"planted bug {os.environ.get('TANDEM_TEST_PLANT')!r} caught")
            return 0
        print(f"FAILED: planted bug {os.environ.get('TANDEM_TEST_PLANT')!r} went unnoticed")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
