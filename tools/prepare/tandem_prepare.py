#!/usr/bin/env python3
"""The Python half of `tandem prepare`: chat data (JSONL) -> token shards + manifest.

    tandem_prepare.py --tokenizer DIR --output DIR [options] INPUT.jsonl [INPUT2.jsonl ...]

The contract (shard and manifest layout, input formats, masks) is docs/data.md; this
docstring covers what that page leaves to the implementation.

Inputs are read line by line (`.gz` files are decompressed on the fly) and shards are
written as they fill, so memory stays at about one shard (`--shard-tokens` tokens) whatever
the size of the data. Each line is one of

    ShareGPT   {"conversations": [{"from": "human"|"user"|"gpt"|"assistant"|"model"|"system", "value": str}]}
    OpenAI     {"messages": [{"role": "system"|"user"|"assistant", "content": str | [{"type": "text", "text": str}]}]}
    tokenized  {"input_ids": [int], "loss_mask": [0|1]}         (same length, taken as is)

`--format auto` (the default) decides per line from the key present. Blank lines are
ignored; every other line ends up in exactly one of: a sample, `invalid_lines` (not JSON,
no known format, a missing or mistyped field, text that is not valid Unicode (a lone
surrogate), unequal lengths, a token id outside the vocabulary, a conversation the template cannot render or the mask algorithm cannot
place), or `dropped_short` (fewer than `--min-supervised` supervised tokens after
truncation). So `report.lines == totals.samples + report.invalid_lines +
report.dropped_short`. `truncated` counts kept samples that were cut to `--max-length`.

Loss mask of a conversation (the target's own chat template, DFLASH.md pitfall 5):

1. Render the whole conversation with the tokenizer's chat template
   (`apply_chat_template(..., tokenize=False)`): the text F.
2. For each assistant turn i, find where its output starts in F:
   a. prefix: P = render(messages[:i], add_generation_prompt=True) is exactly what the
      server sends before the model generates turn i; if F starts with P, the turn's output
      starts at len(P). This holds for ChatML/Qwen2.5/Llama-3 style templates, and for
      Qwen3's (default thinking mode), where the output then includes the template's think
      block.
   b. sentinel (when F does not start with P, e.g. a Qwen3-style template with
      enable_thinking=false for an earlier turn, whose history form drops the empty think
      block, or an assistant-first conversation, which has no prefix to render): with
      B = render(messages[:i]) a prefix of F, render the conversation again with turn i's
      content replaced by a unique sentinel; the text between B and the sentinel is turn
      i's header; if F continues B with that header, the output starts after it.
   c. otherwise the line is counted invalid ("cannot locate assistant turn").
3. The turn ends after the first end-of-turn marker E at or after its start. E is found
   once, from the template itself: the common prefix of what follows an assistant turn in
   the middle of a probe conversation and at its end, whitespace stripped (`<|im_end|>` for
   ChatML, `<|eot_id|>` for Llama 3). Text after E (ChatML's newline) is the template's
   separator and is not supervised. An assistant message containing E is invalid (the
   tokenizer would cut the turn there).
4. Tokenize F exactly as `apply_chat_template(tokenize=True)` does (add_special_tokens=False)
   with offsets; a token is supervised iff its character span overlaps an assistant span.
   The ids are therefore those of apply_chat_template, and the mask covers each assistant
   turn's output as rendered plus E, never its role header or any other message.

`--last-turn-only` keeps only the last assistant turn's span. `--enable-thinking` /
`--no-enable-thinking` pass `enable_thinking` to the template (it must match how the
target is served); the manifest records it under options.chat_template_kwargs.

Shards `shard-NNNNN.safetensors` hold at most `--shard-tokens` tokens (whole samples only;
`--max-length` must not exceed it); each is written to `*.tmp`, fsynced, and renamed, in a
staging folder inside the output (`OUTPUT/.partial/`). Only when every line is done are they
moved into OUTPUT (an older data set's manifest removed first, its shards replaced,
`--overwrite`) and `manifest.json` written last, the same way; a folder without it is not a data set. So a
failed or interrupted prepare leaves an older data set in OUTPUT as it was. `--reuse`
checks that each shard of the data set it keeps is whole (its size against its header).
`content_hash` = sha256 of the concatenated lowercase hex sha256 strings of the shards,
in shard order, no separator. Output is deterministic: the same inputs, tokenizer and
options give byte-identical shards and manifest, whatever `--threads`.

Progress goes to stderr (at most four updates a second on a terminal, one every two seconds
otherwise), then a summary. The first 20 invalid lines are reported as `FILE:LINE: reason`,
the rest only counted.

`--prompts-out FILE` (instead of `--output`) renders prompts for `tandem eval` rather than
training samples: each conversation up to, not including, its first assistant turn (its
last with `--last-turn-only`), with the chat template's generation prompt, tokenized the
same way; a tokenized line gives its ids before the first supervised token. FILE gets a
header line {"format": "tandem.prompts.v1", "stop_ids": [...], "count", "invalid"} (stop
ids: the tokenizer's EOS and the template's end-of-turn token), then one {"source": "FILE:LINE",
"ids": [...]} per prompt, at most `--limit` of them.

`--regenerate --target DIR` first replaces every assistant turn with the target's own
generation (DFlash's recipe: the drafter learns the target's outputs, not a human's), in
order, each turn conditioned on the regenerated turns before it: round k renders every
conversation up to its k-th assistant turn (with the generation prompt), `tandem generate`
decodes them in batches with the C++ decode engine, and the decoded text replaces turn k.
The work lives in OUTPUT.regen/ (the rounds' prompts and generations, the conversations so
far, progress.json), locked while a prepare works there, and `tandem generate` dies with the
prepare that started it; an interrupted run started again with the same options resumes
there, within a round from the last finished batch. Tokenized lines pass through unchanged.
A conversation the template cannot render up to one of its assistant turns, or one that
starts with an assistant turn (no prompt to regenerate it from), is counted invalid with its
FILE:LINE. The manifest's `report` counts the original input lines (`lines`, `invalid_lines`
include the ones regeneration refused), `inputs` are the original files, and
`regeneration` holds the decoding options and figures. The
samples (OUTPUT.regen/regenerated.jsonl, then prepared as usual) are tokenized lines: the ids
of the last turn's prompt, then the ids the target generated for it, exactly (decoding them to
text and tokenizing again would give other ids where the target chose a non-canonical BPE
split), supervised on those ids and on the earlier assistant turns; the conversations as
text are in OUTPUT.regen/conversations.jsonl.

Exit status: 0 success (even with invalid lines); 1 a failure while running (an unreadable
input: a torn .gz); 130 interrupted; 2 bad usage or input: bad options, an unusable tokenizer
folder, a missing input, inputs where no sample survived (every line invalid or too short) or
without a single prompt (--prompts-out), an output folder that already holds a data set or a
--prompts-out file that is not a prompts file (pass --overwrite).
"""

import argparse
import gzip
import hashlib
import itertools
import json
import os
import struct
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402

SHARD_FORMAT = "tandem.shard.v1"
DATASET_FORMAT = "tandem.dataset.v1"
FORMATS = ("sharegpt", "openai", "tokenized")
FORMAT_KEY = {"sharegpt": "conversations", "openai": "messages", "tokenized": "input_ids"}
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "model": "assistant", "system": "system"}
OPENAI_ROLES = ("system", "user", "assistant")
TOOL_ROLE = "tool"  # a tool's answer: rendered by the template, never supervised
SENTINEL = "\u27e6tandem-sentinel-7f3a\u27e7"  # never rendered into a sample, only probed
BATCH_LINES = 256  # lines rendered, then tokenized in one call
MAX_REPORTED_LINES = 20  # invalid lines reported one by one; the rest only counted
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad options, tokenizer folder, inputs or output folder (exit status 2)."""


class BadLine(Exception):
    """One input line that cannot become a sample (counted as invalid, the run goes on)."""


# ----------------------------------------------------------------------------------------
# Tokenizer folder
# ----------------------------------------------------------------------------------------

def sha256_file(path, chunk=1 << 20):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)


def load_tokenizer(tokenizer_dir, need_template):
    """Returns (tokenizer, chat template text or None); UsageError naming what is missing."""
    if not os.path.isdir(tokenizer_dir):
        raise UsageError(f"--tokenizer {tokenizer_dir} does not exist or is not a directory")
    if not os.path.isfile(os.path.join(tokenizer_dir, "tokenizer.json")):
        raise UsageError(f"--tokenizer {tokenizer_dir} has no tokenizer.json "
                         "(a Hugging Face fast-tokenizer folder is needed)")
    import transformers  # slow import (seconds): only once arguments are known to be sane
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except Exception as e:  # any failure of the loader means an unusable folder
        raise UsageError(f"cannot load the tokenizer in {tokenizer_dir}: {type(e).__name__}: {e}")
    if not getattr(tokenizer, "is_fast", False):
        raise UsageError(f"tokenizer in {tokenizer_dir} is not a fast (tokenizers) tokenizer; "
                         "character offsets are needed for the loss mask")
    template = None
    if tokenizer.chat_template:
        try:
            template = tokenizer.get_chat_template()
        except ValueError as e:
            raise UsageError(f"tokenizer folder {tokenizer_dir}: {e}")
    if template is None and need_template:
        raise UsageError(f"tokenizer folder {tokenizer_dir} has no chat template (neither "
                         "'chat_template' in tokenizer_config.json nor chat_template.jinja); "
                         "only --format tokenized works without one")
    return tokenizer, template


# ----------------------------------------------------------------------------------------
# Chat template -> ids and loss mask
# ----------------------------------------------------------------------------------------

class ChatMasker:
    """Renders conversations with the tokenizer's own chat template and masks assistant turns
    (algorithm in the module docstring)."""

    def __init__(self, tokenizer, template_kwargs):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs)
        self.eot = self._probe_end_of_turn()

    def render(self, messages, generation_prompt=False, tools=None):
        extra = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt,
            **extra, **self.template_kwargs)

    def _probe_end_of_turn(self):
        s1, s2 = SENTINEL + "1", SENTINEL + "2"
        probe = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": s1},
                 {"role": "user", "content": SENTINEL + "u"},
                 {"role": "assistant", "content": s2}]
        try:
            text = self.render(probe)
        except Exception as e:
            raise UsageError(f"the chat template cannot render a user/assistant conversation: "
                             f"{type(e).__name__}: {e}")
        if s1 not in text or s2 not in text or SENTINEL + "u" not in text:
            raise UsageError("the chat template drops message contents; cannot build loss masks")
        middle = text[text.index(s1) + len(s1):text.index(SENTINEL + "u")]
        last = text[text.index(s2) + len(s2):]
        eot = os.path.commonprefix([middle, last]).strip()
        if not eot:
            raise UsageError("the chat template emits no end-of-turn marker after an assistant "
                             "turn; cannot tell where a turn ends")
        return eot

    def _turn_start(self, messages, i, full, tools=None):
        """Character offset in `full` where assistant turn i's output starts, or None."""
        if i > 0:  # (a) prefix: what the server renders before the model generates turn i
            prompt = self.render(messages[:i], generation_prompt=True, tools=tools)
            if full.startswith(prompt):
                return len(prompt)
        # (b) sentinel: header of turn i = text between the history and the sentinel content
        before = self.render(messages[:i], tools=tools) if i > 0 else ""
        if not full.startswith(before):
            return None
        probe = list(messages)
        probe[i] = dict(messages[i], content=SENTINEL)
        text = self.render(probe, tools=tools)
        at = text.find(SENTINEL, len(before))
        if not text.startswith(before) or at < 0:
            return None
        header = text[len(before):at]
        if not full.startswith(header, len(before)):
            return None
        return len(before) + len(header)

    def spans(self, messages, last_turn_only, tools=None):
        """(rendered text, [(start, end) character spans of the supervised assistant turns]).
        `tools`: the line's function definitions (OpenAI "tools"), given to the template."""
        full = self.render(messages, tools=tools)
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if last_turn_only:
            turns = turns[-1:]
        spans = []
        cursor = 0
        for i in turns:
            if self.eot in messages[i]["content"]:
                raise BadLine(f"assistant message {i} contains the end-of-turn marker {self.eot!r}")
            start = self._turn_start(messages, i, full, tools)
            if start is None or start < cursor:
                raise BadLine(f"cannot locate assistant message {i} in the rendered conversation "
                              "(the chat template renders it differently in context)")
            end = full.find(self.eot, start)
            if end < 0:
                raise BadLine(f"no end-of-turn marker {self.eot!r} after assistant message {i}")
            end += len(self.eot)
            spans.append((start, end))
            cursor = end
        return full, spans

    @staticmethod
    def mask(offsets, spans):
        """uint8 [T]: 1 for each token whose character span overlaps one of `spans`.
        offsets: the tokenizer's (start, end) per token."""
        flat = np.fromiter(itertools.chain.from_iterable(offsets), dtype=np.int64,
                           count=2 * len(offsets)).reshape(-1, 2)
        starts = flat[:, 0]
        ends = np.maximum(flat[:, 1], starts + 1)  # a zero-width token counts at its position
        mask = np.zeros(len(offsets), dtype=np.uint8)
        for s, e in spans:
            mask[(starts < e) & (ends > s)] = 1
        return mask


# ----------------------------------------------------------------------------------------
# One input line -> one sample
# ----------------------------------------------------------------------------------------

def _unicode(text, where):
    """`text` if every character of it can be encoded (UTF-8, as the tokenizer takes it);
    else BadLine naming `where`.  JSON's escapes can spell half a UTF-16 pair ("\\ud800"
    alone), which decodes to a lone surrogate: no encoding holds it, and the tokenizer
    refuses the whole batch it is in."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadLine(f"{where} is not valid Unicode: a lone surrogate {text[e.start]!r} at character "
                      f"{e.start} (a \\u escape of half a UTF-16 pair)")
    return text


def _messages_sharegpt(obj):
    conv = obj["conversations"]
    if not isinstance(conv, list) or not conv:
        raise BadLine("'conversations' is not a non-empty list")
    messages = []
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict):
            raise BadLine(f"conversations[{j}] is not an object")
        for key in ("from", "value"):
            if key not in turn:
                raise BadLine(f"conversations[{j}] has no '{key}'")
        role = SHAREGPT_ROLES.get(turn["from"]) if isinstance(turn["from"], str) else None
        if role is None:
            raise BadLine(f"conversations[{j}]: unknown 'from' {turn['from']!r}")
        if not isinstance(turn["value"], str):
            raise BadLine(f"conversations[{j}]: 'value' is not a string")
        messages.append({"role": role, "content": _unicode(turn["value"], f"conversations[{j}].value")})
    return messages


def _messages_openai(obj, allow_tools=False):
    """The line's messages.  With `allow_tools`, "tool" messages and assistant "tool_calls"
    pass to the chat template (an assistant turn's tool calls are part of its supervised
    output; a tool's answer is not); without, they are refused by name."""
    conv = obj["messages"]
    if not isinstance(conv, list) or not conv:
        raise BadLine("'messages' is not a non-empty list")
    messages = []
    for j, msg in enumerate(conv):
        if not isinstance(msg, dict):
            raise BadLine(f"messages[{j}] is not an object")
        for key in ("role", "content"):
            if key not in msg:
                raise BadLine(f"messages[{j}] has no '{key}'")
        tool_calls = msg.get("tool_calls")
        if msg["role"] == TOOL_ROLE or tool_calls:
            if not allow_tools:
                raise BadLine(f"messages[{j}]: tool messages and tool calls are supported in training data, "
                              "not in prompts or with --regenerate")
            if tool_calls is not None and (msg["role"] != "assistant" or not isinstance(tool_calls, list)):
                raise BadLine(f"messages[{j}]: 'tool_calls' must be a list on an assistant message")
        elif msg["role"] not in OPENAI_ROLES:
            raise BadLine(f"messages[{j}]: unknown role {msg['role']!r}"
                          + (" (tool messages: the OpenAI role 'tool')" if msg["role"] in ("function", "ipython", "observation") else ""))
        content = msg["content"]
        if content is None and tool_calls:
            content = ""  # an assistant turn that only calls tools
        if isinstance(content, list):  # content parts: the text ones, concatenated (OpenAI's meaning)
            texts = []
            for k, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise BadLine(f"messages[{j}].content[{k}] is not a text part ({kind!r}); only text "
                                  "parts are supported")
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise BadLine(f"messages[{j}]: 'content' is not a string or a list of text parts")
        m = {"role": msg["role"], "content": _unicode(content, f"messages[{j}].content")}
        if tool_calls:
            m["tool_calls"] = tool_calls
        messages.append(m)
    return messages


def _tokenized(obj, vocab_size):
    if "loss_mask" not in obj:
        raise BadLine("tokenized line has no 'loss_mask'")
    ids, mask = obj["input_ids"], obj["loss_mask"]
    for key, value in (("input_ids", ids), ("loss_mask", mask)):
        if not isinstance(value, list):
            raise BadLine(f"'{key}' is {'null' if value is None else type(value).__name__}, not a list")
    if len(ids) != len(mask):
        raise BadLine(f"'input_ids' and 'loss_mask' differ in length ({len(ids)} vs {len(mask)})")
    for j, v in enumerate(ids):
        if type(v) is not int:
            raise BadLine(f"input_ids[{j}] is not an integer")
        if not 0 <= v < vocab_size:
            raise BadLine(f"input_ids[{j}] = {v} is outside the vocabulary [0, {vocab_size})")
    for j, v in enumerate(mask):
        if type(v) not in (int, bool) or v not in (0, 1):
            raise BadLine(f"loss_mask[{j}] is not 0 or 1")
    return np.asarray(ids, dtype=np.int32), np.asarray(mask, dtype=np.uint8)


def detect_format(obj, wanted):
    """The format of a parsed line: `wanted` unless "auto", else decided by its key."""
    if wanted != "auto":
        if FORMAT_KEY[wanted] not in obj:
            raise BadLine(f"no '{FORMAT_KEY[wanted]}' field (--format {wanted})")
        return wanted
    found = [f for f in FORMATS if FORMAT_KEY[f] in obj]
    if not found:
        raise BadLine("unknown format: no 'conversations', 'messages' or 'input_ids' field")
    if len(found) > 1:
        raise BadLine("ambiguous format: fields " + ", ".join(repr(FORMAT_KEY[f]) for f in found))
    return found[0]


class BatchProcessor:
    """Turns raw JSONL lines into results, in order: ("ok", format, ids, mask, truncated),
    ("short", format) or ("bad", reason). Pure: a line's result depends only on the line.
    The rendered texts of a batch are tokenized in one call, which the tokenizers library
    spreads over its threads."""

    def __init__(self, tokenizer, template, opts):
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)
        self.format = opts["input_format"]
        self.max_length = opts["max_length"]
        self.min_supervised = opts["min_supervised"]
        self.last_turn_only = opts["last_turn_only"]
        self.masker = ChatMasker(tokenizer, opts["chat_template_kwargs"]) if template else None

    def _detect(self, obj):
        return detect_format(obj, self.format)

    def _stage(self, raw):
        """("bad", reason) | ("arrays", format, ids, mask) | ("text", format, text, spans)."""
        try:
            try:
                obj = json.loads(raw)
            except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError, deep nesting
                raise BadLine(f"invalid JSON: {e}")
            if not isinstance(obj, dict):
                raise BadLine("not a JSON object")
            fmt = self._detect(obj)
            if fmt == "tokenized":
                return ("arrays", fmt) + _tokenized(obj, self.vocab_size)
            if self.masker is None:
                raise BadLine("conversation line, but the tokenizer has no chat template")
            messages = _messages_sharegpt(obj) if fmt == "sharegpt" else _messages_openai(obj, allow_tools=True)
            tools = obj.get("tools") if fmt == "openai" else None
            if tools is not None and not isinstance(tools, list):
                raise BadLine("'tools' is not a list of function definitions")
            try:
                text, spans = self.masker.spans(messages, self.last_turn_only, tools)
            except BadLine:
                raise
            except Exception as e:  # the template itself refused (raise_exception, ...)
                raise BadLine(f"chat template error: {type(e).__name__}: {e}")
            # Contents are checked above; this catches what else the template renders
            # (tools, tool calls' arguments).
            return ("text", fmt, _unicode(text, "the rendered conversation"), spans)
        except BadLine as e:
            return ("bad", str(e))

    def _finish(self, fmt, ids, mask):
        truncated = len(ids) > self.max_length
        if truncated:
            ids, mask = ids[:self.max_length], mask[:self.max_length]
        if len(ids) == 0 or int(mask.sum()) < self.min_supervised:
            return ("short", fmt)
        return ("ok", fmt, ids, mask, truncated)

    def process(self, raws):
        staged = [self._stage(raw) for raw in raws]
        texts = [st[2] for st in staged if st[0] == "text"]
        if texts:
            enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
            encoded = iter(zip(enc["input_ids"], enc["offset_mapping"]))
        results = []
        for st in staged:
            if st[0] == "bad":
                results.append(st)
            elif st[0] == "arrays":
                results.append(self._finish(*st[1:]))
            else:
                ids, offsets = next(encoded)
                ids = np.asarray(ids, dtype=np.int32)
                if ids.size and int(ids.max()) >= self.vocab_size:
                    results.append(("bad", "the tokenizer produced an id outside its own vocabulary"))
                    continue
                results.append(self._finish(st[1], ids, ChatMasker.mask(offsets, st[3])))
        return results


# ----------------------------------------------------------------------------------------
# Shards and manifest
# ----------------------------------------------------------------------------------------

def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path, chunks):
    """Writes the byte chunks to path + ".tmp", fsyncs, renames over path, fsyncs the folder;
    returns the file's sha256."""
    tmp = path + ".tmp"
    h = hashlib.sha256()
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                h.update(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))
    return h.hexdigest()


SAFETENSORS_DTYPE = {np.dtype("<i8"): "I64", np.dtype("<i4"): "I32", np.dtype("uint8"): "U8"}


def safetensors_chunks(tensors, metadata):
    """A safetensors file as byte chunks, deterministically: header keys in the order given
    (`__metadata__` first), header padded with spaces to a multiple of 8, tensors in the
    order given. (The safetensors package writes `__metadata__` in hash-map order, which
    changes from one process to the next, so shards written with it would not be
    byte-reproducible.) Pass tensors widest dtype first, as the package orders them."""
    header = {"__metadata__": metadata}
    at = 0
    arrays = []
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr)
        header[name] = {"dtype": SAFETENSORS_DTYPE[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [at, at + arr.nbytes]}
        at += arr.nbytes
        arrays.append(arr)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    yield struct.pack("<Q", len(text)) + text
    for arr in arrays:
        yield memoryview(arr).cast("B")


class ShardWriter:
    """Concatenates samples into fixed-capacity buffers; writes a shard when the next sample
    would not fit."""

    def __init__(self, out_dir, shard_tokens):
        self.out_dir = out_dir
        self.capacity = shard_tokens
        self.tokens = np.empty(shard_tokens, dtype=np.int32)  # pages are touched only as filled
        self.mask = np.empty(shard_tokens, dtype=np.uint8)
        self.offsets = [0]
        self.shards = []  # manifest entries

    def add(self, ids, mask):
        n = len(ids)
        at = self.offsets[-1]
        if at + n > self.capacity:
            self.flush()
            at = 0
        self.tokens[at:at + n] = ids
        self.mask[at:at + n] = mask
        self.offsets.append(at + n)

    def flush(self):
        num_samples = len(self.offsets) - 1
        if num_samples == 0:
            return
        num_tokens = self.offsets[-1]
        tensors = [("offsets", np.asarray(self.offsets, dtype=np.int64)),
                   ("tokens", self.tokens[:num_tokens]), ("loss_mask", self.mask[:num_tokens])]
        metadata = {"format": SHARD_FORMAT, "num_samples": str(num_samples),
                    "num_tokens": str(num_tokens)}
        name = f"shard-{len(self.shards):05d}.safetensors"
        digest = _write_atomic(os.path.join(self.out_dir, name), safetensors_chunks(tensors, metadata))
        self.shards.append({"file": name, "num_samples": num_samples, "num_tokens": num_tokens,
                            "num_supervised": int(self.mask[:num_tokens].sum(dtype=np.int64)),
                            "sha256": digest})
        self.offsets = [0]


def _dataset_files(out_dir):
    return sorted(f for f in os.listdir(out_dir)
                  if f in ("manifest.json", "manifest.json.tmp")
                  or (f.startswith("shard-") and (f.endswith(".safetensors")
                                                  or f.endswith(".safetensors.tmp"))))


MANIFEST_OPTIONS = ("block_size", "min_supervised", "max_length", "last_turn_only", "input_format",
                    "chat_template_kwargs")


def _token_id(value):
    """A special token id for the manifest: an int, or None when the tokenizer has none."""
    return int(value) if isinstance(value, int) and value >= 0 else None


def _shard_damage(path):
    """None when the safetensors file at path is whole (its size is what its header says),
    else what is wrong with it."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            n = struct.unpack("<Q", head)[0]
            if n > size - 8:
                return f"{size} bytes, shorter than its own header ({n} bytes)"
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if size != 8 + n + end:
            return f"{size} bytes where its header says {8 + n + end}"
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        return f"unreadable ({type(e).__name__}: {e})"
    return None


def _target_files(target):
    """The target's files as they are: config.json's sha256, and each weights file's name,
    size and modification time (hashing the weights would cost more than a resume saves)."""
    out = {"config.json": sha256_file(os.path.join(target, "config.json"))}
    for name in sorted(os.listdir(target)):
        if name.endswith(".safetensors") or name.endswith(".safetensors.index.json"):
            st = os.stat(os.path.join(target, name))
            out[name] = [st.st_size, st.st_mtime_ns]
    return out


def _differs_from_existing(out_dir, identity, reporter):
    """For --reuse: None when out_dir holds a complete data set with this identity; else what
    differs ("inputs", "options", ...), or "" when there is no complete data set there."""
    try:
        with open(os.path.join(out_dir, "manifest.json"), "rb") as f:
            manifest = json.loads(f.read())
    except (OSError, ValueError):
        return ""
    if manifest.get("format") != DATASET_FORMAT:
        return "format"
    tok = manifest.get("tokenizer", {})
    old_inputs = [(i.get("sha256"), i.get("bytes")) for i in manifest.get("inputs", [])]
    new_inputs = [(i["sha256"], i["bytes"]) for i in identity["inputs"]]
    if old_inputs != new_inputs:
        return "inputs"
    if tok.get("sha256") != identity["tokenizer_sha256"]:
        return "tokenizer"
    if tok.get("chat_template_sha256") != identity["chat_template_sha256"]:
        return "chat template"
    if manifest.get("options") != identity["options"]:
        return "options"
    for shard in manifest.get("shards", []):
        path = os.path.join(out_dir, str(shard.get("file", "")))
        damage = "missing" if not os.path.isfile(path) else _shard_damage(path)
        if damage:
            reporter.message(f"prepare: {path} is damaged ({damage}); preparing the data set again")
            return ""  # incomplete: prepare again
    return None


STAGING = ".partial"  # inside the output folder: same filesystem, whatever OUTPUT is (a link, a mount)


def check_output(out_dir, overwrite):
    """Refuses an output that is a file, or that holds a data set unless overwrite."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(f"output {out_dir} exists and is not a directory")
    if os.path.isfile(os.path.join(out_dir, "manifest.json")) and not overwrite:
        raise UsageError(f"output folder {out_dir} already holds a data set (manifest.json); "
                         "pass --overwrite to replace it")


def _missing_folders(path):
    """The folders of `path` (itself and its parents) that do not exist yet, deepest first."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.lexists(p):
        missing.append(p)
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return missing


def remove_made_folders(made):
    """Removes the folders prepare_output made (deepest first), as long as they are empty."""
    for d in made:
        try:
            os.rmdir(d)
        except OSError:
            break


def prepare_output(out_dir, overwrite):
    """Checks out_dir; returns (an empty staging folder inside it for the new shards, the
    folders made here for it, deepest first: out_dir and any parents it lacked)."""
    check_output(out_dir, overwrite)
    made = _missing_folders(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    staging = os.path.join(out_dir, STAGING)
    import shutil
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    return staging, made


def publish(staging, out_dir, manifest_text):
    """Moves the new shards from staging into out_dir and writes the manifest: an older data
    set's manifest goes first (a half-replaced folder is never a data set), its shards are
    replaced by name, and the ones the new set does not have are removed."""
    existing = _dataset_files(out_dir)
    if "manifest.json" in existing:
        os.unlink(os.path.join(out_dir, "manifest.json"))
    new = sorted(os.listdir(staging))
    for f in new:
        os.replace(os.path.join(staging, f), os.path.join(out_dir, f))
    for f in existing:
        if f != "manifest.json" and f not in new:
            os.unlink(os.path.join(out_dir, f))
    _fsync_dir(out_dir)
    _write_atomic(os.path.join(out_dir, "manifest.json"), [manifest_text.encode("utf-8")])
    os.rmdir(staging)


# ----------------------------------------------------------------------------------------
# Progress on stderr
# ----------------------------------------------------------------------------------------

class Reporter:
    def __init__(self, quiet):
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.interval = 0.25 if self.tty else 2.0
        self.start = self.last = time.monotonic()
        self.pending = False  # a tty progress line without newline is on screen

    def begin(self):
        """Starts the clock of the rates (after the slow tokenizer load)."""
        self.start = self.last = time.monotonic()

    def _clear(self):
        if self.pending:
            sys.stderr.write("\r\033[K")
            self.pending = False

    def message(self, text):
        self._clear()
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def progress(self, c, force=False):
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        rate = c["lines"] / max(now - self.start, 1e-9)
        line = (f"prepare: {c['lines']:,} lines ({rate:,.0f}/s), {c['samples']:,} samples, "
                f"{c['tokens']:,} tokens, {c['invalid']:,} invalid")
        if self.tty:
            self._clear()
            sys.stderr.write(line)
            self.pending = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self):
        self._clear()


# ----------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="tandem prepare",
        description="Turn chat data (JSONL: ShareGPT, OpenAI messages, or tokenized) into "
                    "Tandem token shards and a manifest (docs/data.md).")
    p.add_argument("inputs", nargs="+", metavar="INPUT.jsonl", help="input files (.jsonl or .jsonl.gz)")
    p.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="Hugging Face tokenizer folder of the target (tokenizer.json + chat template)")
    p.add_argument("--output", metavar="DIR", help="output folder for shards and manifest.json")
    p.add_argument("--prompts-out", metavar="FILE",
                   help="instead of shards, write the conversations' prompts (up to their first "
                        "assistant turn, with the generation prompt) as token ids, for tandem eval")
    g = p.add_argument_group("regeneration (--regenerate)")
    g.add_argument("--regenerate", action="store_true",
                   help="replace every assistant turn with the target's own generation first")
    g.add_argument("--target", metavar="DIR", help="the target that regenerates (Hugging Face Qwen3 folder)")
    g.add_argument("--temperature", type=float, help="0: greedy (default)")
    g.add_argument("--top-p", type=float, help="nucleus sampling, in (0, 1] (default 1)")
    g.add_argument("--top-k", type=int, help="top-k sampling (default 0: off)")
    g.add_argument("--max-new-tokens", type=int, metavar="N",
                   help="tokens per regenerated turn at most (default 1024)")
    g.add_argument("--device", help="cpu, cuda, cuda:N or auto (default)")
    g.add_argument("--batch", type=int, metavar="N", help="turns decoded together (default 16)")
    g.add_argument("--seed", type=int, help="seed of the sampling generator (default 0)")
    g.add_argument("--tandem-bin", metavar="PATH", default=os.environ.get("TANDEM_BIN", "tandem"),
                   help=argparse.SUPPRESS)
    p.add_argument("--limit", type=int, default=0, metavar="N",
                   help="--prompts-out: at most N prompts (default 0: all)")
    p.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                   help="input format; auto decides per line (default)")
    p.add_argument("--block-size", type=int, default=16, metavar="N", help="drafter block size (default 16)")
    p.add_argument("--min-supervised", type=int, default=None, metavar="N",
                   help="drop samples with fewer supervised tokens (default 2*block size)")
    p.add_argument("--max-length", type=int, default=3072, metavar="N", help="truncate samples to this many tokens (default 3072)")
    p.add_argument("--last-turn-only", action="store_true", help="supervise only the last assistant turn")
    p.add_argument("--shard-tokens", type=int, default=1 << 26, metavar="N",
                   help="at most this many tokens per shard (default 2^26)")
    p.add_argument("--enable-thinking", action=argparse.BooleanOptionalAction, default=None,
                   help="pass enable_thinking=true/false to the chat template (default: not passed, "
                        "the template's default); must match how the target is served")
    p.add_argument("--threads", type=int, default=0, metavar="N",
                   help="tokenizer threads (default 0: all cores); output is identical for any value")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a data set already in --output, or a file at --prompts-out that is not a "
                        "prompts file (a prompts file there is rendered again without it)")
    p.add_argument("--reuse", action="store_true",
                   help="if --output already holds a data set prepared from the same inputs "
                        "(by sha256), tokenizer, chat template and options, keep it and exit 0; "
                        "a different data set there is an error unless --overwrite")
    # The tandem binary passes its own version (manifest created_by): not a user's option.
    p.add_argument("--tandem-version", metavar="VERSION", default=os.environ.get("TANDEM_VERSION", "dev"),
                   help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true", help="no progress lines (a data set's summary is still printed)")
    args = p.parse_args(argv)
    if (args.output is None) == (args.prompts_out is None):
        p.error("give exactly one of --output DIR (shards) and --prompts-out FILE (prompts)")
    if args.limit < 0:
        p.error("--limit must not be negative")
    if args.limit and args.prompts_out is None:
        p.error("--limit applies only to --prompts-out")
    if args.prompts_out is not None and not os.path.isdir(os.path.dirname(args.prompts_out) or "."):
        p.error(f"--prompts-out {args.prompts_out}: no folder {os.path.dirname(args.prompts_out)}")
    if (args.prompts_out is not None and os.path.lexists(args.prompts_out) and not args.overwrite
            and not (os.path.isfile(args.prompts_out) and os.path.getsize(args.prompts_out) == 0)):
        # Another prompts file is rendered again in place (tandem run does that) and an empty
        # file filled (tandem eval's temporary); anything else there is the user's and stays
        # unless --overwrite.
        if os.path.isdir(args.prompts_out):
            p.error(f"--prompts-out {args.prompts_out}: a folder, not a file")
        try:
            with open(args.prompts_out, "rb") as f:
                head = json.loads(f.readline(1 << 20) or b"null")
        except (OSError, ValueError):
            head = None
        if not (isinstance(head, dict) and head.get("format") == "tandem.prompts.v1"):
            p.error(f"--prompts-out {args.prompts_out} exists and is not a prompts file (no tandem.prompts.v1 "
                    "header line): pass --overwrite to replace it")
    if args.regenerate and (args.target is None or args.output is None):
        p.error("--regenerate needs --target DIR and --output DIR")
    decoding = {"target": None, "temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 1024,
                "device": "auto", "batch": 16, "seed": 0}
    for name, default in decoding.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        elif not args.regenerate:
            p.error(f"--{name.replace('_', '-')} applies only with --regenerate")
    if args.regenerate:
        if not args.temperature >= 0:
            p.error("--temperature must be at least 0")
        if not 0 < args.top_p <= 1:
            p.error("--top-p must be in (0, 1]")
        if args.top_k < 0:
            p.error("--top-k must not be negative (0: off)")
        if args.seed < 0:
            p.error("--seed must not be negative")
        if args.max_new_tokens < 1 or args.batch < 1:
            p.error("--max-new-tokens and --batch must be at least 1")
        import re
        if not re.fullmatch(r"auto|cpu|cuda(:[0-9]+)?", args.device):
            p.error(f"--device {args.device!r}: expected cpu, cuda, cuda:N or auto")
    seen = {}
    for path in args.inputs:
        key = os.path.realpath(path)
        if key in seen:
            p.error(f"input {path} is given twice (as {seen[key]}): its samples would be doubled")
        seen[key] = path
    if args.min_supervised is None:
        args.min_supervised = 2 * args.block_size
    for name in ("block_size", "max_length", "shard_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.threads < 0:
        p.error("--threads must not be negative")
    if args.min_supervised < 0:
        p.error("--min-supervised must not be negative")
    if args.shard_tokens < args.max_length:
        p.error("--shard-tokens must be at least --max-length (a shard holds whole samples)")
    return args


def _open_input(path):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _read_batches(inputs, batch_lines):
    """Yields lists of (file, line number, raw bytes), skipping blank lines. An input that
    cannot be read to its end (a torn or fake .gz) raises RuntimeError naming it."""
    import zlib
    batch = []
    for path in inputs:
        line_no = 0
        try:
            with _open_input(path) as f:
                for line_no, raw in enumerate(f, 1):
                    if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                        raw = raw[3:]
                    if not raw.strip():
                        continue
                    batch.append((path, line_no, raw))
                    if len(batch) == batch_lines:
                        yield batch
                        batch = []
        except (OSError, EOFError, zlib.error) as e:
            raise RuntimeError(f"{path}: cannot read past line {line_no}: {type(e).__name__}: {e}")
    if batch:
        yield batch


def _token_ids_of(tokenizer, text):
    """The id of `text` when it is exactly one token, else None."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None


def render_prompts(args):
    """--prompts-out: the prompts of the conversations as token ids (module docstring)."""
    for path in args.inputs:
        if not os.path.isfile(path):
            raise UsageError(f"input {path} does not exist or is not a file")
    tokenizer, template = load_tokenizer(args.tokenizer, args.format != "tokenized")
    template_kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking}
    masker = ChatMasker(tokenizer, template_kwargs) if template else None
    prompts, invalid = [], 0
    for batch in _read_batches(args.inputs, BATCH_LINES):
        for path, line_no, raw in batch:
            if args.limit and len(prompts) >= args.limit:
                break
            where = f"{path}:{line_no}"
            try:
                try:
                    obj = json.loads(raw)
                except (ValueError, RecursionError) as e:
                    raise BadLine(f"invalid JSON: {e}")
                if not isinstance(obj, dict):
                    raise BadLine("not a JSON object")
                fmt = detect_format(obj, args.format)
                if fmt == "tokenized":
                    ids, mask = _tokenized(obj, len(tokenizer))
                    first = np.flatnonzero(mask)
                    if first.size == 0 or first[0] == 0:
                        raise BadLine("no unsupervised prefix to use as the prompt")
                    ids = [int(x) for x in ids[:first[0]]]
                else:
                    if masker is None:
                        raise BadLine("conversation line, but the tokenizer has no chat template")
                    messages = _messages_sharegpt(obj) if fmt == "sharegpt" else _messages_openai(obj)
                    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
                    cut = (turns[-1] if args.last_turn_only else turns[0]) if turns else len(messages)
                    if cut == 0:
                        raise BadLine("the conversation starts with an assistant turn: no prompt")
                    text = masker.render(messages[:cut], generation_prompt=True)
                    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if not ids:
                    raise BadLine("empty prompt")
                prompts.append({"source": where, "ids": ids})
            except BadLine as e:
                invalid += 1
                if invalid <= MAX_REPORTED_LINES:
                    sys.stderr.write(f"{where}: {e}\n")
    if not prompts:
        raise UsageError(f"no prompt in {', '.join(args.inputs)} ({invalid} invalid lines); "
                         f"{args.prompts_out} not written")
    header = {"format": "tandem.prompts.v1", "stop_ids": _stop_ids(tokenizer, masker), "count": len(prompts),
              "invalid": invalid, "tokenizer": args.tokenizer}
    lines = [json.dumps(header)] + [json.dumps(p) for p in prompts]
    _write_atomic(args.prompts_out, [("\n".join(lines) + "\n").encode("utf-8")])
    if not args.quiet:
        sys.stderr.write(f"prepare: wrote {len(prompts):,} prompts ({invalid:,} invalid lines"
                         + (f", stopped at --limit {args.limit}" if args.limit and len(prompts) >= args.limit else "")
                         + f") to {args.prompts_out}\n")
    return EXIT_OK


def _stop_ids(tokenizer, masker):
    stop = []
    for tok in (_token_id(tokenizer.eos_token_id),
                _token_ids_of(tokenizer, masker.eot) if masker is not None else None):
        if tok is not None and tok not in stop:
            stop.append(tok)
    return stop


def _lock_work(work):
    """Creates and locks the regeneration folder (flock on the folder itself; released when
    this process ends, however it ends)."""
    import fcntl
    os.makedirs(work, exist_ok=True)
    fd = os.open(work, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError(f"another tandem prepare is regenerating into {work}; wait for it or stop it")
    return fd


def _clear_folder(path):
    import shutil
    for f in os.listdir(path):
        full = os.path.join(path, f)
        if os.path.isdir(full) and not os.path.islink(full):
            shutil.rmtree(full)
        else:
            os.unlink(full)


def _round_members(prompts_path):
    """The conversation index of each prompt of a round's prompts file, in file order."""
    with open(prompts_path) as f:
        lines = f.readlines()[1:]
    return [json.loads(line)["conversation"] for line in lines if line.strip()]


def _read_generated(out_path):
    """{prompt index: generation} from a `tandem generate` output (its header skipped)."""
    generated = {}
    with open(out_path) as f:
        for line in f:
            g = json.loads(line)
            if "index" in g:
                generated[g["index"]] = g
    return generated


def regenerate(args):
    """--regenerate: the assistant turns replaced by the target's generations (module
    docstring); returns (path of the regenerated samples, what the manifest records)."""
    import subprocess
    for path in args.inputs:
        if not os.path.isfile(path):
            raise UsageError(f"input {path} does not exist or is not a file")
    if not os.path.isfile(os.path.join(args.target, "config.json")):
        raise UsageError(f"--target {args.target} has no config.json (a Hugging Face Qwen3 folder)")
    try:
        with open(os.path.join(args.target, "config.json")) as f:
            context = int(json.load(f).get("max_position_embeddings") or 0)
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise UsageError(f"--target {args.target}: config.json: {e}")
    tokenizer, template = load_tokenizer(args.tokenizer, True)
    template_kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking}
    masker = ChatMasker(tokenizer, template_kwargs)
    stop = _stop_ids(tokenizer, masker)
    work = args.output.rstrip("/") + ".regen"
    options = {"target": os.path.abspath(args.target), "temperature": args.temperature,
               "top_p": args.top_p, "top_k": args.top_k, "max_new_tokens": args.max_new_tokens,
               "seed": args.seed}
    identity = {"inputs": [{"path": os.path.abspath(p), "sha256": sha256_file(p)} for p in args.inputs],
                "tokenizer": os.path.abspath(args.tokenizer), "format": args.format,
                "chat_template_kwargs": template_kwargs, **options,
                "target_files": _target_files(args.target)}
    progress_file = os.path.join(work, "progress.json")
    state_file = os.path.join(work, "conversations.jsonl")
    progress = None
    if os.path.isfile(progress_file):
        with open(progress_file) as f:
            progress = json.load(f)
        was = progress.get("identity") or {}
        if "target_files" not in was:  # written before the target's files were recorded
            was = {**was, "target_files": identity["target_files"]}
        if was != identity:
            if not args.overwrite:
                if {k: v for k, v in was.items() if k != "target_files"} == \
                        {k: v for k, v in identity.items() if k != "target_files"}:
                    raise UsageError(f"{work} holds a regeneration by {args.target} as its files were then: "
                                     "its config.json or weights have changed since (size or modification "
                                     "time); pass --overwrite to regenerate with the target as it is now")
                raise UsageError(f"{work} holds a regeneration with other inputs or options; "
                                 "pass --overwrite to start it again")
            progress = None
    check_output(args.output, args.overwrite or args.reuse)  # before any decoding
    _lock_work(work)  # held until the process ends

    reported = [0]

    def refuse(where, reason):
        reported[0] += 1
        if reported[0] <= MAX_REPORTED_LINES:
            sys.stderr.write(f"{where}: {reason}\n")

    if progress is None:
        _clear_folder(work)
        rows = []
        progress = {"identity": identity, "rounds_done": 0, "lines": 0, "invalid": 0,
                    "report": {"turns": 0, "tokens": 0, "seconds": 0.0, "hit_limit": 0}}
        for batch in _read_batches(args.inputs, BATCH_LINES):
            for path, line_no, raw in batch:
                where = f"{path}:{line_no}"
                progress["lines"] += 1
                try:
                    try:
                        obj = json.loads(raw)
                    except (ValueError, RecursionError) as e:
                        raise BadLine(f"invalid JSON: {e}")
                    if not isinstance(obj, dict):
                        raise BadLine("not a JSON object")
                    fmt = detect_format(obj, args.format)
                    if fmt == "tokenized":
                        _tokenized(obj, len(tokenizer))
                        rows.append({"source": where, "tokenized": obj})
                        continue
                    messages = _messages_sharegpt(obj) if fmt == "sharegpt" else _messages_openai(obj)
                    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
                    if turns and turns[0] == 0:
                        raise BadLine("the conversation starts with an assistant turn: no prompt to "
                                      "regenerate it from")
                    for i in turns:
                        try:
                            masker.render(messages[:i], generation_prompt=True)
                        except Exception as e:  # the template itself refused
                            raise BadLine(f"chat template error before assistant message {i}: "
                                          f"{type(e).__name__}: {e}")
                    rows.append({"source": where, "messages": messages})
                except BadLine as e:
                    progress["invalid"] += 1  # lines that never became a row
                    refuse(where, e)
        _write_atomic(state_file, [("".join(json.dumps(r) + "\n" for r in rows)).encode("utf-8")])
        _write_atomic(progress_file, [json.dumps(progress).encode("utf-8")])
    with open(state_file) as f:
        rows = [json.loads(line) for line in f if line.strip()]

    def turns_of(r):
        if r.get("invalid") or "messages" not in r:
            return []
        return [i for i, m in enumerate(r["messages"]) if m["role"] == "assistant"]

    rounds = max((len(turns_of(r)) for r in rows), default=0)
    start = time.monotonic()
    for k in range(progress["rounds_done"], rounds):
        prompts_path = os.path.join(work, f"round-{k + 1}.prompts.jsonl")
        out_path = os.path.join(work, f"round-{k + 1}.generated.jsonl")
        if not os.path.isfile(prompts_path):
            lines = []
            for j, r in enumerate(rows):
                t = turns_of(r)
                if len(t) <= k:
                    continue
                try:
                    text = masker.render(r["messages"][:t[k]], generation_prompt=True)
                except Exception as e:  # the template refused a regenerated history
                    r["invalid"] = f"chat template error before assistant message {t[k]}: {type(e).__name__}: {e}"
                    refuse(r["source"], r["invalid"])
                    continue
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if context and len(ids) + args.max_new_tokens > context:
                    r["invalid"] = (f"assistant message {t[k]}: its prompt has {len(ids)} tokens, and with "
                                    f"--max-new-tokens {args.max_new_tokens} the target would run past its context "
                                    f"(max_position_embeddings = {context})")
                    refuse(r["source"], r["invalid"])
                    continue
                lines.append(json.dumps({"source": r["source"], "conversation": j, "ids": ids}))
            # The conversations refused above are recorded before the round's prompts exist.
            _write_atomic(state_file, [("".join(json.dumps(r) + "\n" for r in rows)).encode("utf-8")])
            _write_atomic(progress_file, [json.dumps(progress).encode("utf-8")])
            header = json.dumps({"format": "tandem.prompts.v1", "stop_ids": stop, "count": len(lines)})
            _write_atomic(prompts_path, [("\n".join([header] + lines) + "\n").encode("utf-8")])
        members = _round_members(prompts_path)
        sys.stderr.write(f"prepare: regenerating assistant turn {k + 1} of {rounds} "
                         f"({len(members):,} conversations)\n")
        if members:
            cmd = [args.tandem_bin, "generate", "--target", args.target, "--prompts", prompts_path,
                   "--out", out_path, "--max-new-tokens", str(args.max_new_tokens),
                   "--temperature", str(args.temperature), "--top-p", str(args.top_p),
                   "--top-k", str(args.top_k), "--device", args.device, "--batch", str(args.batch),
                   "--seed", str(args.seed + k)]
            if args.quiet:
                cmd.append("--quiet")
            # TANDEM_DIE_WITH_PARENT: the decoder ends when this process does (even by SIGKILL).
            done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, TANDEM_DIE_WITH_PARENT="1"))
            if done.returncode != 0:
                raise RuntimeError(f"tandem generate failed (exit {done.returncode}) in round {k + 1} (its "
                                   f"error is above); the rounds finished so far are kept in {work}: run "
                                   "the command again (another --batch or --device is allowed) to resume")
            report = json.loads(done.stdout.strip().splitlines()[-1])
            generated = _read_generated(out_path)
            if len(generated) != len(members):
                raise RuntimeError(f"{out_path} holds {len(generated)} of {len(members)} generations")
            for idx, j in enumerate(members):
                g = generated[idx]
                tokens = g["tokens"]
                if tokens and tokens[-1] in stop:
                    tokens = tokens[:-1]
                text = tokenizer.decode(tokens, skip_special_tokens=False)
                if masker.eot in text:  # cannot be a turn's content; cut there
                    text = text[:text.index(masker.eot)]
                rows[j]["messages"][turns_of(rows[j])[k]]["content"] = text
                progress["report"]["turns"] += 1
                progress["report"]["tokens"] += len(g["tokens"])
                progress["report"]["hit_limit"] += bool(g["hit_limit"])
            progress["report"]["seconds"] += report.get("seconds", 0.0)
        progress["rounds_done"] = k + 1
        _write_atomic(state_file, [("".join(json.dumps(r) + "\n" for r in rows)).encode("utf-8")])
        _write_atomic(progress_file, [json.dumps(progress).encode("utf-8")])
    # The samples keep the exact ids the target generated for its last turn (decoding them to
    # text and tokenizing again gives other ids for ~40% of the tiny default's turns: the
    # target emits non-canonical BPE splits), after the ids of the prompt it was given; the
    # earlier turns are supervised where the template renders them (not with --last-turn-only).
    out = os.path.join(work, "regenerated.jsonl")
    last = {}  # round -> {conversation: (prompt ids, generated ids)}
    lines = []
    for j, r in enumerate(rows):
        if r.get("invalid"):
            continue
        t = turns_of(r)
        if not t:
            lines.append(r.get("tokenized") or {"messages": r["messages"]})
            continue
        k = len(t) - 1
        if k not in last:
            members = _round_members(os.path.join(work, f"round-{k + 1}.prompts.jsonl"))
            with open(os.path.join(work, f"round-{k + 1}.prompts.jsonl")) as f:
                ids = [json.loads(line)["ids"] for line in f.readlines()[1:] if line.strip()]
            generated = _read_generated(os.path.join(work, f"round-{k + 1}.generated.jsonl"))
            last[k] = {m: (ids[i], generated[i]["tokens"]) for i, m in enumerate(members)}
        prompt_ids, generated = last[k][j]
        before = r["messages"][:t[k]]
        text = masker.render(before, generation_prompt=True)
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans = []
        if k > 0 and not args.last_turn_only:
            head, spans = masker.spans(before, False)
            if not text.startswith(head):
                spans = []
        mask = ChatMasker.mask(enc["offset_mapping"], spans).tolist() if enc["input_ids"] else []
        if enc["input_ids"] != prompt_ids:  # cannot happen: the same rendering made the prompt
            raise RuntimeError(f"{r['source']}: the prompt renders to other ids than round {k + 1} used")
        lines.append({"input_ids": prompt_ids + generated, "loss_mask": mask + [1] * len(generated)})
    _write_atomic(out, [("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines)).encode("utf-8")])
    rep = progress["report"]
    # Refused: the lines that never became a row, and the rows marked during the rounds (the
    # marks live in the rows, so a crash between two writes cannot lose a count).
    invalid = progress["invalid"] + sum(1 for r in rows if r.get("invalid"))
    sys.stderr.write(
        f"prepare: regenerated {rep['turns']:,} assistant turns of {len(lines):,} conversations "
        f"({invalid:,} invalid lines skipped): {rep['tokens']:,} tokens in "
        f"{rep['seconds']:.1f} s of decoding ({rep['tokens'] / max(rep['seconds'], 1e-9):,.0f} tokens/s), "
        f"{rep['hit_limit']:,} hit --max-new-tokens {args.max_new_tokens}; "
        f"{time.monotonic() - start:.1f} s this run; conversations in {out}\n")
    record = {"options": options, "lines": progress["lines"], "invalid_lines": invalid,
              "turns": rep["turns"], "tokens": rep["tokens"], "hit_limit": rep["hit_limit"],
              "decode_seconds": round(rep["seconds"], 3), "work": work}
    return out, record


def run(args):
    if args.prompts_out is not None:
        return render_prompts(args)
    regeneration = None
    sources = args.inputs  # the lines read: the inputs, or what regeneration made of them
    if args.regenerate:
        regenerated, regeneration = regenerate(args)
        sources = [regenerated]
    reporter = Reporter(args.quiet)
    for path in args.inputs:
        if not os.path.isfile(path):
            raise UsageError(f"input {path} does not exist or is not a file")
    check_output(args.output, args.overwrite or args.reuse)
    need_template = args.format != "tokenized" or args.regenerate
    tokenizer, template = load_tokenizer(args.tokenizer, need_template)
    template_kwargs = {} if args.enable_thinking is None else {"enable_thinking": args.enable_thinking}
    if template is not None:
        if args.enable_thinking is not None and "enable_thinking" not in template:
            reporter.message("prepare: warning: --enable-thinking/--no-enable-thinking given, but the "
                             "chat template does not read enable_thinking")
        if args.enable_thinking is None and "enable_thinking" in template:
            reporter.message("prepare: note: the chat template reads enable_thinking; rendering with its "
                             "default. Pass --enable-thinking or --no-enable-thinking to match how the "
                             "target is served.")
    opts = {"block_size": args.block_size, "min_supervised": args.min_supervised,
            "max_length": args.max_length, "last_turn_only": args.last_turn_only,
            "input_format": args.format, "chat_template_kwargs": template_kwargs}
    if regeneration is not None:
        opts["regenerate"] = regeneration["options"]
    # Regenerated samples are tokenized lines (and conversations without an assistant turn,
    # passed through): --format applied to the inputs, while regeneration read them.
    processor = BatchProcessor(tokenizer, template, dict(opts, input_format="auto") if args.regenerate else opts)
    identity = {
        "inputs": [{"path": os.path.abspath(p), "sha256": sha256_file(p), "bytes": os.path.getsize(p)}
                   for p in args.inputs],
        "tokenizer_sha256": sha256_file(os.path.join(args.tokenizer, "tokenizer.json")),
        "chat_template_sha256": (hashlib.sha256(template.encode("utf-8")).hexdigest()
                                 if template is not None else None),
        "options": {k: opts[k] for k in MANIFEST_OPTIONS + ("regenerate",) if k in opts},
    }
    if args.reuse:
        differs = _differs_from_existing(args.output, identity, reporter)
        if differs is None:
            reporter.message(f"prepare: {args.output} already holds this data set (same inputs, "
                             "tokenizer, chat template and options); reusing it")
            return EXIT_OK
        if differs and not args.overwrite:
            raise UsageError(f"output folder {args.output} holds a data set prepared from other "
                             f"{differs}; delete it, or prepare into another folder")
    staging, made = prepare_output(args.output, args.overwrite or (args.reuse and differs == ""))
    try:
        return _write_dataset(args, sources, staging, reporter, tokenizer, template, processor,
                              identity, regeneration)
    finally:
        if os.path.isdir(staging):  # failed or interrupted: an older data set stays as it was
            import shutil
            shutil.rmtree(staging, ignore_errors=True)
            remove_made_folders(made)


def _write_dataset(args, sources, staging, reporter, tokenizer, template, processor, identity,
                   regeneration):
    counts = {"lines": 0, "samples": 0, "tokens": 0, "invalid": 0, "short": 0, "truncated": 0}
    if regeneration is not None:  # the input lines regeneration refused
        counts["lines"] = counts["invalid"] = regeneration["invalid_lines"]
    by_format = dict.fromkeys(FORMATS, 0)
    writer = ShardWriter(staging, args.shard_tokens)
    reporter.begin()
    for batch in _read_batches(sources, BATCH_LINES):
        results = processor.process([raw for _, _, raw in batch])
        for (path, line_no, _), result in zip(batch, results):
            counts["lines"] += 1
            if result[0] == "bad":
                counts["invalid"] += 1
                if counts["invalid"] <= MAX_REPORTED_LINES:
                    reporter.message(f"{path}:{line_no}: {result[1]}")
            elif result[0] == "short":
                counts["short"] += 1
            else:
                _, fmt, ids, mask, truncated = result
                writer.add(ids, mask)
                counts["samples"] += 1
                counts["tokens"] += len(ids)
                counts["truncated"] += truncated
                by_format[fmt] += 1
        reporter.progress(counts)
    writer.flush()
    reporter.progress(counts, force=True)
    reporter.done()
    if counts["invalid"] > MAX_REPORTED_LINES:
        reporter.message(f"prepare: ... and {counts['invalid'] - MAX_REPORTED_LINES:,} more invalid lines")

    if counts["samples"] == 0:
        reporter.message(
            f"prepare: error: no sample survived ({counts['lines']:,} lines: {counts['invalid']:,} invalid, "
            f"{counts['short']:,} with fewer than {args.min_supervised} supervised tokens); "
            f"{args.output} left as it was")
        return EXIT_USAGE  # the inputs hold nothing to train on: bad input, as a missing one is

    shards = writer.shards
    content = hashlib.sha256("".join(s["sha256"] for s in shards).encode("ascii")).hexdigest()
    manifest = {
        "format": DATASET_FORMAT,
        "created_by": f"tandem prepare {args.tandem_version}",
        "tokenizer": {
            "source": args.tokenizer,
            "vocab_size": len(tokenizer),
            "sha256": sha256_file(os.path.join(args.tokenizer, "tokenizer.json")),
            "chat_template_sha256": (hashlib.sha256(template.encode("utf-8")).hexdigest()
                                     if template is not None else None),
            # Checked against the target's config.json by `tandem run` (docs/data.md).
            "eos_token_id": _token_id(tokenizer.eos_token_id),
            "bos_token_id": _token_id(tokenizer.bos_token_id),
            "pad_token_id": _token_id(tokenizer.pad_token_id),
        },
        "options": identity["options"],
        "inputs": identity["inputs"],
        "shards": shards,
        "totals": {"samples": sum(s["num_samples"] for s in shards),
                   "tokens": sum(s["num_tokens"] for s in shards),
                   "supervised": sum(s["num_supervised"] for s in shards)},
        "report": {"lines": counts["lines"], "invalid_lines": counts["invalid"],
                   "dropped_short": counts["short"], "truncated": counts["truncated"],
                   "by_format": by_format},
        "content_hash": content,
    }
    if regeneration is not None:
        manifest["regeneration"] = regeneration
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    publish(staging, args.output, text)

    t = manifest["totals"]
    elapsed = time.monotonic() - reporter.start
    reporter.message(
        f"prepare: wrote {t['samples']:,} samples, {t['tokens']:,} tokens "
        f"({t['supervised']:,} supervised, {100.0 * t['supervised'] / max(t['tokens'], 1):.1f}%) "
        f"in {len(shards)} shard(s) to {args.output}\n"
        f"prepare: {counts['lines']:,} lines: {counts['invalid']:,} invalid, "
        f"{counts['short']:,} dropped (< {args.min_supervised} supervised tokens), "
        f"{counts['truncated']:,} truncated (> {args.max_length} tokens); "
        + ", ".join(f"{f} {n:,}" for f, n in by_format.items())
        + f"; {elapsed:.1f} s ({counts['lines'] / max(elapsed, 1e-9):,.0f} lines/s)")
    return EXIT_OK


def main(argv=None):
    args = parse_args(argv)
    # Read by the tokenizers library when it first tokenizes (batches are encoded in parallel).
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if args.threads == 1 else "true"
    if args.threads > 1:
        os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    try:
        return run(args)
    except UsageError as e:
        sys.stderr.write(f"tandem prepare: error: {e}\n")
        return EXIT_USAGE
    except (OSError, RuntimeError) as e:
        sys.stderr.write(f"tandem prepare: error: {e}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        where = args.output or args.prompts_out
        sys.stderr.write(f"\ntandem prepare: interrupted; {where} left as it was"
                         + (" (run the same command again to resume the regeneration)" if args.regenerate else "")
                         + "\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
