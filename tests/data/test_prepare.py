#!/usr/bin/env python3
"""Tests of tools/prepare/tandem_prepare.py (the Python half of `tandem prepare`).

    ${TANDEM_PYTHON} tests/data/test_prepare.py [-v] [TestCase.test_name ...]

Plain unittest, no pytest. Builds two small real tokenizers with
tools/prepare/make_test_tokenizer.py (ChatML and a Qwen3-style thinking template) in a
temporary folder, runs the preparer mostly in this process (main(argv)) and twice as a
separate process (exit status, byte-reproducibility across processes), and reads every
data set back with the safetensors package. Expected masks are the assistant contents as
written in the test, plus the template's end-of-turn token: the supervised tokens are
decoded span by span and compared with them. Ends with the line `N passed, M failed`;
exit status 1 on any failure.
"""

import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREPARE_DIR = os.path.join(REPO, "tools", "prepare")
PREPARE = os.path.join(PREPARE_DIR, "tandem_prepare.py")
sys.path.insert(0, PREPARE_DIR)

import make_test_tokenizer  # noqa: E402
import tandem_prepare  # noqa: E402

import numpy as np  # noqa: E402
from safetensors import safe_open  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

EOT = "<|im_end|>"
TMP = None  # module temporary folder
TOK = {}  # template name -> tokenizer folder
HF = {}  # template name -> loaded tokenizer


def setUpModule():
    global TMP
    TMP = tempfile.mkdtemp(prefix="tandem-prepare-test-")
    for name in ("chatml", "qwen3", "tools"):
        TOK[name] = os.path.join(TMP, "tok-" + name)
        make_test_tokenizer.build(TOK[name], name)
        HF[name] = AutoTokenizer.from_pretrained(TOK[name], local_files_only=True)


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------

_counter = [0]


def fresh(name):
    _counter[0] += 1
    return os.path.join(TMP, f"{name}-{_counter[0]}")


def write_jsonl(lines, name="in.jsonl"):
    """lines: dicts (dumped as JSON), str or bytes (written verbatim)."""
    path = os.path.join(fresh("input"), name)
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line, ensure_ascii=False)
            f.write((line if isinstance(line, bytes) else line.encode("utf-8")) + b"\n")
    return path


def prepare(inputs, *extra, template="chatml", output=None):
    """Runs main() in this process; returns (exit status, stderr text, output folder)."""
    output = output or fresh("out")
    argv = ["--tokenizer", TOK[template], "--output", output, "--quiet", *extra, *inputs]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = tandem_prepare.main(argv)
    return rc, err.getvalue(), output


def sha256_of(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def load_dataset(test, out):
    """Reads a data set back and checks it against docs/data.md; returns (manifest, samples)
    with samples a list of (ids int32, mask uint8)."""
    with open(os.path.join(out, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    test.assertEqual(list(manifest), ["format", "created_by", "tokenizer", "options", "inputs", "shards",
                                      "totals", "report", "content_hash"])
    test.assertEqual(manifest["format"], "tandem.dataset.v1")
    test.assertTrue(manifest["created_by"].startswith("tandem prepare "))
    vocab = manifest["tokenizer"]["vocab_size"]
    samples = []
    totals = {"samples": 0, "tokens": 0, "supervised": 0}
    files = sorted(f for f in os.listdir(out) if f.startswith("shard-"))
    test.assertEqual(files, [s["file"] for s in manifest["shards"]])
    for k, shard in enumerate(manifest["shards"]):
        path = os.path.join(out, shard["file"])
        test.assertEqual(shard["file"], f"shard-{k:05d}.safetensors")
        test.assertEqual(shard["sha256"], sha256_of(path))
        with safe_open(path, "np") as f:
            meta = f.metadata()
            tokens, mask, offsets = (f.get_tensor(n) for n in ("tokens", "loss_mask", "offsets"))
        test.assertEqual(meta, {"format": "tandem.shard.v1", "num_samples": str(shard["num_samples"]),
                                "num_tokens": str(shard["num_tokens"])})
        test.assertEqual((tokens.dtype, mask.dtype, offsets.dtype),
                         (np.dtype(np.int32), np.dtype(np.uint8), np.dtype(np.int64)))
        n, t = shard["num_samples"], shard["num_tokens"]
        test.assertEqual((tokens.shape, mask.shape, offsets.shape), ((t,), (t,), (n + 1,)))
        test.assertEqual(int(offsets[0]), 0)
        test.assertEqual(int(offsets[-1]), t)
        test.assertTrue(bool(np.all(np.diff(offsets) >= 0)))
        test.assertTrue(bool(np.all((tokens >= 0) & (tokens < vocab))))
        test.assertTrue(bool(np.all(mask <= 1)))
        test.assertEqual(int(mask.sum()), shard["num_supervised"])
        for i in range(n):
            a, b = int(offsets[i]), int(offsets[i + 1])
            samples.append((tokens[a:b].copy(), mask[a:b].copy()))
        totals["samples"] += n
        totals["tokens"] += t
        totals["supervised"] += shard["num_supervised"]
    test.assertEqual(manifest["totals"], totals)
    content = hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest()
    test.assertEqual(manifest["content_hash"], content)
    report = manifest["report"]
    test.assertEqual(report["lines"], totals["samples"] + report["invalid_lines"] + report["dropped_short"])
    test.assertEqual(sum(report["by_format"].values()), totals["samples"])
    test.assertFalse([f for f in os.listdir(out) if f.endswith(".tmp")])
    return manifest, samples


def runs(ids, mask, value=1):
    """Decoded text of each maximal run of tokens whose mask == value."""
    out, start = [], None
    for i in range(len(ids) + 1):
        inside = i < len(ids) and mask[i] == value
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            out.append(HF_DECODE(ids[start:i]))
            start = None
    return out


def HF_DECODE(ids):
    return HF["chatml"].decode([int(x) for x in ids], skip_special_tokens=False)


def sharegpt(*turns, system=None):
    conv = [{"from": "system", "value": system}] if system else []
    for k, text in enumerate(turns):
        conv.append({"from": "human" if k % 2 == 0 else "gpt", "value": text})
    return {"conversations": conv}


def openai(*turns, system=None):
    msgs = [{"role": "system", "content": system}] if system else []
    for k, text in enumerate(turns):
        msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": text})
    return {"messages": msgs}


LONG_A = ("Two plus two is four. That is a simple sum, and the answer is four. "
          "Let me know if there is anything else you want to know.")
LONG_B = ("Paris is the capital of France. It is also the largest city of France, "
          "on the river Seine, and the home of the Louvre.")
LONG_C = ("You're welcome! Thank you for your questions. The sea is wide, the sea is deep, "
          "the waves roll in while sailors sleep.")


# ----------------------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------------------

class Masks(unittest.TestCase):
    """Loss masks, span by span, for every input format and template path."""

    def check_conversation(self, line, messages, expected, template="chatml", extra=()):
        rc, err, out = prepare([write_jsonl([line])], "--min-supervised", "1", *extra, template=template)
        self.assertEqual(rc, 0, err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(len(samples), 1)
        ids, mask = samples[0]
        self.assertEqual(runs(ids, mask), expected)
        # Same ids as the tokenizer's own apply_chat_template (DFLASH.md pitfall 5).
        kwargs = {}
        if "--no-enable-thinking" in extra:
            kwargs["enable_thinking"] = False
        want = HF[template].apply_chat_template(messages, tokenize=True, return_dict=False, **kwargs)
        self.assertEqual([int(x) for x in ids], list(want))
        return ids, mask, manifest

    def test_openai_tool_calls_and_answers(self):
        # An assistant turn that calls a tool is supervised with its <tool_call> block (the
        # drafter learns to draft calls); the tool's answer is not; the line's function
        # definitions reach the template; content null on a calling turn is "".
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        line = {"tools": tools, "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": '{"temp": 21}'},
            {"role": "assistant", "content": LONG_B}]}
        rc, err, out = prepare([write_jsonl([line])], "--min-supervised", "1", template="tools")
        self.assertEqual(rc, 0, err)
        _, samples = load_dataset(self, out)
        ids, mask = samples[0]
        called = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        self.assertEqual(runs(ids, mask), [called + EOT, LONG_B + EOT])
        self.assertIn("<tools>", "".join(runs(ids, mask, 0)))
        self.assertIn("<tool_response>", "".join(runs(ids, mask, 0)))
        msgs = [dict(m, content=m["content"] or "") for m in line["messages"]]
        want = HF["tools"].apply_chat_template(msgs, tools=tools, tokenize=True, return_dict=False)
        self.assertEqual([int(x) for x in ids], list(want))
        # Prompts for eval (--prompts-out) and --regenerate do not take them: refused by name.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            tandem_prepare.main(["--tokenizer", TOK["tools"], "--prompts-out", os.path.join(TMP, "p-tools.jsonl"),
                                 "--quiet", write_jsonl([line])])
        self.assertIn("tool messages and tool calls are supported in training data", err.getvalue())

    def test_sharegpt_single_turn(self):
        line = sharegpt("What is two plus two?", LONG_A, system="Be brief.")
        msgs = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is two plus two?"},
                {"role": "assistant", "content": LONG_A}]
        ids, mask, manifest = self.check_conversation(line, msgs, [LONG_A + EOT])
        unsupervised = "".join(runs(ids, mask, 0))
        self.assertEqual(unsupervised, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                                       "What is two plus two?<|im_end|>\n<|im_start|>assistant\n\n")
        self.assertEqual(manifest["report"]["by_format"], {"sharegpt": 1, "openai": 0, "tokenized": 0})

    def test_sharegpt_role_aliases(self):
        line = {"conversations": [{"from": "user", "value": "Hello!"},
                                  {"from": "assistant", "value": LONG_A},
                                  {"from": "human", "value": "And?"},
                                  {"from": "model", "value": LONG_B}]}
        msgs = [{"role": "user", "content": "Hello!"}, {"role": "assistant", "content": LONG_A},
                {"role": "user", "content": "And?"}, {"role": "assistant", "content": LONG_B}]
        self.check_conversation(line, msgs, [LONG_A + EOT, LONG_B + EOT])

    def test_openai_multi_turn(self):
        turns = ("What is two plus two?", LONG_A, "Capital of France?", LONG_B, "Thanks", LONG_C)
        line = openai(*turns)
        msgs = line["messages"]
        ids, mask, _ = self.check_conversation(line, msgs, [LONG_A + EOT, LONG_B + EOT, LONG_C + EOT])
        unsupervised = runs(ids, mask, 0)
        # Default system prompt, user turns and every role header are context, not targets.
        self.assertIn("You are a helpful assistant.", unsupervised[0])
        for k, text in enumerate(unsupervised[:3]):
            self.assertTrue(text.endswith("<|im_start|>assistant\n"), text)
        for user in ("What is two plus two?", "Capital of France?", "Thanks"):
            self.assertTrue(any(user in u for u in unsupervised))
            self.assertFalse(any(user in s for s in runs(ids, mask)))

    def test_unicode_content(self):
        answer = "Voilà: 日本語のテキスト, emoji 🦊🚀, math ∑x² — done. " * 3
        line = openai("Say something in many scripts, ünïcödé please.", answer)
        self.check_conversation(line, line["messages"], [answer + EOT])

    def test_last_turn_only(self):
        line = openai("What is two plus two?", LONG_A, "Capital of France?", LONG_B, "Thanks", LONG_C)
        ids, mask, manifest = self.check_conversation(
            line, line["messages"], [LONG_C + EOT], extra=("--last-turn-only",))
        self.assertTrue(manifest["options"]["last_turn_only"])
        self.assertIn(LONG_A, "".join(runs(ids, mask, 0)))

    def test_assistant_first_uses_sentinel_path(self):
        # No prefix exists to render before the first message: the header is found with a
        # sentinel (and includes the template's default system prompt).
        line = openai(system=None)
        line["messages"] = [{"role": "assistant", "content": LONG_A},
                            {"role": "user", "content": "Capital of France?"},
                            {"role": "assistant", "content": LONG_B}]
        ids, mask, _ = self.check_conversation(line, line["messages"], [LONG_A + EOT, LONG_B + EOT])
        self.assertEqual(runs(ids, mask, 0)[0],
                         "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>assistant\n")

    def test_qwen3_default_thinking(self):
        # Prefix path: the last turn (after the last user message) carries the template's
        # empty think block, which the model generates at serve time; earlier turns do not.
        line = openai("What is two plus two?", LONG_A, "Capital of France?", LONG_B)
        self.check_conversation(line, line["messages"],
                                [LONG_A + EOT, "<think>\n\n</think>\n\n" + LONG_B + EOT], template="qwen3")

    def test_qwen3_reasoning(self):
        first = "<think>Add them.</think>" + LONG_A
        last = "<think>\nRecall geography.\n</think>\n\n" + LONG_B
        line = openai("What is two plus two?", first, "Capital of France?", last)
        self.check_conversation(line, line["messages"],
                                [LONG_A + EOT, "<think>\nRecall geography.\n</think>\n\n" + LONG_B + EOT],
                                template="qwen3")

    def test_qwen3_no_thinking(self):
        # The generation prompt ends with an empty think block, which the history form of the
        # earlier turn lacks: not prefix-stable there, so the sentinel path finds its header.
        line = openai("What is two plus two?", LONG_A, "Capital of France?", LONG_B)
        ids, mask, manifest = self.check_conversation(
            line, line["messages"], [LONG_A + EOT, LONG_B + EOT], template="qwen3",
            extra=("--no-enable-thinking",))
        self.assertEqual(manifest["options"]["chat_template_kwargs"], {"enable_thinking": False})
        self.assertTrue(runs(ids, mask, 0)[-2].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"))

    def test_qwen3_no_thinking_with_reasoning_is_invalid(self):
        # Reasoning in a sample rendered for non-thinking serving cannot be placed: invalid.
        bad = openai("Capital of France?", "<think>Recall.</think>" + LONG_B)
        good = openai("Capital of France?", LONG_B)
        path = write_jsonl([good, bad])
        rc, err, out = prepare([path], "--no-enable-thinking", template="qwen3")
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{path}:2: cannot locate assistant message 1", err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual((len(samples), manifest["report"]["invalid_lines"]), (1, 1))

    def test_tokenized_taken_as_is(self):
        ids = [(7 * i + 3) % 400 + 3 for i in range(50)]
        mask = [1 if 10 <= i < 45 else 0 for i in range(50)]
        rc, err, out = prepare([write_jsonl([{"input_ids": ids, "loss_mask": mask}])])
        self.assertEqual(rc, 0, err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual([int(x) for x in samples[0][0]], ids)
        self.assertEqual([int(x) for x in samples[0][1]], mask)
        self.assertEqual(manifest["report"]["by_format"], {"sharegpt": 0, "openai": 0, "tokenized": 1})

    def test_auto_mixed_formats(self):
        lines = [sharegpt("What is two plus two?", LONG_A), openai("Capital of France?", LONG_B),
                 {"input_ids": list(range(3, 53)), "loss_mask": [1] * 50}, openai("Thanks", LONG_C)]
        rc, err, out = prepare([write_jsonl(lines)])
        self.assertEqual(rc, 0, err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(manifest["report"]["by_format"], {"sharegpt": 1, "openai": 2, "tokenized": 1})
        self.assertEqual(runs(*samples[1]), [LONG_B + EOT])  # input order is kept
        self.assertEqual(runs(*samples[3]), [LONG_C + EOT])

    def test_explicit_format_rejects_other_lines(self):
        path = write_jsonl([sharegpt("What is two plus two?", LONG_A), openai("Capital of France?", LONG_B)])
        rc, err, out = prepare([path], "--format", "openai")
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{path}:1: no 'messages' field (--format openai)", err)
        manifest, _ = load_dataset(self, out)
        self.assertEqual(manifest["options"]["input_format"], "openai")
        self.assertEqual(manifest["report"]["by_format"], {"sharegpt": 0, "openai": 1, "tokenized": 0})


class Dataset(unittest.TestCase):
    """Shards, manifest, streaming, determinism."""

    def many_lines(self, n):
        answers = (LONG_A, LONG_B, LONG_C)
        return [openai(f"Question number {i}?", answers[i % 3] + f" ({i})") if i % 2
                else sharegpt(f"Question number {i}?", answers[i % 3] + f" [{i}]") for i in range(n)]

    def test_round_trip_manifest(self):
        path = write_jsonl(self.many_lines(20))
        rc, err, out = prepare([path], "--block-size", "8", "--tandem-version", "9.9.9")
        self.assertEqual(rc, 0, err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(len(samples), 20)
        self.assertEqual(manifest["created_by"], "tandem prepare 9.9.9")
        tok = manifest["tokenizer"]
        self.assertEqual(tok["source"], TOK["chatml"])
        self.assertEqual(tok["vocab_size"], len(HF["chatml"]))
        self.assertEqual(tok["sha256"], sha256_of(os.path.join(TOK["chatml"], "tokenizer.json")))
        # Special token ids, checked against the target's config.json at `tandem run`.
        hf = HF["chatml"]
        self.assertIsNotNone(hf.eos_token_id)
        self.assertEqual(tok["eos_token_id"], hf.eos_token_id)
        self.assertEqual(tok["bos_token_id"], hf.bos_token_id)  # None: written as null
        self.assertEqual(tok["pad_token_id"], hf.pad_token_id)
        template = HF["chatml"].get_chat_template()
        self.assertEqual(tok["chat_template_sha256"], hashlib.sha256(template.encode()).hexdigest())
        with open(os.path.join(TOK["chatml"], "chat_template.jinja"), encoding="utf-8") as f:
            self.assertEqual(f.read(), template)  # the hash is of the file's text
        self.assertEqual(manifest["options"], {"block_size": 8, "min_supervised": 16, "max_length": 3072,
                                               "last_turn_only": False, "input_format": "auto",
                                               "chat_template_kwargs": {}})
        self.assertEqual(manifest["report"], {"lines": 20, "invalid_lines": 0, "dropped_short": 0,
                                              "truncated": 0,
                                              "by_format": {"sharegpt": 10, "openai": 10, "tokenized": 0}})
        # Safetensors layout of the C++ reader: header padded to 8, offsets/tokens/loss_mask.
        with open(os.path.join(out, "shard-00000.safetensors"), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        self.assertEqual(n % 8, 0)
        self.assertEqual(list(header), ["__metadata__", "offsets", "tokens", "loss_mask"])

    def test_streaming_several_shards(self):
        lines = self.many_lines(40)
        path = write_jsonl(lines)
        rc, err, one = prepare([path])
        self.assertEqual(rc, 0, err)
        m1, s1 = load_dataset(self, one)
        self.assertEqual(len(m1["shards"]), 1)
        rc, err, many = prepare([path], "--shard-tokens", "400", "--max-length", "400")
        self.assertEqual(rc, 0, err)
        m2, s2 = load_dataset(self, many)
        self.assertGreaterEqual(len(m2["shards"]), 5)
        self.assertTrue(all(0 < s["num_tokens"] <= 400 for s in m2["shards"]))
        self.assertEqual(m2["report"]["truncated"], 0)
        # The same samples in the same order, only cut into shards differently.
        self.assertEqual(len(s1), len(s2))
        for (a, am), (b, bm) in zip(s1, s2):
            self.assertTrue(np.array_equal(a, b) and np.array_equal(am, bm))
        self.assertEqual(m1["totals"], m2["totals"])

    def test_several_inputs_and_gzip(self):
        lines = self.many_lines(10)
        plain1, plain2 = write_jsonl(lines[:6]), write_jsonl(lines[6:])
        rc, err, ref = prepare([plain1, plain2])
        self.assertEqual(rc, 0, err)
        gz = plain2 + ".gz"
        with open(plain2, "rb") as src, gzip.open(gz, "wb") as dst:
            dst.write(src.read())
        rc, err, out = prepare([plain1, gz])
        self.assertEqual(rc, 0, err)
        self.assertEqual(load_dataset(self, ref)[0]["content_hash"], load_dataset(self, out)[0]["content_hash"])

    def test_determinism_in_process_and_cli(self):
        path = write_jsonl(self.many_lines(30))
        args = ("--shard-tokens", "1000", "--max-length", "1000")
        rc, err, a = prepare([path], *args)
        self.assertEqual(rc, 0, err)
        rc, err, b = prepare([path], *args)
        self.assertEqual(rc, 0, err)
        # A separate process (other hash seed, one tokenizer thread) writes the same bytes.
        c = fresh("out")
        proc = subprocess.run([sys.executable, PREPARE, "--tokenizer", TOK["chatml"], "--output", c,
                               "--threads", "1", *args, path], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("prepare: wrote 30 samples", proc.stderr)
        ma, mb, mc = (load_dataset(self, d)[0] for d in (a, b, c))
        self.assertGreater(len(ma["shards"]), 1)
        self.assertEqual(ma["content_hash"], mb["content_hash"])
        self.assertEqual(ma["content_hash"], mc["content_hash"])
        for shard in ma["shards"]:
            with open(os.path.join(a, shard["file"]), "rb") as f:
                data = f.read()
            for d in (b, c):
                with open(os.path.join(d, shard["file"]), "rb") as f:
                    self.assertEqual(f.read(), data)

    def test_existing_output_needs_overwrite(self):
        path = write_jsonl(self.many_lines(20))
        rc, err, out = prepare([path], "--shard-tokens", "400", "--max-length", "400")
        self.assertEqual(rc, 0, err)
        self.assertGreater(len(load_dataset(self, out)[0]["shards"]), 1)
        rc, err, _ = prepare([path], output=out)
        self.assertEqual(rc, 2)
        self.assertIn("already holds a data set", err)
        rc, err, _ = prepare([path], "--overwrite", output=out)
        self.assertEqual(rc, 0, err)
        manifest, _ = load_dataset(self, out)  # stale shards are gone
        self.assertEqual([s["file"] for s in manifest["shards"]], ["shard-00000.safetensors"])


    def test_reuse_keeps_an_identical_data_set_and_refuses_another(self):
        path = write_jsonl(self.many_lines(6))
        rc, err, out = prepare([path], "--reuse")
        self.assertEqual(rc, 0, err)
        manifest, _ = load_dataset(self, out)
        self.assertEqual(manifest["inputs"], [{"path": os.path.abspath(path),
                                               "sha256": sha256_of(path),
                                               "bytes": os.path.getsize(path)}])
        shard = os.path.join(out, manifest["shards"][0]["file"])
        before = os.stat(shard).st_mtime_ns
        rc, err, _ = prepare([path], "--reuse", output=out)
        self.assertEqual(rc, 0, err)
        self.assertIn("reusing it", err)
        self.assertEqual(os.stat(shard).st_mtime_ns, before)  # not rewritten
        rc, err, _ = prepare([path], "--reuse", "--max-length", "500", output=out)
        self.assertEqual(rc, 2)
        self.assertIn("prepared from other options", err)
        other = write_jsonl(self.many_lines(5))
        rc, err, _ = prepare([other], "--reuse", output=out)
        self.assertEqual(rc, 2)
        self.assertIn("prepared from other inputs", err)
        rc, err, _ = prepare([other], "--reuse", "--overwrite", output=out)
        self.assertEqual(rc, 0, err)
        self.assertEqual(load_dataset(self, out)[0]["inputs"][0]["sha256"], sha256_of(other))
        os.unlink(os.path.join(out, load_dataset(self, out)[0]["shards"][0]["file"]))
        rc, err, _ = prepare([other], "--reuse", output=out)  # damaged: prepared again
        self.assertEqual(rc, 0, err)
        self.assertNotIn("reusing it", err)
        load_dataset(self, out)


class BadInput(unittest.TestCase):
    """Invalid lines, dropped and truncated samples, unusable tokenizers, exit status."""

    def test_bad_lines_skipped_counted_reported(self):
        good = openai("What is two plus two?", LONG_A)
        vocab = len(HF["chatml"])
        lines = [
            good,                                                                   # 1
            "{not json",                                                            # 2
            "[1, 2, 3]",                                                            # 3
            {"text": "hello"},                                                      # 4
            {"conversations": [{"from": "human"}]},                                 # 5
            {"conversations": [{"from": "robot", "value": "beep"}]},                # 6
            "",                                                                     # 7 blank: ignored
            {"input_ids": [5, 6, 7], "loss_mask": [1, 1]},                          # 8
            {"input_ids": [5, vocab, 7], "loss_mask": [1, 1, 1]},                   # 9
            {"input_ids": [5, -1], "loss_mask": [1, 1]},                            # 10
            {"messages": [{"role": "user", "content": "Hi"},
                          {"role": "assistant", "content": "a <|im_end|> b"}]},     # 11
            {"input_ids": [5, "x"], "loss_mask": [1, 1]},                           # 12
            {"input_ids": [5, 6], "loss_mask": [1, 2]},                             # 13
            {"messages": [], "input_ids": [5]},                                     # 14
            b'{"messages": "\xff\xfe"}',                                            # 15
            good,                                                                   # 16
        ]
        path = write_jsonl(lines)
        rc, err, out = prepare([path])
        self.assertEqual(rc, 0, err)
        expected = {
            2: "invalid JSON",
            3: "not a JSON object",
            4: "unknown format",
            5: "conversations[0] has no 'value'",
            6: "conversations[0]: unknown 'from' 'robot'",
            8: "'input_ids' and 'loss_mask' differ in length (3 vs 2)",
            9: f"input_ids[1] = {vocab} is outside the vocabulary [0, {vocab})",
            10: "input_ids[1] = -1 is outside the vocabulary",
            11: "assistant message 1 contains the end-of-turn marker '<|im_end|>'",
            12: "input_ids[1] is not an integer",
            13: "loss_mask[1] is not 0 or 1",
            14: "ambiguous format",
            15: "invalid JSON",
        }
        for line_no, reason in expected.items():
            self.assertIn(f"{path}:{line_no}: {reason}", err)
        self.assertNotIn(f"{path}:7:", err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(len(samples), 2)
        self.assertEqual(manifest["report"]["lines"], len(lines) - 1)
        self.assertEqual(manifest["report"]["invalid_lines"], len(expected))

    def test_only_first_invalid_lines_reported(self):
        limit = tandem_prepare.MAX_REPORTED_LINES
        path = write_jsonl(["garbage"] * (limit + 15) + [openai("What is two plus two?", LONG_A)])
        rc, err, out = prepare([path])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{path}:{limit}: invalid JSON", err)
        self.assertNotIn(f"{path}:{limit + 1}:", err)
        self.assertIn("and 15 more invalid lines", err)
        self.assertEqual(load_dataset(self, out)[0]["report"]["invalid_lines"], limit + 15)

    def test_lone_surrogate_is_one_bad_line(self):
        # Legal JSON ("\ud800" alone decodes to a lone surrogate) that no UTF-8 holds: the
        # tokenizer refused the whole batch with a TypeError and prepare died with a Python
        # traceback (exit 1), through `tandem run` too.  Now the line alone is invalid, named.
        good = openai("What is two plus two?", LONG_A)
        lines = [good,
                 '{"messages": [{"role": "user", "content": "bad \\ud800 half"}, '
                 '{"role": "assistant", "content": "fine"}]}',
                 '{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a \\udfff"}]}',
                 '{"messages": [{"role": "user", "content": "a whole pair \\ud83d\\ude00 is fine"}, '
                 '{"role": "assistant", "content": ' + json.dumps(LONG_A) + '}]}',
                 {"input_ids": [5, 6], "loss_mask": None},
                 good]
        path = write_jsonl(lines)
        rc, err, out = prepare([path])
        self.assertEqual(rc, 0, err)
        self.assertIn(f"{path}:2: messages[0].content is not valid Unicode: a lone surrogate '\\ud800' "
                      "at character 4", err)
        self.assertIn(f"{path}:3: conversations[1].value is not valid Unicode: a lone surrogate '\\udfff'", err)
        self.assertIn(f"{path}:5: 'loss_mask' is null, not a list", err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual((len(samples), manifest["report"]["invalid_lines"]), (3, 3))
        # The prompts for eval (--prompts-out) take the same check.
        prompts = os.path.join(TMP, "p-surrogate.jsonl")
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = tandem_prepare.main(["--tokenizer", TOK["chatml"], "--prompts-out", prompts, "--quiet", path])
        self.assertEqual(rc, 0, err.getvalue())
        self.assertIn(f"{path}:2: messages[0].content is not valid Unicode", err.getvalue())
        with open(prompts) as f:
            self.assertEqual(json.loads(f.readline())["count"], 3)  # lines 1, 4, 6

    def test_dropped_short_and_truncated(self):
        long_answer = " ".join(["The sea is wide, the sea is deep."] * 40)
        lines = [
            openai("Hi", "Hello!"),                             # too few supervised tokens
            openai("Hi", LONG_A),                               # kept
            openai("Write a long poem.", long_answer),          # truncated, kept
            {"messages": [{"role": "user", "content": "No answer here."}]},  # nothing supervised
            {"input_ids": list(range(3, 403)), "loss_mask": [0] * 390 + [1] * 10},  # supervised tail cut
        ]
        rc, err, out = prepare([write_jsonl(lines)], "--max-length", "200", "--block-size", "8")
        self.assertEqual(rc, 0, err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(manifest["options"]["min_supervised"], 16)
        report = manifest["report"]
        self.assertEqual((report["dropped_short"], report["truncated"], len(samples)), (3, 1, 2))
        self.assertEqual(len(samples[1][0]), 200)
        self.assertTrue(runs(*samples[1])[0].startswith("The sea is wide"))
        self.assertEqual(runs(*samples[0]), [LONG_A + EOT])

    def test_all_bad_exits_nonzero(self):
        path = write_jsonl(["nope", {"foo": 1}, openai("Hi", "Hello!")])
        out = fresh("out")
        proc = subprocess.run([sys.executable, PREPARE, "--tokenizer", TOK["chatml"], "--output", out, path],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2, proc.stderr)  # bad input, as a missing one is
        self.assertIn("no sample survived", proc.stderr)
        self.assertIn(f"{path}:1: invalid JSON", proc.stderr)
        self.assertFalse(os.path.exists(out))  # nothing made: not even an empty folder
        # Nor the parents it made for a nested output; a parent that was there stays.
        top = fresh("nest")
        os.makedirs(top)
        nested = os.path.join(top, "a", "b", "out")
        proc = subprocess.run([sys.executable, PREPARE, "--tokenizer", TOK["chatml"], "--output", nested, path],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(os.listdir(top), [])

    def test_failed_overwrite_keeps_the_old_data_set(self):
        good = write_jsonl([openai("What is two plus two?", LONG_A)])
        rc, err, out = prepare([good])
        self.assertEqual(rc, 0, err)
        before = load_dataset(self, out)[0]["content_hash"]
        bad = write_jsonl(["nope"])
        rc, err, _ = prepare([bad], "--overwrite", output=out)
        self.assertEqual(rc, 2, err)  # no sample survived: bad input
        self.assertIn("left as it was", err)
        self.assertEqual(load_dataset(self, out)[0]["content_hash"], before)
        torn = os.path.join(os.path.dirname(bad), "torn.jsonl.gz")
        with open(torn, "wb") as f:
            f.write(gzip.compress((json.dumps(openai("Hi", LONG_A)) + "\n").encode() * 50)[:60])
        rc, err, _ = prepare([torn], "--overwrite", output=out)
        self.assertEqual(rc, 1, err)
        self.assertIn(f"{torn}: cannot read past line", err)
        self.assertEqual(load_dataset(self, out)[0]["content_hash"], before)
        self.assertFalse(os.path.exists(os.path.join(out, ".partial")))

    def test_interrupted_prepare_leaves_no_half_data_set(self):
        # Shards left without a manifest (a prepare killed before the staging folder
        # existed) are not a data set: a plain prepare replaces them.
        path = write_jsonl([openai("What is two plus two?", LONG_A)])
        out = fresh("out")
        os.makedirs(out)
        open(os.path.join(out, "shard-00000.safetensors"), "wb").close()
        rc, err, _ = prepare([path], output=out)
        self.assertEqual(rc, 0, err)
        load_dataset(self, out)

    def test_output_through_a_symlink(self):
        # The staging folder is inside OUTPUT, so a link to another folder (another
        # filesystem, in the field) is replaced in place, the old set kept on failure.
        real = fresh("real")
        os.makedirs(real)
        link = fresh("link")
        os.symlink(real, link)
        rc, err, _ = prepare([write_jsonl([openai("What is two plus two?", LONG_A)])], output=link)
        self.assertEqual(rc, 0, err)
        before = load_dataset(self, real)[0]["content_hash"]
        rc, err, _ = prepare([write_jsonl(["nope"])], "--overwrite", output=link)
        self.assertEqual(rc, 2, err)  # no sample survived
        self.assertEqual(load_dataset(self, real)[0]["content_hash"], before)
        rc, err, _ = prepare([write_jsonl([openai("Hi", LONG_A)] * 3)], "--overwrite", output=link)
        self.assertEqual(rc, 0, err)
        self.assertNotEqual(load_dataset(self, real)[0]["content_hash"], before)
        self.assertTrue(os.path.islink(link))

    def test_reuse_prepares_a_truncated_shard_again(self):
        path = write_jsonl([openai("What is two plus two?", LONG_A)])
        rc, err, out = prepare([path], "--reuse")
        self.assertEqual(rc, 0, err)
        shard = os.path.join(out, "shard-00000.safetensors")
        with open(shard, "r+b") as f:
            f.truncate(os.path.getsize(shard) - 3)
        rc, err, _ = prepare([path], "--reuse", output=out)
        self.assertEqual(rc, 0, err)
        self.assertIn("is damaged", err)
        self.assertNotIn("reusing it", err)
        load_dataset(self, out)

    def test_unusable_tokenizer_dirs(self):
        path = write_jsonl([openai("What is two plus two?", LONG_A)])
        missing = os.path.join(TMP, "no-such-tokenizer")
        empty = fresh("tok-empty")
        os.makedirs(empty)
        no_template = fresh("tok-no-template")
        shutil.copytree(TOK["chatml"], no_template)
        os.unlink(os.path.join(no_template, "chat_template.jinja"))
        for tok_dir, message in ((missing, "does not exist"), (empty, "has no tokenizer.json"),
                                 (no_template, "has no chat template")):
            out = fresh("out")
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                rc = tandem_prepare.main(["--tokenizer", tok_dir, "--output", out, path])
            self.assertEqual(rc, 2, err.getvalue())
            self.assertIn(tok_dir, err.getvalue())
            self.assertIn(message, err.getvalue())
            self.assertFalse(os.path.exists(out))
        # Token ids need no template.
        tok_path = write_jsonl([{"input_ids": list(range(3, 53)), "loss_mask": [1] * 50}])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = tandem_prepare.main(["--tokenizer", no_template, "--output", fresh("out"),
                                      "--format", "tokenized", tok_path])
        self.assertEqual(rc, 0, err.getvalue())

    def test_openai_content_parts(self):
        parts = {"messages": [{"role": "user", "content": [{"type": "text", "text": "What is two "},
                                                           {"type": "text", "text": "plus two?"}]},
                              {"role": "assistant", "content": [{"type": "text", "text": LONG_A}]}]}
        image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                              {"role": "assistant", "content": LONG_A}]}
        rc, err, out = prepare([write_jsonl([parts, image, openai("What is two plus two?", LONG_A)])])
        self.assertEqual(rc, 0, err)
        self.assertIn("messages[0].content[0] is not a text part ('image_url')", err)
        manifest, samples = load_dataset(self, out)
        self.assertEqual(manifest["report"]["invalid_lines"], 1)
        self.assertEqual(len(samples), 2)
        self.assertEqual(samples[0][0].tolist(), samples[1][0].tolist())  # parts = the plain string

    def test_options_that_do_not_apply(self):
        path = write_jsonl([openai("Hi", LONG_A)])
        for extra, msg in ((["--limit", "3"], "--limit applies only to --prompts-out"),
                           (["--temperature", "0.5"], "--temperature applies only with --regenerate"),
                           (["--max-new-tokens", "8"], "--max-new-tokens applies only with --regenerate"),
                           (["--target", TMP], "--target applies only with --regenerate")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as ctx:
                tandem_prepare.main(["--tokenizer", TOK["chatml"], "--output", fresh("out"), *extra, path])
            self.assertEqual(ctx.exception.code, 2)
            self.assertIn(msg, err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as ctx:
            tandem_prepare.main(["--tokenizer", TOK["chatml"], "--output", fresh("out"), path, path])
        self.assertEqual(ctx.exception.code, 2)
        self.assertIn("is given twice", err.getvalue())
        for extra, msg in ((["--top-p", "0"], "--top-p must be in (0, 1]"),
                           (["--top-k", "-1"], "--top-k must not be negative"),
                           (["--seed", "-1"], "--seed must not be negative"),
                           (["--max-new-tokens", "0"], "must be at least 1"),
                           (["--device", "gpu"], "expected cpu, cuda, cuda:N or auto")):
            err = io.StringIO()
            with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as ctx:
                tandem_prepare.main(["--tokenizer", TOK["chatml"], "--output", fresh("out"), "--regenerate",
                                     "--target", TMP, *extra, path])
            self.assertEqual(ctx.exception.code, 2)
            self.assertIn(msg, err.getvalue())

    def test_bad_options(self):
        path = write_jsonl([openai("What is two plus two?", LONG_A)])
        for extra in (("--shard-tokens", "100", "--max-length", "200"), ("--block-size", "0")):
            with contextlib.redirect_stderr(io.StringIO()), self.assertRaises(SystemExit) as ctx:
                prepare([path], *extra)
            self.assertEqual(ctx.exception.code, 2)
        rc, err, _ = prepare([os.path.join(TMP, "missing.jsonl")])
        self.assertEqual(rc, 2)
        self.assertIn("missing.jsonl does not exist", err)
        # A path that names nothing is named with its option.
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = tandem_prepare.main(["--tokenizer", os.path.join(TMP, "no-tokenizer"), "--output", fresh("out"), path])
        self.assertEqual(rc, 2)
        self.assertIn(f"--tokenizer {os.path.join(TMP, 'no-tokenizer')} does not exist", err.getvalue())
        err = io.StringIO()
        with contextlib.redirect_stderr(err), self.assertRaises(SystemExit) as ctx:
            tandem_prepare.main(["--tokenizer", TOK["chatml"], "--prompts-out",
                                 os.path.join(TMP, "no-folder", "p.jsonl"), path])
        self.assertEqual(ctx.exception.code, 2)
        self.assertIn(f"--prompts-out {os.path.join(TMP, 'no-folder', 'p.jsonl')}: no folder", err.getvalue())
        # Prompts of a file with no conversation in it (not JSONL): bad input (2), each line named.
        bad = write_jsonl(["not json", "{\"foo\": 1}"])
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = tandem_prepare.main(["--tokenizer", TOK["chatml"], "--prompts-out", os.path.join(TMP, "p-bad.jsonl"),
                                      "--quiet", bad])
        self.assertEqual(rc, 2, err.getvalue())
        self.assertIn(f"{bad}:1: invalid JSON", err.getvalue())
        self.assertIn(f"no prompt in {bad}", err.getvalue())


def main():
    verbosity = 2 if "-v" in sys.argv[1:] else 1
    names = [a for a in sys.argv[1:] if not a.startswith("-")]
    loader = unittest.TestLoader()
    suite = (loader.loadTestsFromNames(names, sys.modules[__name__]) if names
             else loader.loadTestsFromModule(sys.modules[__name__]))
    result = unittest.TextTestRunner(stream=sys.stderr, verbosity=verbosity).run(suite)
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.testsRun - failed - len(result.skipped)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed or result.testsRun == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
