"""A small token dataset in Tandem's shard format (docs/data.md) for the
runtime tests: 64 periodic sequences (learnable) over a 512-token vocabulary
(the parity fixtures' tiny Qwen3), the first third of each unsupervised.

usage: make_run_dataset.py OUT_DIR
"""
import hashlib
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

out = sys.argv[1]
os.makedirs(out)
rng = np.random.default_rng(0)
toks, masks, lens = [], [], []
for _ in range(64):
    n = int(rng.integers(60, 200))
    base = rng.integers(0, 500, size=8)
    t = np.array([base[j % 8] for j in range(n)], dtype=np.int32)
    m = np.zeros(n, dtype=np.uint8)
    m[n // 3:] = 1
    toks.append(t)
    masks.append(m)
    lens.append(n)
tokens, mask = np.concatenate(toks), np.concatenate(masks)
offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
shard = os.path.join(out, "shard-00000.safetensors")
save_file({"tokens": tokens, "loss_mask": mask, "offsets": offsets}, shard,
          metadata={"format": "tandem.shard.v1", "num_samples": "64",
                    "num_tokens": str(len(tokens))})
digest = hashlib.sha256(open(shard, "rb").read()).hexdigest()
manifest = {
    "format": "tandem.dataset.v1",
    "created_by": "tests/integration/make_run_dataset.py",
    "tokenizer": {"source": "synthetic", "vocab_size": 512, "sha256": "",
                  "chat_template_sha256": None},
    "options": {},
    "shards": [{"file": "shard-00000.safetensors", "num_samples": 64,
                "num_tokens": int(len(tokens)), "num_supervised": int(mask.sum()),
                "sha256": digest}],
    "totals": {"samples": 64, "tokens": int(len(tokens)), "supervised": int(mask.sum())},
    "report": {},
    "content_hash": hashlib.sha256(digest.encode()).hexdigest(),
}
with open(os.path.join(out, "manifest.json"), "w") as f:
    json.dump(manifest, f)
