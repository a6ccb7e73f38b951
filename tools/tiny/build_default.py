#!/usr/bin/env python3
"""Build Tandem's embedded default: a tiny trained Qwen3 target, its tokenizer, a chat data set.

    ~/.cache/tandem/venv/bin/python tools/tiny/build_default.py [OUT_DIR]    # default config/default

Writes OUT_DIR/
  tokenizer/   byte-level BPE (2048 ids incl. <|endoftext|> <|im_start|> <|im_end|> <|mask|>),
               tokenizer.json + tokenizer_config.json (PreTrainedTokenizerFast, ChatML template)
  data/        train.jsonl, eval.jsonl: OpenAI `messages` conversations cut from Python stdlib
               source files ("Continue `x.py`:" + lines -> the next lines); disjoint files
  target/      Qwen3ForCausalLM (8 layers, d 128, tied embeddings), trained here on the rendered
               train conversations, saved as bfloat16 safetensors
  build.json   corpus identity, configs, loss curve, final metrics (machine-readable)
  README.md    what these are and how they were made

Corpus: the Python standard library's own .py files, read from the running interpreter's
stdlib folder (or --corpus-root), restricted to the pinned list tools/tiny/corpus.txt
(split, sha256, path). Every file is hashed and compared with the pin before use; a missing
or different file stops the script (--allow-corpus-drift goes on with what is there and
says so in the outputs). The pin holds only files that are byte-identical in CPython
3.11.2 (Debian 12) and 3.11.7; `--write-pin --identical-in DIR` regenerates it.

Deterministic: fixed seeds (random.Random, torch.manual_seed before building the model,
a private torch.Generator for batch order), torch.set_num_threads(2), a fixed number of
steps. Two runs on the same machine give identical files; another CPU type may differ in the
last bits of the weights. CPU only, no network, no downloads.
"""

import argparse
import hashlib
import json
import math
import os
import platform
import random
import shutil
import sys
import sysconfig
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3Config, Qwen3ForCausalLM  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

HERE = os.path.dirname(os.path.abspath(__file__))
PIN_FILE = os.path.join(HERE, "corpus.txt")

# ----------------------------------------------------------------------------------------
# Constants
# ----------------------------------------------------------------------------------------
SEED = 20260509
THREADS = 2

# Corpus selection (only used by --write-pin; a normal run reads the pin).
SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__",
             "encodings", "pydoc_data", "__phello__", "turtledemo",
             "distutils", "lib2to3"}  # Debian ships these two in separate packages
MIN_FILE_BYTES, MAX_FILE_BYTES = 2_000, 64_000
EVAL_BYTES, TRAIN_BYTES = 90_000, 1_750_000
EVAL_MAX_FILE_BYTES = 24_000

# Conversations.
SYSTEM = "You complete Python modules."
USER_CHARS = (400, 2400)        # user context: whole lines until at least this many characters
ASSISTANT_CHARS = (800, 2400)   # assistant: whole lines until at least this many characters
MIN_ASSISTANT_CHARS = 300       # a shorter tail of a file makes no sample
MAX_SAMPLE_TOKENS = 1600        # rendered; longer conversations (data tables) are dropped

# Tokenizer.
BPE_VOCAB = 2044                # + 4 special tokens = 2048 ids
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
# Qwen2/Qwen3's pre-tokenizer split (tokenizer.json of Qwen/Qwen3-8B).
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Target model.
MODEL = dict(
    vocab_size=BPE_VOCAB + len(SPECIALS),
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=8,           # default DFlash taps for 8 layers: [1, 2, 3, 4, 5]
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=2048,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    hidden_act="silu",
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    initializer_range=0.02,
)
SAVE_DTYPE = torch.bfloat16

# Training: one conversation per step (the fastest learning per token measured on 2 cores),
# AdamW, in two phases. Phase 1 trains a 2-layer model (4x cheaper per token); then the model
# is grown to 8 layers, each trained layer becoming 4 consecutive copies whose o_proj and
# down_proj are scaled by 1/4 (see grow); phase 2 trains all 8 layers. At equal wall time this
# reached a far lower eval loss than 8 layers from scratch (measured on 2 idle cores: 2 then
# 8 layers 4.3 after ~155 s; 8 layers alone 5.4 after ~75 s; 4 layers 4.6 after ~115 s).
# Growing by inserting zero-initialised (identity) layers instead gave the same loss, but
# those layers stayed near identity (0.5% change of the residual), so DFlash's taps 1-3
# were near copies of layer 0's output; scaled copies keep every layer, and every tap, distinct.
PHASES = (
    # layers, steps, peak lr, final lr (cosine after WARMUP linear steps)
    (2, 1400, 3e-3, 2e-3),
    (8, 320, 2e-3, 3e-4),
)
WARMUP = 10
WEIGHT_DECAY = 0.1              # matrices only
BETAS = (0.9, 0.95)
CLIP = 1.0
EVALS_PER_PHASE = 2
LOG_EVERY = 100
EVAL_BATCH_TOKENS = 4096


def log(t0, msg):
    print(f"[{time.monotonic() - t0:6.1f}s] {msg}", flush=True)


def sha256_bytes(b):
    return hashlib.sha256(b).hexdigest()


def sha256_file(path):
    with open(path, "rb") as f:
        return sha256_bytes(f.read())


# ----------------------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------------------
def eligible_files(root):
    """Sorted stdlib-relative paths of candidate .py files under root."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("config-"))
        for f in files:
            if not f.endswith(".py") or f.startswith("_sysconfigdata"):
                continue
            p = os.path.join(d, f)
            n = os.path.getsize(p)
            if MIN_FILE_BYTES <= n <= MAX_FILE_BYTES:
                out.append(os.path.relpath(p, root).replace(os.sep, "/"))
    return sorted(out)


def write_pin(root, identical_in):
    """Choose the corpus (seeded shuffle of the eligible files) and write tools/tiny/corpus.txt."""
    files = []
    for rel in eligible_files(root):
        data = open(os.path.join(root, rel), "rb").read()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            continue
        same = True
        for other in identical_in:
            q = os.path.join(other, rel)
            same = same and os.path.isfile(q) and open(q, "rb").read() == data
        if same:
            files.append((rel, data))
    random.Random(SEED).shuffle(files)
    chosen, ev, tr = [], 0, 0
    for rel, data in files:
        if ev < EVAL_BYTES and len(data) <= EVAL_MAX_FILE_BYTES:  # several smaller eval files
            chosen.append(("eval", rel, data))
            ev += len(data)
        elif tr < TRAIN_BYTES:
            chosen.append(("train", rel, data))
            tr += len(data)
    chosen.sort(key=lambda x: (x[0] != "train", x[1]))
    lines = [f"{s} {sha256_bytes(d)} {r}\n" for s, r, d in chosen]
    with open(PIN_FILE, "w") as f:
        f.write("# Tandem embedded-default corpus: CPython 3.11 standard-library files.\n")
        f.write(f"# Written by tools/tiny/build_default.py --write-pin (Python {platform.python_version()},"
                f" root {root}; identical in: {', '.join(identical_in) or '-'}).\n")
        f.write(f"# {len(files)} eligible files; chosen: eval {ev} bytes, train {tr} bytes.\n")
        f.write("# split sha256 path-relative-to-the-stdlib-folder\n")
        f.writelines(lines)
    print(f"wrote {PIN_FILE}: {len(chosen)} files (eval {ev} B, train {tr} B) of {len(files)} eligible")


def read_corpus(root, allow_drift):
    """The pinned files' texts, checked against the pin. Returns (files, identity)."""
    pin = []
    for line in open(PIN_FILE):
        if line.startswith("#") or not line.strip():
            continue
        split, digest, rel = line.rstrip("\n").split(" ", 2)
        pin.append((split, digest, rel))
    files, drift, canon = [], [], []
    for split, digest, rel in pin:
        p = os.path.join(root, rel)
        if not os.path.isfile(p):
            drift.append(f"missing {rel}")
            continue
        data = open(p, "rb").read()
        actual = sha256_bytes(data)
        if actual != digest:
            drift.append(f"differs {rel}")
        canon.append(f"{split} {actual} {rel}\n")
        files.append((split, rel, data.decode("utf-8")))
    if drift and not allow_drift:
        sys.exit(f"build_default: the corpus under {root} is not the pinned one "
                 f"({len(drift)} of {len(pin)} files):\n  " + "\n  ".join(drift[:20])
                 + "\nUse a CPython 3.11 stdlib (--corpus-root), or --allow-corpus-drift to build anyway "
                   "(the outputs then record a different corpus sha256).")
    pinned_canon = "".join(f"{s} {d} {r}\n" for s, d, r in pin)
    identity = {
        "source": "CPython standard library (.py files), pinned in tools/tiny/corpus.txt",
        "python_version": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "files": len(files),
        "train_files": sum(1 for s, _, _ in files if s == "train"),
        "eval_files": sum(1 for s, _, _ in files if s == "eval"),
        "bytes": sum(len(t.encode()) for _, _, t in files),
        "sha256": sha256_bytes("".join(canon).encode()),
        "pinned_sha256": sha256_bytes(pinned_canon.encode()),
        "matches_pin": not drift,
        "drift": drift,
        "sha256_definition": "sha256 of the lines '<split> <sha256 of file> <path>\\n' in pin order "
                             "(= the non-comment lines of tools/tiny/corpus.txt)",
    }
    return files, identity


# ----------------------------------------------------------------------------------------
# Conversations
# ----------------------------------------------------------------------------------------
def take_lines(lines, start, min_chars):
    """End index: whole lines from start until at least min_chars characters (or the end)."""
    n, i = 0, start
    while i < len(lines) and n < min_chars:
        n += len(lines[i])
        i += 1
    return i


def conversations(rel, text):
    rng = random.Random(f"{SEED}:{rel}")  # str seeds hash with sha512: stable across runs
    lines = text.splitlines(keepends=True)
    out, pos = [], 0
    while pos < len(lines):
        u_end = take_lines(lines, pos, rng.randint(*USER_CHARS))
        while u_end < len(lines) and not lines[u_end].strip():
            u_end += 1  # the continuation starts at a non-blank line
        a_end = take_lines(lines, u_end, rng.randint(*ASSISTANT_CHARS))
        user, asst = "".join(lines[pos:u_end]), "".join(lines[u_end:a_end])
        pos = a_end
        if len(asst.strip()) < MIN_ASSISTANT_CHARS:
            continue
        # Exactly one trailing newline is dropped: the template's <|im_end|> ends the line.
        user = user[:-1] if user.endswith("\n") else user
        asst = asst[:-1] if asst.endswith("\n") else asst
        out.append({"messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Continue `{rel}`:\n{user}"},
            {"role": "assistant", "content": asst},
        ]})
    return out


def render(conv, generation_prompt=False):
    """The chat template written out in Python (checked against transformers below).
    Returns (text, [(start, end) of supervised spans: assistant content + <|im_end|>])."""
    text, spans = "", []
    for m in conv["messages"]:
        text += f"<|im_start|>{m['role']}\n"
        if m["role"] == "assistant":
            s = len(text)
            text += m["content"] + "<|im_end|>"
            spans.append((s, len(text)))
            text += "\n"
        else:
            text += m["content"] + "<|im_end|>\n"
    if generation_prompt:
        text += "<|im_start|>assistant\n"
    return text, spans


def write_jsonl(path, convs):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for c in convs:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")


# ----------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------
def train_tokenizer(texts):
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=BPE_VOCAB, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[])
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.get_vocab_size() == BPE_VOCAB, tok.get_vocab_size()
    tok.add_special_tokens(SPECIALS)  # ids BPE_VOCAB .. BPE_VOCAB+3, Qwen-style at the end
    return tok


def save_tokenizer(tok, out):
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    added = {str(ids[s]): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                           "single_word": False, "special": True} for s in SPECIALS}
    cfg = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|mask|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": MODEL["max_position_embeddings"],
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        f.write(json.dumps(cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return ids


def encode(tok, convs):
    """[(ids, assistant_mask)] of the rendered conversations; the mask marks every token that
    overlaps an assistant span (content + <|im_end|>)."""
    rendered = [render(c) for c in convs]
    encs = tok.encode_batch([t for t, _ in rendered], add_special_tokens=False)
    out = []
    for (_, spans), e in zip(rendered, encs):
        mask = [int(any(s < b and a < t for s, t in spans)) for a, b in e.offsets]
        out.append((e.ids, mask))
    return out


# ----------------------------------------------------------------------------------------
# Target training
# ----------------------------------------------------------------------------------------
def make_batches(samples):
    """Length-sorted evaluation batches of at most EVAL_BATCH_TOKENS (rows x padded length)."""
    order = sorted(range(len(samples)), key=lambda i: (len(samples[i][0]), i))
    batches, cur = [], []
    for i in order:
        if cur and (len(cur) + 1) * len(samples[i][0]) > EVAL_BATCH_TOKENS:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    return batches


def collate(samples, idx, pad_id):
    s = max(len(samples[i][0]) for i in idx)
    ids = torch.full((len(idx), s), pad_id, dtype=torch.long)
    att = torch.zeros((len(idx), s), dtype=torch.long)
    asst = torch.zeros((len(idx), s), dtype=torch.bool)
    for r, i in enumerate(idx):
        t, m = samples[i]
        ids[r, :len(t)] = torch.tensor(t)
        att[r, :len(t)] = 1
        asst[r, :len(t)] = torch.tensor(m, dtype=torch.bool)
    return ids, att, asst


def lm_loss(model, ids, att):
    """Mean next-token cross-entropy over every real token (all roles)."""
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    tgt = ids[:, 1:]
    valid = att[:, 1:].bool()
    ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), tgt.reshape(-1), reduction="none")
    ce = ce.view_as(tgt)
    return (ce * valid).sum() / valid.sum(), logits, ce, valid


@torch.no_grad()
def evaluate(model, samples, pad_id):
    was_training = model.training
    model.eval()
    tot = {"all": [0.0, 0, 0], "assistant": [0.0, 0, 0]}  # sum CE, correct, count
    for idx in make_batches(samples):
        ids, att, asst = collate(samples, idx, pad_id)
        _, logits, ce, valid = lm_loss(model, ids, att)
        hit = logits.argmax(-1) == ids[:, 1:]
        for key, m in (("all", valid), ("assistant", valid & asst[:, 1:])):
            tot[key][0] += float((ce * m).sum())
            tot[key][1] += int((hit & m).sum())
            tot[key][2] += int(m.sum())
    model.train(was_training)
    res = {}
    for key, (s, c, n) in tot.items():
        res[key] = {"loss": s / n, "ppl": math.exp(s / n), "acc": c / n, "tokens": n}
    return res


def new_model(layers, pad_id):
    cfg = Qwen3Config(**{**MODEL, "num_hidden_layers": layers}, pad_token_id=pad_id,
                      bos_token_id=None, eos_token_id=None, attn_implementation="sdpa")
    return Qwen3ForCausalLM(cfg)


def grow(model, layers, pad_id):
    """A `layers`-layer copy of `model`: trained layer i becomes layers k*i .. k*i+k-1 (k =
    layers / old layers), each copy with o_proj and down_proj scaled by 1/k, so every layer of
    the grown model starts out doing real work. Not function-preserving (layer 0's output is
    ~50x its input, so its later copies see different inputs): eval loss jumps (4.4 -> 6.1)
    and is back below the pre-growth value within ~150 steps."""
    old = model.config.num_hidden_layers
    k = layers // old
    assert k * old == layers
    big = new_model(layers, pad_id)
    src, dst = model.state_dict(), big.state_dict()
    with torch.no_grad():
        for name, t in dst.items():
            parts = name.split(".")
            if ".layers." in name:
                parts[2] = str(int(parts[2]) // k)
            t.copy_(src[".".join(parts)])
            if ".layers." in name and name.endswith(("o_proj.weight", "down_proj.weight")):
                t.mul_(1.0 / k)
    big.load_state_dict(dst)
    return big


def lr_at(step, steps, peak, final):
    if step < WARMUP:
        return peak * (step + 1) / WARMUP
    p = (step - WARMUP) / max(1, steps - WARMUP)
    return final + 0.5 * (peak - final) * (1 + math.cos(math.pi * p))


def train_target(train, evalset, pad_id, t0):
    gen = torch.Generator().manual_seed(SEED)   # conversation order, all phases
    queue, curve, evals = [], [], []
    step_all, tokens_seen, model = 0, 0, None
    for layers, steps, peak, final in PHASES:
        torch.manual_seed(SEED + layers)        # initialisation of this phase's new weights
        model = new_model(layers, pad_id) if model is None else grow(model, layers, pad_id)
        model.train()
        params = list(model.named_parameters())
        opt = torch.optim.AdamW(
            [{"params": [p for n, p in params if p.dim() >= 2 and "embed" not in n], "weight_decay": WEIGHT_DECAY},
             {"params": [p for n, p in params if p.dim() < 2 or "embed" in n], "weight_decay": 0.0}],
            lr=peak, betas=BETAS, eps=1e-8, foreach=True)
        eval_at = {round(steps * j / EVALS_PER_PHASE) for j in range(EVALS_PER_PHASE + 1)}
        window, window_tok = 0.0, 0
        for step in range(steps + 1):
            if step in eval_at:   # (step 0 of phase 2: the model just grown)
                ev = evaluate(model, evalset, pad_id)
                evals.append({"step": step_all, "layers": layers, "tokens_seen": tokens_seen, **ev})
                log(t0, f"eval  step {step_all:5d} ({layers} layers): loss {ev['all']['loss']:.3f} "
                        f"acc {ev['all']['acc']:.3f} | assistant loss {ev['assistant']['loss']:.3f} "
                        f"acc {ev['assistant']['acc']:.3f}")
            if step == steps:
                break
            if not queue:
                queue = torch.randperm(len(train), generator=gen).tolist()
            ids = torch.tensor([train[queue.pop()][0]])
            att = torch.ones_like(ids)
            for g in opt.param_groups:
                g["lr"] = lr_at(step, steps, peak, final)
            loss, _, _, valid = lm_loss(model, ids, att)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            n = int(valid.sum())
            window += loss.item() * n
            window_tok += n
            tokens_seen += ids.numel()
            step_all += 1
            if (step + 1) % LOG_EVERY == 0 or step + 1 == steps:
                curve.append({"step": step_all, "layers": layers, "tokens_seen": tokens_seen,
                              "train_loss": window / window_tok})
                log(t0, f"train step {step_all:5d} ({layers} layers): loss {window / window_tok:.3f} "
                        f"(last {window_tok} tokens)  lr {lr_at(step, steps, peak, final):.2e}")
                window, window_tok = 0.0, 0
    model.eval()
    return model, curve, evals, tokens_seen


# ----------------------------------------------------------------------------------------
# Sanity checks of the saved folders
# ----------------------------------------------------------------------------------------
def sanity(out, eval_convs, eval_samples, ids, unigram, t0):
    tok = AutoTokenizer.from_pretrained(os.path.join(out, "tokenizer"))
    assert len(tok) == MODEL["vocab_size"], len(tok)
    for s in SPECIALS:
        assert tok.convert_tokens_to_ids(s) == ids[s], s
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # The template renders exactly what the script trained on; the generation mask is the span.
    for c in eval_convs[:5]:
        text, spans = render(c)
        assert tok.apply_chat_template(c["messages"], tokenize=False) == text
        gp = tok.apply_chat_template(c["messages"][:-1], tokenize=False, add_generation_prompt=True)
        assert gp == render({"messages": c["messages"][:-1]}, generation_prompt=True)[0]
        enc = tok.apply_chat_template(c["messages"], tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        mine = encode(tok.backend_tokenizer, [c])[0]
        assert list(enc["input_ids"]) == mine[0]
        assert list(enc["assistant_masks"]) == mine[1], "assistant mask differs"
        assert tok.decode(enc["input_ids"]) == text
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, "target"), dtype=torch.float32)
    model.eval()
    reloaded = evaluate(model, eval_samples, ids["<|endoftext|>"])
    # How much each decoder layer changes the residual stream (|out - in| / |in|, eval tokens):
    # every layer, and so every DFlash tap, should carry something of its own.
    ids_one = torch.tensor([eval_samples[0][0]])
    with torch.no_grad():
        hs = model(input_ids=ids_one, output_hidden_states=True).hidden_states
    change = [float((hs[i + 1] - hs[i]).norm() / hs[i].norm()) for i in range(MODEL["num_hidden_layers"])]
    assert min(change[1:]) > 0.02, change
    reloaded["layer_residual_change"] = [round(x, 4) for x in change]
    uniform = math.log(MODEL["vocab_size"])
    for key in ("all", "assistant"):  # well below uniform, and it uses the context (beats unigram)
        assert reloaded[key]["loss"] < 0.7 * uniform, (key, reloaded[key], uniform)
        assert reloaded[key]["loss"] < unigram - 1.0, (key, reloaded[key], unigram)
    # Greedy continuations of three eval prompts: plausibly Python (indented lines, Python
    # words, printable text).
    samples = []
    for conv in (eval_convs[len(eval_convs) // 2], eval_convs[len(eval_convs) // 4], eval_convs[-1]):
        prompt = tok.apply_chat_template(conv["messages"][:-1], add_generation_prompt=True,
                                         tokenize=True, return_dict=True, return_tensors="pt")
        with torch.no_grad():
            gen = model.generate(**prompt, max_new_tokens=120, do_sample=False,
                                 eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
        text = tok.decode(gen[0, prompt["input_ids"].shape[1]:], skip_special_tokens=False)
        reference = conv["messages"][-1]["content"]
        samples.append({"file": conv["messages"][1]["content"].split("`")[1],
                        "prompt_tail": conv["messages"][1]["content"][-300:],
                        "continuation": text, "reference": reference[:len(text) + 80]})
    both = "".join(x["continuation"] for x in samples)
    words = [w for w in ("self", "def ", "return", "if ", "None", "import", " = ", "(", "):") if w in both]
    printable = sum(ch.isprintable() or ch in "\n\t" for ch in both) / max(1, len(both))
    assert len(both) > 200 and "\n    " in both and len(words) >= 4 and printable > 0.98, samples
    log(t0, "sanity: tokenizer, template, assistant mask, reload and greedy continuation OK")
    return reloaded, samples


# ----------------------------------------------------------------------------------------
# README
# ----------------------------------------------------------------------------------------
def dir_size(path):
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def write_readme(out, info):
    c, m, s, d = info["corpus"], info["metrics"], info["sizes"], info["data"]
    mc, sid = info["target_config"], info["special_ids"]
    fin = m["final_eval_bf16_reloaded"]
    curve = "\n".join(f"| {e['step']} | {e['layers']} | {e['tokens_seen']:,} | {e['all']['loss']:.3f} | "
                      f"{e['all']['acc']:.3f} | {e['assistant']['loss']:.3f} | {e['assistant']['acc']:.3f} |"
                      for e in info["eval_curve"])
    train_curve = ", ".join(f"{x['step']}: {x['train_loss']:.2f}" for x in info["train_curve"])
    phases = "; ".join(f"{n} layers for {st} steps, lr {a:g} → {b:g}" for n, st, a, b in PHASES)
    samples = "\n\n".join(f"`{x['file']}`, the prompt ends with\n\n```\n{x['prompt_tail'][-200:]}\n```\n\n"
                           f"and the model continues\n\n```\n{x['continuation']}\n```"
                           for x in [info["sample"]] + info["more_samples"])
    total = sum(s.values()) / 1e6
    rg = info.get("regeneration")
    regen = "" if rg is None else f"""
## Regenerated responses

DFlash trains on responses the target itself generated (DFLASH.md). `data/train-regenerated.jsonl`
holds the {rg['turns']} train conversations with each assistant turn replaced by the target's own
greedy continuation (at most {rg['max_new_tokens']} tokens; {rg['hit_limit']} of them reached that limit,
the rest ended with `<|im_end|>`), {rg['tokens']:,} tokens in all, made by the C++ decode engine in
float32 on the CPU ({rg['seconds']:.0f} s on two cores):

```sh
{rg['command']}
```

`config/default.toml` trains on these. The held-out prompts of `tandem eval` are the first turns of
`data/eval.jsonl` (files the target never trained on).
"""
    text = f"""# Embedded default

Tandem's embedded default: a tiny Qwen3 target that has learned a little Python, its
tokenizer, and a small chat data set, so that a DFlash drafter can be trained against a
real (if weak) target out of the box, on the CPU when there is no GPU. Everything here is
generated by `tools/tiny/build_default.py`; do not edit by hand.

| path | what | size |
| --- | --- | --- |
| `tokenizer/` | byte-level BPE, {mc['vocab_size']} ids; `tokenizer.json` + `tokenizer_config.json` (`PreTrainedTokenizerFast`, ChatML template) | {s['tokenizer'] / 1e6:.2f} MB |
| `data/train.jsonl`, `data/eval.jsonl` | {d['train_conversations']} / {d['eval_conversations']} conversations (OpenAI `messages`) from {d['train_files']} / {d['eval_files']} disjoint stdlib files | {s['data'] / 1e6:.2f} MB |
| `data/train-regenerated.jsonl` | the train conversations, each assistant turn regenerated by the target (below) | |
| `target/` | `Qwen3ForCausalLM`, {info['parameters']:,} parameters, tied embeddings, bfloat16 safetensors | {s['target'] / 1e6:.2f} MB |
| `build.json` | corpus identity, configs, loss curves, metrics, samples (machine-readable) | |

{total:.2f} MB in all.

## Tokenizer

Byte-level BPE trained with `tokenizers` on the train files' text: Qwen2/Qwen3's
pre-tokenizer split and NFC normalisation, {mc['vocab_size'] - len(SPECIALS)} learned ids, then the
special tokens at the end of the vocabulary as in Qwen: `<|endoftext|>` {sid['<|endoftext|>']} (padding),
`<|im_start|>` {sid['<|im_start|>']}, `<|im_end|>` {sid['<|im_end|>']} (end of turn; `eos_token`), and
`<|mask|>` {sid['<|mask|>']}, reserved for the DFlash drafter's `mask_token_id` (it never occurs in the
data). {d['characters_per_token']} characters per token on the train set.

The chat template is Qwen's ChatML without tools or thinking:
`<|im_start|>{{role}}\\n{{content}}<|im_end|>\\n` per message, generation prompt
`<|im_start|>assistant\\n`, no BOS. Each assistant message's content and its `<|im_end|>` sit
in a `{{% generation %}}` block, so `apply_chat_template(..., return_assistant_tokens_mask=True)`
marks exactly the tokens `tandem prepare` supervises (the build checks this).

## Data

Each conversation is one piece of one standard-library file: system
`{SYSTEM}`, user ``Continue `PATH`:`` followed by a run of whole lines
(at least {USER_CHARS[0]}–{USER_CHARS[1]} characters, drawn per sample), assistant the lines that
follow (at least {ASSISTANT_CHARS[0]}–{ASSISTANT_CHARS[1]} characters). A file's samples do not overlap;
train and eval files are disjoint. Conversations longer than {MAX_SAMPLE_TOKENS} tokens (data
tables such as `stringprep.py`) are dropped: {d['dropped_longer_than_max']['train']} train,
{d['dropped_longer_than_max']['eval']} eval. Rendered with the template, a conversation is
{d['tokens_min']}–{d['tokens_max']} tokens (median {d['tokens_median']}). Train: {d['train_tokens']:,} tokens, of which
{d['train_assistant_tokens']:,} assistant; eval: {d['eval_tokens']:,} tokens, {d['eval_assistant_tokens']:,} assistant.

## Target

`Qwen3ForCausalLM`: hidden {mc['hidden_size']}, {mc['num_hidden_layers']} layers, {mc['num_attention_heads']} attention heads and
{mc['num_key_value_heads']} KV heads of dim {mc['head_dim']}, intermediate {mc['intermediate_size']}, vocab {mc['vocab_size']},
rope_theta {mc['rope_theta']:g}, RMSNorm eps {mc['rms_norm_eps']:g}, max positions
{mc['max_position_embeddings']}, tied embeddings (no `lm_head.weight` in the file). With 8 layers
DFlash's default taps are layers [1, 2, 3, 4, 5].

Trained from scratch in float32 on the CPU with causal-LM loss on **every token** of the
rendered train conversations (system, user and assistant), one conversation per step,
AdamW (betas {BETAS}, weight decay {WEIGHT_DECAY} on matrices, clip {CLIP}, {WARMUP} warm-up steps
then cosine), {info['tokens_seen']:,} tokens seen (≈ {info['tokens_seen'] / d['train_tokens']:.1f} epochs), in two phases:
{phases}. A 2-layer model is about 4× cheaper per token, so it learns most of what
this compute budget allows. It is then grown to 8 layers: trained layer i becomes layers
4i … 4i+3, four copies whose `o_proj` and `down_proj` are scaled by 1/4, and all 8 layers
train on. The growth is not function-preserving (the eval loss jumps at the step where the
layer count changes, then falls below its pre-growth value within ~150 steps), but every
layer starts out doing real work. (Inserting identity-initialised layers instead reached the
same loss, but those layers stayed near identity, so DFlash's taps 1–3 were near copies
of one another.) Saved as bfloat16.

Eval on `eval.jsonl` during training (float32 weights):

| step | layers | tokens seen | loss | accuracy | loss, assistant tokens | accuracy, assistant tokens |
| --- | --- | --- | --- | --- | --- | --- |
{curve}

Train loss (mean over the preceding {LOG_EVERY} steps) by step: {train_curve}.

Final, the saved bfloat16 weights reloaded with `transformers` (float32 compute), on
`eval.jsonl` ({fin['all']['tokens']:,} predicted tokens, {fin['assistant']['tokens']:,} of them assistant):

| tokens | loss (nats) | perplexity | next-token accuracy |
| --- | --- | --- | --- |
| all | {fin['all']['loss']:.3f} | {fin['all']['ppl']:.1f} | {fin['all']['acc']:.3f} |
| assistant | {fin['assistant']['loss']:.3f} | {fin['assistant']['ppl']:.1f} | {fin['assistant']['acc']:.3f} |

Each layer's change of the residual stream, |out − in| / |in| on one eval conversation,
layers 0–7: {', '.join(f'{x:.2f}' for x in fin['layer_residual_change'])} (layer 0 lifts the small
embeddings; every later layer, and so every DFlash tap, does some work of its own).

For scale: uniform guessing is ln {mc['vocab_size']} = {m['uniform_loss']:.3f}; the train set's unigram
distribution scores {m['unigram_eval_loss']:.3f} on eval. It is a weak model: greedy decoding
writes Python-shaped lines and soon repeats itself. Greedy continuations (120 tokens) of
eval prompts:

{samples}

{regen}
## How it was made

```sh
{info['command']}
```

CPU only, no network, {THREADS} threads, seeded; about 3 minutes on two idle cores.
Python {c['python_version']}, torch {info['versions']['torch']}, transformers
{info['versions']['transformers']}, tokenizers {info['versions']['tokenizers']}.

Corpus: {c['files']} `.py` files of the CPython standard library ({c['train_files']} train, {c['eval_files']} eval,
{c['bytes']:,} bytes), read from Python {c['python_version']}'s stdlib folder and listed with their sha256
in `tools/tiny/corpus.txt`. Corpus sha256 `{c['sha256']}`: the sha256 of that
file's non-comment lines (`split sha256 path`). Stdlib files change between patch
releases, and distributions patch some: 122 of the 635 `.py` files (tests left out) that
Debian 12's 3.11.2 and a pyenv 3.11.7 have in common differ. So the pin holds only files
that are byte-identical in both, all from Debian's `libpython3.11-minimal` /
`libpython3.11-stdlib` (present wherever `python3` is). The script hashes every file and
stops if one differs from the pin (`--allow-corpus-drift` builds anyway and records the
different corpus). Two builds on one machine give identical files; on another CPU type the
trained weights may differ in the last bits.

## License

The data, and so what the tokenizer and the model learned, comes from the Python standard
library's source code, copyright the Python Software Foundation, under the Python Software
Foundation License Version 2 (PSF-2.0, https://docs.python.org/3/license.html). The
conversations reproduce pieces of those files verbatim; they keep their copyright and
license.
"""
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(text)


# ----------------------------------------------------------------------------------------
REGEN_MAX_NEW_TOKENS = 256   # tokens per regenerated assistant turn (greedy)
REGEN_BATCH = 48


def regenerate(out, tandem, t0):
    """data/train-regenerated.jsonl: every train conversation's assistant turn replaced by the
    target's own greedy continuation, through `tandem prepare --regenerate` (the C++ decode
    engine, float32 on the CPU: deterministic). Returns what build.json records."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        shards = os.path.join(tmp, "shards")
        cmd = [tandem, "prepare", os.path.join(out, "data", "train.jsonl"), "--regenerate",
               "--target", os.path.join(out, "target"), "--tokenizer", os.path.join(out, "tokenizer"),
               "--output", shards, "--max-new-tokens", str(REGEN_MAX_NEW_TOKENS),
               "--batch", str(REGEN_BATCH), "--device", "cpu", "--quiet"]
        start = time.monotonic()
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"build_default: regeneration failed (exit {done.returncode}):\n{done.stderr}")
        seconds = time.monotonic() - start
        with open(os.path.join(shards + ".regen", "progress.json")) as f:
            report = json.load(f)["report"]
        shutil.copyfile(os.path.join(shards + ".regen", "regenerated.jsonl"),
                        os.path.join(out, "data", "train-regenerated.jsonl"))
    log(t0, f"regenerated {report['turns']} assistant turns: {report['tokens']:,} tokens, "
            f"{report['hit_limit']} hit {REGEN_MAX_NEW_TOKENS} tokens, {seconds:.0f} s")
    return {"command": " ".join(["tandem"] + cmd[1:]).replace(out, "OUT").replace(tmp, "TMP"),
            "max_new_tokens": REGEN_MAX_NEW_TOKENS, "temperature": 0.0, "turns": report["turns"],
            "tokens": report["tokens"], "hit_limit": report["hit_limit"], "seconds": round(seconds, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", nargs="?", default="config/default", help="output folder (default config/default)")
    ap.add_argument("--corpus-root", default=sysconfig.get_paths()["stdlib"],
                    help="stdlib folder to read the pinned files from (default: this interpreter's)")
    ap.add_argument("--allow-corpus-drift", action="store_true",
                    help="build even if files differ from the pin (the outputs record it)")
    ap.add_argument("--write-pin", action="store_true", help="regenerate tools/tiny/corpus.txt and stop")
    ap.add_argument("--tandem", metavar="PATH", default="build/bin/tandem",
                    help="the tandem binary that regenerates the train conversations (default build/bin/tandem)")
    ap.add_argument("--regenerate-only", action="store_true",
                    help="keep OUT's tokenizer, data and target; only (re)write data/train-regenerated.jsonl")
    ap.add_argument("--identical-in", action="append", default=[],
                    help="with --write-pin: keep only files byte-identical in this other stdlib folder")
    args = ap.parse_args()
    if args.write_pin:
        write_pin(args.corpus_root, args.identical_in)
        return
    if args.regenerate_only:
        t0 = time.monotonic()
        info_path = os.path.join(args.out, "build.json")
        with open(info_path) as f:
            info = json.load(f)
        info["regeneration"] = regenerate(args.out, args.tandem, t0)
        info["sizes"] = {k: dir_size(os.path.join(args.out, k)) for k in ("tokenizer", "data", "target")}
        with open(info_path, "w") as f:
            f.write(json.dumps(info, indent=1, sort_keys=True) + "\n")
        write_readme(args.out, info)
        return

    t0 = time.monotonic()
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    out = args.out
    files, identity = read_corpus(args.corpus_root, args.allow_corpus_drift)
    log(t0, f"corpus: {identity['files']} files, {identity['bytes']:,} bytes, sha256 {identity['sha256']}"
            + ("" if identity["matches_pin"] else f"  (DRIFT from the pin: {len(identity['drift'])} files)"))

    for sub in ("tokenizer", "data", "target"):
        shutil.rmtree(os.path.join(out, sub), ignore_errors=True)
    os.makedirs(os.path.join(out, "data"), exist_ok=True)

    # Conversations; the tokenizer learns from the train files' text only.
    split = {"train": [], "eval": []}
    for s, rel, text in files:
        split[s].extend(conversations(rel, text))
    tok = train_tokenizer([t for s, _, t in files if s == "train"])
    ids = save_tokenizer(tok, os.path.join(out, "tokenizer"))
    dropped = {}
    for s in split:  # drop the few conversations of data tables (stringprep.py, ...) that tokenise long
        enc = encode(tok, split[s])
        keep = [i for i, (t, _) in enumerate(enc) if len(t) <= MAX_SAMPLE_TOKENS]
        dropped[s] = len(enc) - len(keep)
        split[s] = [split[s][i] for i in keep]
        if s == "train":
            train = [enc[i] for i in keep]
        else:
            evalset = [enc[i] for i in keep]
    write_jsonl(os.path.join(out, "data", "train.jsonl"), split["train"])
    write_jsonl(os.path.join(out, "data", "eval.jsonl"), split["eval"])
    log(t0, f"data: {len(split['train'])} train / {len(split['eval'])} eval conversations "
            f"({dropped['train']} / {dropped['eval']} longer than {MAX_SAMPLE_TOKENS} tokens dropped)")
    for c in split["train"][:50] + split["eval"]:
        text = render(c)[0]
        assert tok.decode(tok.encode(text, add_special_tokens=False).ids, skip_special_tokens=False) == text
    assert all(ids["<|mask|>"] not in t for t, _ in train + evalset)
    lens = sorted(len(t) for t, _ in train + evalset)
    chars = sum(len(render(c)[0]) for c in split["train"])
    ntr = sum(len(t) for t, _ in train)
    log(t0, f"tokenizer: {tok.get_vocab_size()} ids, {chars / ntr:.2f} characters/token on train; "
            f"train {ntr:,} tokens, eval {sum(len(t) for t, _ in evalset):,}")

    # Unigram baseline (add-one smoothed train counts) on eval next tokens.
    counts = torch.ones(MODEL["vocab_size"], dtype=torch.float64)
    for t, _ in train:
        counts += torch.bincount(torch.tensor(t), minlength=MODEL["vocab_size"]).double()
    logp = (counts / counts.sum()).log()
    ev_next = torch.tensor([x for t, _ in evalset for x in t[1:]])
    unigram = float(-logp[ev_next].mean())

    # Target.
    pad_id = ids["<|endoftext|>"]
    t_train = time.monotonic()
    model, curve, evals, tokens_seen = train_target(train, evalset, pad_id, t0)
    train_seconds = time.monotonic() - t_train
    tdir = os.path.join(out, "target")
    model.config.eos_token_id = ids["<|im_end|>"]
    model.to(SAVE_DTYPE).save_pretrained(tdir, safe_serialization=True)
    gc_path = os.path.join(tdir, "generation_config.json")
    if os.path.exists(gc_path):
        os.remove(gc_path)
    for f in os.listdir(tdir):
        os.chmod(os.path.join(tdir, f), 0o644)
    from safetensors import safe_open
    with safe_open(os.path.join(tdir, "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys(), "tied checkpoint holds lm_head.weight"
    log(t0, f"target saved ({train_seconds:.0f} s of training)")

    reloaded, samples = sanity(out, split["eval"], evalset, ids, unigram, t0)
    sample = samples[0]
    for x in samples:
        print("\n--- greedy continuation of an eval prompt (`" + x["file"] + "`), prompt ends:\n" + x["prompt_tail"][-160:]
              + "\n--- model ---\n" + x["continuation"] + "\n--- reference ---\n" + x["reference"] + "\n---", flush=True)

    nparams = sum(p.numel() for p in model.parameters())
    with open(os.path.join(tdir, "config.json")) as f:
        saved_cfg = json.load(f)
    info = {
        "format": "tandem.embedded_default.v1",
        "command": "~/.cache/tandem/venv/bin/python tools/tiny/build_default.py"
                   + ("" if os.path.normpath(out) == "config/default" else f" {out}"),
        "corpus": identity,
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "tokenizers": __import__("tokenizers").__version__},
        "special_ids": ids,
        "target_config": {k: saved_cfg.get(k, MODEL.get(k)) for k in MODEL},
        "parameters": nparams,
        "training": {"objective": "causal LM, every token of the rendered conversations",
                     "batch": "one conversation per step",
                     "phases": [{"layers": n, "steps": st, "lr_peak": a, "lr_final": b} for n, st, a, b in PHASES],
                     "growth": "layer i -> layers 4i..4i+3, copies with o_proj and down_proj scaled by 1/4",
                     "warmup": WARMUP, "betas": list(BETAS), "weight_decay": WEIGHT_DECAY, "clip": CLIP,
                     "seed": SEED, "threads": THREADS},
        "tokens_seen": tokens_seen,
        "data": {
            "train_conversations": len(split["train"]), "eval_conversations": len(split["eval"]),
            "train_files": identity["train_files"], "eval_files": identity["eval_files"],
            "train_tokens": ntr, "eval_tokens": sum(len(t) for t, _ in evalset),
            "train_assistant_tokens": sum(sum(m) for _, m in train),
            "eval_assistant_tokens": sum(sum(m) for _, m in evalset),
            "dropped_longer_than_max": dropped, "max_sample_tokens": MAX_SAMPLE_TOKENS,
            "tokens_min": lens[0], "tokens_max": lens[-1], "tokens_median": lens[len(lens) // 2],
            "characters_per_token": round(chars / ntr, 3),
        },
        "train_curve": curve,
        "eval_curve": evals,
        "metrics": {"uniform_loss": math.log(MODEL["vocab_size"]), "unigram_eval_loss": unigram,
                    "final_eval_fp32": evals[-1], "final_eval_bf16_reloaded": reloaded},
        "sample": sample,
        "more_samples": samples[1:],
    }
    info["regeneration"] = regenerate(out, args.tandem, t0)
    info["sizes"] = {k: dir_size(os.path.join(out, k)) for k in ("tokenizer", "data", "target")}
    with open(os.path.join(out, "build.json"), "w") as f:
        f.write(json.dumps(info, indent=1, sort_keys=True) + "\n")
    write_readme(out, info)
    log(t0, f"done: {out} ({sum(info['sizes'].values()) / 1e6:.2f} MB: "
            + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in info["sizes"].items()) + ")")


if __name__ == "__main__":
    main()
