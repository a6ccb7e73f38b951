#!/usr/bin/env python3
"""`tandem eval` against independent references, on the CPU in float32, at temperature 0.

    check_reference.py TANDEM PYTHON_UNUSED SOURCE_DIR DRAFTER WORK [--prompts N] [--max-new-tokens M]
                       [--plants none,always_accept,shifted_drafts]

DRAFTER is a drafter Tandem trained (a run folder or a checkpoint); the tiny default's
target and tokenizer (SOURCE_DIR/config/default) are the target.  The script

1. exports the drafter with `tandem export` (bf16, the z-lab layout) and loads the export
   with the `dflash` package (DFlashDraftModel.from_pretrained) - the export round trip;
2. runs `tandem eval --json --device cpu` with that export on the first N held-out
   conversations of config/default/data/eval.jsonl;
3. renders the same prompts with the tokenizer's own apply_chat_template (not Tandem's
   prepare script) and, per prompt, runs
   - `dflash.model.dflash_generate` (transformers' Qwen3 target in float32 and the export):
     the same new tokens and the same per-cycle acceptance lengths as Tandem's;
   - the target's own greedy decoding (transformers `generate`, do_sample=False): the same
     tokens (speculative decoding is lossless);
4. checks that the case is not vacuous: some cycle produced more than one token, some did
   not, and a block shorter than the drafter's (the tail path) was drafted.

--plants runs step 2 and the checks once per entry, the references computed once: "none"
(Tandem as built) must pass every check, and each planted bug (TANDEM_TEST_PLANT, a
deliberate error in Tandem's acceptance rule) must fail one.  Exit status 0 when all of that
holds, 1 otherwise, 77 (SKIPPED) without the dflash package.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("tandem")
    ap.add_argument("python")
    ap.add_argument("source")
    ap.add_argument("drafter")
    ap.add_argument("work")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=60)
    ap.add_argument("--plants", default="none",
                    help="comma-separated: none (must pass) and planted bugs (each must be caught)")
    args = ap.parse_args()
    try:
        import torch
        import dflash.model as dm
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    torch.set_num_threads(2)
    default = os.path.join(args.source, "config", "default")
    target_dir, tok_dir = os.path.join(default, "target"), os.path.join(default, "tokenizer")
    prompts_file = os.path.join(default, "data", "eval.jsonl")
    os.makedirs(args.work, exist_ok=True)
    export = os.path.join(args.work, "export")
    shutil.rmtree(export, ignore_errors=True)  # an earlier run's: tandem export refuses a non-empty --out

    # 1. Export, then the dflash package loads it.
    subprocess.run([args.tandem, "export", args.drafter, "--out", export, "--target", target_dir],
                   check=True)
    assert os.path.isfile(os.path.join(export, "README.md")), "export wrote no model card"
    draft = dm.DFlashDraftModel.from_pretrained(export, torch_dtype=torch.float32).eval()
    target = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(tok_dir)

    # 2-4, once per plant; the references (3) are the same for all of them.
    dm._cuda_time = lambda: __import__("time").perf_counter()  # no torch.cuda.synchronize on the CPU
    stop = [tok.eos_token_id]
    with open(prompts_file) as f:
        lines = [json.loads(line) for line in f if line.strip()][:args.prompts]
    references = {}

    def reference(i, ids):
        if i not in references:
            x = torch.tensor([ids])
            ref = dm.dflash_generate(draft, target, x, args.max_new_tokens, stop, temperature=0.0,
                                     return_stats=True)
            greedy = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=args.max_new_tokens,
                                     do_sample=False, eos_token_id=stop, pad_token_id=stop[0])
            references[i] = (ref.output_ids[0, len(ids):].tolist(), list(ref.acceptance_lengths),
                             greedy[0, len(ids):].tolist())
        return references[i]

    def check(plant):
        env = dict(os.environ, TANDEM_TEST_PLANT="" if plant == "none" else plant)
        out = subprocess.run([args.tandem, "eval", "--target", target_dir, "--tokenizer", tok_dir,
                              "--drafter", export, "--prompts", prompts_file, "--limit", str(args.prompts),
                              "--max-new-tokens", str(args.max_new_tokens), "--device", "cpu", "--json",
                              "--quiet"], check=True, capture_output=True, text=True, env=env)
        sys.stderr.write(out.stderr)
        report = json.loads(out.stdout.strip().splitlines()[-1])
        assert report["schema"] == "tandem.eval.v1", report.get("schema")
        assert len(report["prompts"]) == args.prompts, len(report["prompts"])
        bs = report["block_size"]
        failures = []
        cycles, tails = [], 0
        for i, (conv, mine) in enumerate(zip(lines, report["prompts"])):
            msgs = conv["messages"]
            cut = next(k for k, m in enumerate(msgs) if m["role"] == "assistant")
            ids = tok.apply_chat_template(msgs[:cut], add_generation_prompt=True, tokenize=True)["input_ids"]
            if len(ids) != mine["prompt_tokens"]:
                failures.append(f"prompt {i}: {mine['prompt_tokens']} tokens rendered by Tandem, {len(ids)} "
                                "by apply_chat_template")
                continue
            ref_tokens, ref_lengths, greedy_tokens = reference(i, ids)
            if ref_tokens != mine["tokens"]:
                k = next((j for j, (a, b) in enumerate(zip(ref_tokens, mine["tokens"])) if a != b),
                         min(len(ref_tokens), len(mine["tokens"])))
                failures.append(f"prompt {i}: tokens differ from dflash_generate's at new token {k} "
                                f"({len(mine['tokens'])} vs {len(ref_tokens)} tokens)")
            if ref_lengths != mine["acceptance_lengths"]:
                failures.append(f"prompt {i}: acceptance lengths {mine['acceptance_lengths']} != "
                                f"dflash_generate's {ref_lengths}")
            if greedy_tokens != mine["tokens"]:
                k = next((j for j, (a, b) in enumerate(zip(greedy_tokens, mine["tokens"])) if a != b),
                         min(len(greedy_tokens), len(mine["tokens"])))
                failures.append(f"prompt {i}: not the target's greedy decoding (transformers generate): "
                                f"first difference at new token {k}")
            # Replay the cycles' block sizes: min(Bs, max_length - start).
            start, max_length = len(ids), len(ids) + args.max_new_tokens
            for p in mine["acceptance_lengths"]:
                tails += min(bs, max_length - start) < bs
                start += p
            cycles += mine["acceptance_lengths"]
            if plant == "none":
                print(f"prompt {i}: {len(ids)} prompt tokens, {len(mine['tokens'])} new, cycles "
                      f"{mine['acceptance_lengths']}")
        # 4. Not vacuous.
        if not any(p > 1 for p in cycles):
            failures.append("no cycle produced more than one token (the drafter accepted nothing)")
        if all(p == bs for p in cycles):
            failures.append("every cycle accepted the whole block")
        if tails == 0:
            failures.append("no cycle drafted a block shorter than the drafter's (the tail path)")
        if plant == "none":
            print(f"tau {report['tau']:.3f} over {report['cycles']} cycles, histogram {report['histogram']}, "
                  f"{tails} tail cycles")
        return failures

    bad = False
    for plant in args.plants.split(","):
        failures = check(plant)
        if plant == "none":
            for f in failures:
                print("FAILED:", f)
            bad |= bool(failures)
        elif failures:
            print(f"planted bug {plant!r} caught ({len(failures)} failures, first: {failures[0]})")
        else:
            print(f"FAILED: planted bug {plant!r} went unnoticed")
            bad = True
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
