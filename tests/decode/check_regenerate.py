#!/usr/bin/env python3
"""`tandem prepare --regenerate` on the tiny default target (CPU, float32).

    check_regenerate.py TANDEM SOURCE_DIR WORK

Three held-out conversations (config/default/data/eval.jsonl), two of them given a second
user turn and assistant turn, are regenerated with at most 24 new tokens a turn, in batches
of 2. Checks:
1. every assistant turn is the target's own greedy continuation (transformers `generate`,
   do_sample=False, stopping at <|im_end|>) of the conversation before it, the second turn
   conditioned on the regenerated first one;
2. the shards are written (3 samples), and the report line names the turns and tokens;
3. resuming: with round 2 cut short (one finished generation and a torn line, progress
   rolled back to round 1), the same command finishes and writes identical conversations;
4. a different option (another --max-new-tokens) on the same work folder is refused
   without --overwrite;
5. so are regenerations of a target whose weights changed since (modification time).
Exit status 0 pass, 1 fail, 77 (SKIPPED) without torch/transformers.
"""

import json
import os
import shutil
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
MAX_NEW = 24


def main():
    tandem, source, work = sys.argv[1:4]
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print(f"SKIPPED: {e}")
        return 77
    torch.set_num_threads(2)
    default = os.path.join(source, "config", "default")
    target_dir, tok_dir = os.path.join(default, "target"), os.path.join(default, "tokenizer")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    with open(os.path.join(default, "data", "eval.jsonl")) as f:
        convs = [json.loads(line) for line, _ in zip(f, range(3))]
    for c in convs[:2]:
        c["messages"] += [{"role": "user", "content": "Go on."},
                          {"role": "assistant", "content": "(to be regenerated)"}]
    inp = os.path.join(work, "in.jsonl")
    with open(inp, "w") as f:
        f.writelines(json.dumps(c) + "\n" for c in convs)
        # Line 4: starts with an assistant turn, so there is no prompt to regenerate it from:
        # counted invalid with its line, the others regenerated.
        f.write(json.dumps({"messages": [{"role": "assistant", "content": "Hi!"},
                                         {"role": "user", "content": "Go on."},
                                         {"role": "assistant", "content": "(to be regenerated)"}]}) + "\n")
    out = os.path.join(work, "out")
    cmd = [tandem, "prepare", inp, "--regenerate", "--target", target_dir, "--tokenizer", tok_dir,
           "--output", out, "--max-new-tokens", str(MAX_NEW), "--batch", "2", "--device", "cpu",
           "--min-supervised", "1"]
    failures = []
    first = subprocess.run(cmd, capture_output=True, text=True)
    print(first.stderr[-1500:])
    if first.returncode != 0:
        print("FAILED: tandem prepare --regenerate exited", first.returncode)
        return 1
    regen_dir = out + ".regen"
    with open(os.path.join(regen_dir, "conversations.jsonl")) as f:
        regenerated = [json.loads(line) for line in f]
    with open(os.path.join(regen_dir, "regenerated.jsonl")) as f:
        samples_out = [json.loads(line) for line in f]

    # 1. Greedy continuations, turn by turn.
    tok = AutoTokenizer.from_pretrained(tok_dir)
    target = AutoModelForCausalLM.from_pretrained(target_dir, torch_dtype=torch.float32).eval()
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    turns = 0
    for i, (orig, new) in enumerate(zip(convs, regenerated)):
        msgs = new["messages"]
        if len(msgs) != len(orig["messages"]):
            failures.append(f"conversation {i}: {len(msgs)} messages, expected {len(orig['messages'])}")
            continue
        for k, m in enumerate(msgs):
            if m["role"] != "assistant":
                if m != orig["messages"][k]:
                    failures.append(f"conversation {i}: message {k} ({m['role']}) changed")
                continue
            ids = tok.apply_chat_template(msgs[:k], add_generation_prompt=True, tokenize=True)["input_ids"]
            x = torch.tensor([ids])
            g = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW,
                                do_sample=False, eos_token_id=[tok.eos_token_id, eot],
                                pad_token_id=tok.eos_token_id)[0, len(ids):].tolist()
            if g and g[-1] in (tok.eos_token_id, eot):
                g = g[:-1]
            want = tok.decode(g, skip_special_tokens=False)
            turns += 1
            if k == len(msgs) - 1:  # the sample holds the last turn's ids exactly, supervised
                sample = samples_out[i]
                full = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_NEW,
                                       do_sample=False, eos_token_id=[tok.eos_token_id, eot],
                                       pad_token_id=tok.eos_token_id)[0].tolist()
                if sample["input_ids"] != full:
                    failures.append(f"conversation {i}: the sample's ids are not the prompt's and the "
                                    "target's generated ids")
                if sample["loss_mask"][len(ids):] != [1] * (len(full) - len(ids)):
                    failures.append(f"conversation {i}: the generated ids are not all supervised")
                if k > 2 and sum(sample["loss_mask"][:len(ids)]) == 0:
                    failures.append(f"conversation {i}: the earlier assistant turn is not supervised")
            if m["content"] != want:
                failures.append(f"conversation {i}, message {k}: not the target's greedy continuation:\n"
                                f"  got  {m['content'][:120]!r}\n  want {want[:120]!r}")
    if turns != 5:
        failures.append(f"{turns} assistant turns checked, expected 5")

    # 2. Shards and report.
    with open(os.path.join(out, "manifest.json")) as f:
        manifest = json.load(f)
    samples = manifest["totals"]["samples"]
    if samples != 3:
        failures.append(f"{samples} samples in the shards, expected 3")
    report = manifest["report"]
    if (report["lines"], report["invalid_lines"]) != (4, 1):
        failures.append(f"report counts {report['lines']} lines, {report['invalid_lines']} invalid; "
                        "expected the input's 4 lines, 1 invalid")
    if [i["path"] for i in manifest["inputs"]] != [os.path.abspath(inp)]:
        failures.append(f"manifest inputs {manifest['inputs']} are not the original input")
    if manifest.get("regeneration", {}).get("turns") != 5:
        failures.append(f"manifest regeneration record: {manifest.get('regeneration')}")
    if f"{inp}:4: the conversation starts with an assistant turn" not in first.stderr:
        failures.append("the assistant-first line is not reported with its FILE:LINE")
    if "regenerated 5 assistant turns of 3 conversations" not in first.stderr:
        failures.append("the report does not say 'regenerated 5 assistant turns of 3 conversations'")

    # 3. Resume from a round cut short.
    progress_file = os.path.join(regen_dir, "progress.json")
    with open(progress_file) as f:
        progress = json.load(f)
    progress["rounds_done"] = 1
    with open(progress_file, "w") as f:
        json.dump(progress, f)
    round2 = os.path.join(regen_dir, "round-2.generated.jsonl")
    with open(round2) as f:
        lines = f.readlines()
    with open(round2, "w") as f:
        f.write(lines[0] + lines[1] + lines[2][: len(lines[2]) // 2])  # header, one done, one torn
    os.remove(os.path.join(regen_dir, "regenerated.jsonl"))
    again = subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True)
    if again.returncode != 0:
        failures.append(f"the resumed run exited {again.returncode}: {again.stderr[-800:]}")
    else:
        if "resuming" not in again.stderr:
            failures.append("the resumed run did not say it resumed")
        with open(os.path.join(regen_dir, "regenerated.jsonl")) as f:
            resumed = [json.loads(line) for line in f]
        if resumed != samples_out:
            failures.append("the resumed run wrote other conversations")

    # 4. Other options on the same work folder.
    refused = subprocess.run([a if a != str(MAX_NEW) else "30" for a in cmd], capture_output=True, text=True)
    if refused.returncode == 0 or "other inputs or options" not in refused.stderr:
        failures.append(f"other options on the same work folder were not refused: {refused.stderr[-400:]}")

    # 5. The target's weights changed at the same path (here: a copy of the target whose
    # weights file is rewritten with the same bytes, a newer modification time): its
    # regenerations are not reused without --overwrite.
    moved = os.path.join(work, "target")
    shutil.copytree(target_dir, moved)
    cmd_moved = [a if a != target_dir else moved for a in cmd]
    subprocess.run(cmd_moved + ["--overwrite"], capture_output=True, text=True, check=False)
    weights = [n for n in os.listdir(moved) if n.endswith(".safetensors")]
    for n in weights:
        p = os.path.join(moved, n)
        st = os.stat(p)
        os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    stale = subprocess.run(cmd_moved, capture_output=True, text=True)
    if stale.returncode == 0 or "its config.json or weights have changed since" not in stale.stderr:
        failures.append(f"regenerations of a target whose weights changed were reused: {stale.stderr[-400:]}")

    for f in failures:
        print("FAILED:", f)
    print(f"{turns} turns checked; {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
