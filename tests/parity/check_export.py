"""Loads the drafter Tandem exported (z-lab layout) with the `dflash` package
and checks it reproduces the dflash_tiny reference forward.

usage: check_export.py FIXTURES_DIR        (reads FIXTURES_DIR/export_dflash)
Tolerance: 1e-4 relative (tests/parity/tolerances.hpp, drafter_rel).
"""
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from dflash import DFlashDraftModel
from transformers import AutoConfig

fixtures = Path(sys.argv[1])
export = fixtures / "export_dflash"
if not (export / "config.json").exists():
    sys.exit(f"FAIL: {export} has no config.json (the C++ export test writes it first)")

model = DFlashDraftModel.from_pretrained(str(export), torch_dtype=torch.float32).eval()
ref = load_file(str(fixtures / "dflash_tiny" / "reference.safetensors"))
target = load_file(str(fixtures / "qwen3_tiny" / "model.safetensors"))
embed = target["model.embed_tokens.weight"]
with torch.no_grad():
    out = model(
        position_ids=ref["position_ids"],
        attention_mask=ref["attention_mask"].bool(),
        noise_embedding=torch.nn.functional.embedding(ref["noise_input_ids"], embed),
        target_hidden=ref["target_hidden"],
    )
keep = ref["keep"].bool().repeat_interleave(model.block_size, 1)[0]
ours, theirs = out[0, keep].double(), ref["output"][0, keep].double()
err = ((ours - theirs).norm() / theirs.norm()).item()
print(f"dflash loads Tandem's export: block_size {model.block_size}, "
      f"target_layer_ids {model.target_layer_ids}, mask_token_id {model.mask_token_id}; "
      f"output rel err {err:.3e}")
if not err <= 1e-4:
    sys.exit(f"FAIL: rel err {err:.3e} > 1e-4")
print("1 passed, 0 failed")
