#!/usr/bin/env python3
"""Build a small, real Hugging Face tokenizer for the tests of `tandem prepare`.

    ~/.cache/tandem/venv/bin/python tools/prepare/make_test_tokenizer.py OUT_DIR [--template chatml|qwen3]

A byte-level BPE (GPT-2/Qwen style pre-tokenizer, every byte encodable) trained in-process
with the `tokenizers` library on the short English/Python text embedded below, with the
special tokens <|endoftext|>, <|im_start|>, <|im_end|> (ids 0, 1, 2). OUT_DIR becomes a
transformers tokenizer folder (tokenizer.json, tokenizer_config.json, chat_template.jinja),
loadable offline with AutoTokenizer.from_pretrained(OUT_DIR, local_files_only=True).

Chat templates (both written for Tandem's tests, in the ChatML layout Qwen models use):

- `chatml` (default): Qwen2.5-like. A default system prompt when the first message is not a
  system message; every message is `<|im_start|>ROLE\\nCONTENT<|im_end|>\\n`; the
  generation prompt is `<|im_start|>assistant\\n`.
- `qwen3`: Qwen3-like thinking template. An assistant turn after the last user message is
  rendered with a think block (`<think>\\nREASONING\\n</think>\\n\\n` + answer; reasoning
  taken from `<think>...</think>` in the content, empty if none); earlier assistant turns
  show the answer only. `enable_thinking=false` adds an empty think block to the generation
  prompt. This template is not prefix-stable for earlier turns with enable_thinking=false,
  which exercises the fallback of tandem_prepare.py's mask algorithm.

Deterministic: the corpus is in this file, training is single-threaded; two runs write
byte-identical files.
"""

import argparse
import os
import sys

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread: deterministic training
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 1024  # upper bound; a corpus this small yields about this many merges

CHATML_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{%- if loop.first and message.role != 'system' %}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)

QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}\n"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' %}{%- set ns.last_query = loop.index0 %}{%- endif %}"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'assistant' %}\n"
    "{%- set content = message.content %}{%- set reasoning = '' %}\n"
    "{%- if '</think>' in content %}\n"
    "{%- set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}\n"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}\n"
    "{%- endif %}\n"
    "{%- if loop.index0 > ns.last_query %}"
    "{{- '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- else %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}\n"
)

# Tool use as Qwen3's template renders it (written for this file, reduced to what the
# loss mask meets): the function definitions in the system turn, an assistant's tool calls
# as <tool_call> blocks inside its turn, consecutive tool answers as one user turn of
# <tool_response> blocks.
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "{%- if message.role == 'user' %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + message.content }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "{%- if (loop.first and message.content) or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- set fn = call.function if call.function else call %}"
    "{{- '<tool_call>\\n{\\\"name\\\": \\\"' + fn.name + '\\\", \\\"arguments\\\": ' + (fn.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}{%- endif %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
)

TEMPLATES = {"chatml": CHATML_TEMPLATE, "qwen3": QWEN3_TEMPLATE, "tools": TOOLS_TEMPLATE}

# Training text: a few KB, written for this file.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A tokenizer splits text into pieces that a
model can count. Speculative decoding lets a small drafter propose several tokens and the
target model verify them in one forward pass; the accepted prefix is kept.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris is
the capital of France. What is two plus two? Two plus two is four.
Please write a short poem about the sea. The sea is wide, the sea is deep, the waves roll
in while sailors sleep. Explain recursion in one sentence. Recursion is when a function
calls itself on a smaller part of the problem until it reaches a base case.
def fibonacci(n):
    \"\"\"Return the n-th Fibonacci number.\"\"\"
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a

class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        return self.items.pop()

import json
with open("data.jsonl") as f:
    for line in f:
        record = json.loads(line)
        print(record["messages"][0]["content"])

The assistant answers the user's question. The user asks; the assistant replies. A system
message sets the rules of the conversation. Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024.
Training a drafter needs many conversations with responses written by the target itself,
so that the drafter learns to predict exactly what the target will say next.
Shards hold tokens, a loss mask and offsets; the manifest lists every shard and its hash.
Lists, tuples, dictionaries and sets are the built-in containers of Python. Strings are
immutable sequences of Unicode code points. Errors should never pass silently.
Simple is better than complex. Readability counts. In the face of ambiguity, refuse the
temptation to guess. Now is better than never.
Water boils at one hundred degrees Celsius at sea level. The Earth goes around the Sun
once a year, and the Moon goes around the Earth about once a month.
Thank you for your help! You're welcome. Let me know if there is anything else.
"""


def build(out_dir: str, template: str = "chatml") -> None:
    """Trains the tokenizer and saves it, with the chosen chat template, to out_dir."""
    from transformers import PreTrainedTokenizerFast  # slow import: only when building

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=TEMPLATES[template],
    )
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="folder to write the tokenizer to (created if missing)")
    parser.add_argument("--template", choices=sorted(TEMPLATES), default="chatml",
                        help="chat template to attach (default: chatml)")
    args = parser.parse_args(argv)
    build(args.out_dir, args.template)
    print(f"wrote {args.template} test tokenizer to {args.out_dir}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
