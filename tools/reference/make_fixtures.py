#!/usr/bin/env python3
"""Generate Tandem's parity fixtures (spec: tests/parity/FIXTURES.md).

    ~/.cache/tandem/venv/bin/python tools/reference/make_fixtures.py OUT_DIR

Writes OUT_DIR/{qwen3_tiny, qwen3_tiny_tied, dflash_tiny, dflash_loss}/. Everything is
float32 on the CPU, built from configs in code (no hub access), seeded with private
torch.Generator objects, single-threaded: two runs on the same machine give byte-identical
files. References: transformers.Qwen3ForCausalLM (eager attention), dflash.DFlashDraftModel,
and an independent plain-PyTorch implementation of the DFlash training objective (below).
The script also runs a few self-checks (HF hidden-state layout, checkpoint reload, a
hand-written drafter forward against the dflash package, document isolation) and stops
with an AssertionError if any fails.
"""

import importlib.metadata
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

import transformers  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm  # noqa: E402

import dflash  # noqa: E402
from dflash.model import DFlashDraftModel  # noqa: E402

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()

# ----------------------------------------------------------------------------------------
# Constants (FIXTURES.md)
# ----------------------------------------------------------------------------------------
VOCAB = 512
MASK_ID = 511
HIDDEN = 64
TARGET_LAYERS = 8
N_TAPS = 5
BS = 8            # drafter block size
N_BLOCKS = 4      # anchors per row
SEQ = 48          # drafter fixtures' sequence length
GAMMA = 4.0       # loss decay for Bs = 8

SEED_QWEN3 = 1234
SEED_QWEN3_TIED = 1235
SEED_DRAFTER = 99
# Seeds of the inputs (not fixed by FIXTURES.md; changing them changes the fixtures).
SEED_QWEN3_INPUTS = 2024
SEED_DFLASH_TINY_INPUTS = 2025
SEED_DFLASH_LOSS_INPUTS = 2026


def qwen3_config(tied: bool) -> Qwen3Config:
    return Qwen3Config(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=TARGET_LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        tie_word_embeddings=tied,
    )


def tap_layer_ids(num_layers: int, n: int) -> list[int]:
    # DFLASH.md: id_i = round(1 + i*(L-4)/(n-1))
    return [round(1 + i * (num_layers - 4) / (n - 1)) for i in range(n)]


TAP_IDS = tap_layer_ids(TARGET_LAYERS, N_TAPS)
assert TAP_IDS == [1, 2, 3, 4, 5], TAP_IDS

# z-lab layout of the drafter's config.json (the fields FIXTURES.md lists, plus
# model_type / dtype so that transformers and dflash load it).
DRAFTER_CONFIG_JSON = {
    "architectures": ["DFlashDraftModel"],
    "model_type": "qwen3",
    "block_size": BS,
    "num_target_layers": TARGET_LAYERS,
    "dflash_config": {"mask_token_id": MASK_ID, "target_layer_ids": TAP_IDS},
    "hidden_size": HIDDEN,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "max_position_embeddings": 256,
    "dtype": "float32",
}


def drafter_config() -> Qwen3Config:
    fields = {k: v for k, v in DRAFTER_CONFIG_JSON.items()
              if k not in ("architectures", "model_type", "dtype")}
    return Qwen3Config(**fields)


# ----------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------
def init_params(model: torch.nn.Module, seed: int) -> None:
    """std 0.2 normal for Linear/Embedding weights, 1 + 0.1 N(0,1) for RMSNorm weights.

    Parameters are visited in named_parameters() order (shared tensors once)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            owner = model.get_submodule(name.rsplit(".", 1)[0])
            leaf = name.rsplit(".", 1)[1]
            noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if isinstance(owner, Qwen3RMSNorm) and leaf == "weight":
                p.copy_(1.0 + 0.1 * noise)
            elif isinstance(owner, (torch.nn.Linear, torch.nn.Embedding)) and leaf == "weight":
                p.copy_(0.2 * noise)
            else:
                raise AssertionError(f"unexpected parameter {name} ({type(owner).__name__})")


FIXTURE_FILES = ("config.json", "model.safetensors", "reference.safetensors",
                 "generation_config.json")


def fresh_dir(path: str) -> None:
    """Create path; remove the files a previous run left there (only those names)."""
    os.makedirs(path, exist_ok=True)
    for fn in FIXTURE_FILES:
        if os.path.exists(os.path.join(path, fn)):
            os.remove(os.path.join(path, fn))


def random_tokens(g: torch.Generator, *shape: int) -> torch.Tensor:
    # never the mask token
    return torch.randint(0, MASK_ID, shape, generator=g, dtype=torch.int64)


def save(path: str, tensors: dict) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    for k, v in tensors.items():
        if v.is_floating_point():
            assert v.dtype == torch.float32 and torch.isfinite(v).all(), k
    save_file(tensors, path)


def build_qwen3(tied: bool, seed: int) -> Qwen3ForCausalLM:
    model = Qwen3ForCausalLM._from_config(qwen3_config(tied), attn_implementation="eager",
                                          dtype=torch.float32)
    assert model.config._attn_implementation == "eager"
    model = model.float().eval()
    init_params(model, seed)
    if tied:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


@torch.no_grad()
def qwen3_run(model: Qwen3ForCausalLM, ids: torch.Tensor):
    """logits [B,T,V], hidden_states [L+1,B,T,D], taps [B,T,5D] (positions 0..T-1)."""
    out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
    hs = torch.stack(out.hidden_states, dim=0)
    taps = torch.cat([out.hidden_states[i + 1] for i in TAP_IDS], dim=-1)
    return out.logits, hs, taps


@torch.no_grad()
def qwen3_run_docs(model, ids: torch.Tensor, doc_lengths: list[int]):
    """Each document of one packed row run on its own (positions restart); concatenated."""
    assert ids.shape[0] == 1 and sum(doc_lengths) == ids.shape[1]
    logits, taps, start = [], [], 0
    for n in doc_lengths:
        lg, _, tp = qwen3_run(model, ids[:, start:start + n])
        logits.append(lg)
        taps.append(tp)
        start += n
    return torch.cat(logits, dim=1), torch.cat(taps, dim=1)


# ----------------------------------------------------------------------------------------
# qwen3_tiny / qwen3_tiny_tied
# ----------------------------------------------------------------------------------------
def make_qwen3(out_dir: str, tied: bool) -> Qwen3ForCausalLM:
    fresh_dir(out_dir)
    model = build_qwen3(tied, SEED_QWEN3_TIED if tied else SEED_QWEN3)
    model.save_pretrained(out_dir, safe_serialization=True)
    # FIXTURES.md: config.json + model.safetensors only.
    gen_cfg = os.path.join(out_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    assert sorted(os.listdir(out_dir)) == ["config.json", "model.safetensors"], os.listdir(out_dir)

    with open(os.path.join(out_dir, "config.json")) as f:
        cfg = json.load(f)
    assert cfg["tie_word_embeddings"] is tied
    with safe_open(os.path.join(out_dir, "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.float32 for k in keys)
    assert ("lm_head.weight" in keys) is (not tied), sorted(keys)[:3]

    g = torch.Generator().manual_seed(SEED_QWEN3_INPUTS)
    input_ids = random_tokens(g, 2, 40)
    packed_ids = random_tokens(g, 1, 40)
    doc_lengths = [15, 25]

    # Layout self-check: index 0 = embeddings, index i = output of layer i-1, and the last
    # entry is the final-norm output (HF overwrites it), not the raw residual of layer 7.
    captured = {}
    hook = model.model.layers[-1].register_forward_hook(
        lambda m, a, o: captured.__setitem__("last", o[0] if isinstance(o, tuple) else o))
    logits, hs, taps = qwen3_run(model, input_ids)
    hook.remove()
    assert hs.shape == (TARGET_LAYERS + 1, 2, 40, HIDDEN)
    with torch.no_grad():
        assert torch.equal(hs[0], model.model.embed_tokens(input_ids))
        assert torch.allclose(hs[-1], model.model.norm(captured["last"]), atol=1e-6)
        assert not torch.allclose(hs[-1], captured["last"], atol=1e-3)
        # every layer visibly changes the residual stream
        for i in range(TARGET_LAYERS - 1):
            rel = (hs[i + 1] - hs[i]).norm() / hs[i].norm()
            assert rel > 0.05, (i, rel)

    packed_logits, packed_taps = qwen3_run_docs(model, packed_ids, doc_lengths)

    # Reload self-check: the saved checkpoint reproduces the logits.
    reloaded = Qwen3ForCausalLM.from_pretrained(out_dir, attn_implementation="eager",
                                                dtype=torch.float32).eval()
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=input_ids).logits, logits)

    save(os.path.join(out_dir, "reference.safetensors"), {
        "input_ids": input_ids,
        "logits": logits,
        "hidden_states": hs,
        "tap_ids": torch.tensor(TAP_IDS, dtype=torch.int64),
        "taps": taps,
        "packed_input_ids": packed_ids,
        "packed_doc_lengths": torch.tensor(doc_lengths, dtype=torch.int64),
        "packed_taps": packed_taps,
        "packed_logits": packed_logits,
    })
    return model


# ----------------------------------------------------------------------------------------
# Drafter inputs: block layout, dense mask (independent of Tandem and of dflash)
# ----------------------------------------------------------------------------------------
def doc_bounds(doc_lengths: torch.Tensor, S: int):
    """Per position: start and end (exclusive) of its document. [B,S] each."""
    B = doc_lengths.shape[0]
    start = torch.zeros(B, S, dtype=torch.int64)
    end = torch.zeros(B, S, dtype=torch.int64)
    for b in range(B):
        pos = 0
        for n in doc_lengths[b].tolist():
            if n == 0:
                continue
            start[b, pos:pos + n] = pos
            end[b, pos:pos + n] = pos + n
            pos += n
        assert pos == S, "documents must fill the row"
    return start, end


def block_layout(tokens, anchors, keep, doc_lengths):
    """Returns noise_input_ids [B,N*Bs], position_ids [B,S+N*Bs], attention_mask
    bool [B,1,N*Bs,S+N*Bs] (True = visible), and per-anchor doc start/end [B,N].

    Query in block j sees context key kv iff doc_start(anchor_j) <= kv < anchor_j, and block
    key kv >= S iff it lies in block j; all AND keep_j. A padding block (keep 0) sees only its
    own block's first key, so that softmax stays finite."""
    B, S = tokens.shape
    N = anchors.shape[1]
    Q = N * BS
    dstart, dend = doc_bounds(doc_lengths, S)
    a_start = dstart.gather(1, anchors)
    a_end = dend.gather(1, anchors)
    k = torch.arange(BS)

    noise = torch.full((B, N, BS), MASK_ID, dtype=torch.int64)
    noise[:, :, 0] = tokens.gather(1, anchors)
    noise = noise.view(B, Q)

    ctx_pos = torch.arange(S)[None, :] - dstart
    blk_pos = (anchors - a_start)[:, :, None] + k[None, None, :]
    position_ids = torch.cat([ctx_pos, blk_pos.view(B, Q)], dim=1)

    kv = torch.arange(S + Q)
    q_block = torch.arange(Q) // BS                                     # [Q]
    qa = anchors[:, q_block]                                            # [B,Q]
    qs = a_start[:, q_block]
    qkeep = keep.bool()[:, q_block]
    ctx_vis = (kv[None, None, :] < S) & (kv[None, None, :] >= qs[:, :, None]) \
        & (kv[None, None, :] < qa[:, :, None])
    blk_vis = (kv[None, None, :] >= S) & (((kv[None, None, :] - S) // BS) == q_block[None, :, None])
    vis = (ctx_vis | blk_vis) & qkeep[:, :, None]
    first_key = (S + q_block * BS)                                      # [Q]
    pad_fix = (~qkeep)[:, :, None] & (kv[None, None, :] == first_key[None, :, None])
    vis = vis | pad_fix
    assert vis.any(-1).all()
    return noise, position_ids, vis[:, None], a_start, a_end


def drafter_forward(drafter, embed_weight, target_hidden, noise_ids, position_ids, mask):
    noise_embedding = F.embedding(noise_ids, embed_weight)
    return drafter(position_ids=position_ids, attention_mask=mask,
                   noise_embedding=noise_embedding, target_hidden=target_hidden)


def manual_drafter_forward(sd, cfg, embed_weight, target_hidden, noise_ids, position_ids, mask):
    """Plain-PyTorch drafter (eager attention, additive mask) used only to cross-check the
    dflash package's forward and its bool-mask convention."""
    eps, hd = cfg["rms_norm_eps"], cfg["head_dim"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(x, pos):  # x [B,H,T,hd], pos [B,T]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = pos[:, None, :, None].float() * inv
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    B, S, _ = target_hidden.shape
    Q = noise_ids.shape[1]
    th = rms(target_hidden @ sd["fc.weight"].T, sd["hidden_norm.weight"])
    h = F.embedding(noise_ids, embed_weight)
    bias = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, sd[p + "input_layernorm.weight"])
        q = (x @ sd[p + "self_attn.q_proj.weight"].T).view(B, Q, nh, hd)
        kin = torch.cat([th, x], 1)
        kk = (kin @ sd[p + "self_attn.k_proj.weight"].T).view(B, S + Q, nkv, hd)
        vv = (kin @ sd[p + "self_attn.v_proj.weight"].T).view(B, S + Q, nkv, hd)
        q = rms(q, sd[p + "self_attn.q_norm.weight"]).transpose(1, 2)
        kk = rms(kk, sd[p + "self_attn.k_norm.weight"]).transpose(1, 2)
        vv = vv.transpose(1, 2)
        q, kk = rope(q, position_ids[:, S:]), rope(kk, position_ids)
        kk = kk.repeat_interleave(nh // nkv, 1)
        vv = vv.repeat_interleave(nh // nkv, 1)
        att = torch.softmax(q @ kk.transpose(-1, -2) * hd ** -0.5 + bias, -1)
        o = (att @ vv).transpose(1, 2).reshape(B, Q, nh * hd)
        h = h + o @ sd[p + "self_attn.o_proj.weight"].T
        x = rms(h, sd[p + "post_attention_layernorm.weight"])
        mlp = F.silu(x @ sd[p + "mlp.gate_proj.weight"].T) * (x @ sd[p + "mlp.up_proj.weight"].T)
        h = h + mlp @ sd[p + "mlp.down_proj.weight"].T
    return rms(h, sd["norm.weight"])


def build_drafter() -> DFlashDraftModel:
    drafter = DFlashDraftModel(drafter_config()).float().eval()
    init_params(drafter, SEED_DRAFTER)
    assert drafter.target_layer_ids == TAP_IDS and drafter.block_size == BS
    assert drafter.mask_token_id == MASK_ID
    return drafter


# ----------------------------------------------------------------------------------------
# dflash_tiny
# ----------------------------------------------------------------------------------------
def make_dflash_tiny(out_dir: str, target: Qwen3ForCausalLM) -> DFlashDraftModel:
    fresh_dir(out_dir)
    drafter = build_drafter()
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(DRAFTER_CONFIG_JSON, f, indent=2, sort_keys=False)
        f.write("\n")
    sd = {k: v.detach().clone() for k, v in drafter.state_dict().items()}
    assert set(sd) == {n for n, _ in drafter.named_parameters()}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})

    g = torch.Generator().manual_seed(SEED_DFLASH_TINY_INPUTS)
    tokens = random_tokens(g, 1, SEQ)
    _, _, target_hidden = qwen3_run(target, tokens)
    # Anchor 0 (a block with no visible context), one in the middle, the last legal one
    # (S - Bs), then a padding slot (keep 0, anchor 0).
    anchors = torch.tensor([[0, 13, SEQ - BS, 0]], dtype=torch.int64)
    keep = torch.tensor([[1, 1, 1, 0]], dtype=torch.uint8)
    doc_lengths = torch.tensor([[SEQ]], dtype=torch.int64)
    noise, pos, mask, _, _ = block_layout(tokens, anchors, keep, doc_lengths)

    embed = target.model.embed_tokens.weight.detach()
    with torch.no_grad():
        output = drafter_forward(drafter, embed, target_hidden, noise, pos, mask)
        logits = target.lm_head(output)

        # Cross-checks: hand-written forward; checkpoint reload through the public API.
        manual = manual_drafter_forward(sd, DRAFTER_CONFIG_JSON, embed, target_hidden, noise, pos, mask)
        live = torch.repeat_interleave(keep.bool(), BS, dim=1)
        err = (manual - output)[live].abs().max().item()
        assert err < 1e-4, err
        print(f"dflash_tiny: hand-written forward vs dflash package, max |diff| {err:.2e}")
        reloaded = DFlashDraftModel.from_pretrained(out_dir, dtype=torch.float32).eval()
        assert reloaded.target_layer_ids == TAP_IDS and reloaded.block_size == BS
        assert torch.equal(drafter_forward(reloaded, embed, target_hidden, noise, pos, mask), output)

    save(os.path.join(out_dir, "reference.safetensors"), {
        "target_hidden": target_hidden,
        "tokens": tokens,
        "anchors": anchors,
        "keep": keep,
        "noise_input_ids": noise,
        "position_ids": pos,
        "attention_mask": mask,
        "output": output,
        "logits": logits,
    })
    return drafter


# ----------------------------------------------------------------------------------------
# dflash_loss: independent implementation of the DFlash objective (DFLASH.md step 4)
# ----------------------------------------------------------------------------------------
def dflash_objective(logits, tokens, loss_mask, anchors, keep, a_end, gamma):
    """logits [B,N*Bs,V] at block positions. Returns loss, accuracy, labels, m."""
    B, S = tokens.shape
    N = anchors.shape[1]
    k = torch.arange(BS)
    idx = anchors[:, :, None] + k                                       # [B,N,Bs]
    in_doc = idx < a_end[:, :, None]                                    # implies idx < S
    idx_c = idx.clamp(max=S - 1).view(B, N * BS)
    labels = tokens.gather(1, idx_c).view(B, N, BS)
    lm = loss_mask.gather(1, idx_c).view(B, N, BS).bool()
    m = keep.bool()[:, :, None] & in_doc & (k > 0)[None, None, :] & lm
    m = m.float()
    w = torch.exp(-(k.float() - 1.0) / gamma)[None, None, :]

    lg = logits.view(B, N, BS, -1)
    logp = lg - torch.logsumexp(lg, dim=-1, keepdim=True)
    ce = -logp.gather(-1, labels[..., None])[..., 0]                    # [B,N,Bs]
    loss = (m * w * ce).sum() / ((m * w).sum() + 1e-6)
    hits = (lg.argmax(-1) == labels).float()
    accuracy = (m * hits).sum() / m.sum()
    return loss, accuracy, labels, m


def make_dflash_loss(out_dir: str, target: Qwen3ForCausalLM, drafter: DFlashDraftModel):
    fresh_dir(out_dir)
    B, S = 2, SEQ
    g = torch.Generator().manual_seed(SEED_DFLASH_LOSS_INPUTS)
    tokens = random_tokens(g, B, S)
    doc_lengths = torch.tensor([[48, 0], [20, 28]], dtype=torch.int64)

    # Assistant spans. Row 0: one document with two assistant turns [14,30) and [36,48)
    # (a user turn in between, so the loss_mask term of m matters inside a block).
    # Row 1: second half of each document: doc A [0,20) -> [10,20), doc B [20,48) -> [34,48).
    loss_mask = torch.zeros(B, S, dtype=torch.uint8)
    loss_mask[0, 14:30] = 1
    loss_mask[0, 36:48] = 1
    loss_mask[1, 10:20] = 1
    loss_mask[1, 34:48] = 1

    # Anchors: loss_mask[a] = 1, a <= S - Bs, inside its document, sorted; padding slot last
    # (keep 0, anchor 0). Row 0: block at 25 spans the user turn (30..32 unscored).
    # Row 1: block at 16 runs past doc A's end (20) -> k >= 4 unscored, never doc B labels.
    anchors = torch.tensor([[17, 25, 38, 0], [11, 16, 35, 40]], dtype=torch.int64)
    keep = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.uint8)
    for b in range(B):
        live = anchors[b][keep[b].bool()]
        assert torch.all(live[1:] > live[:-1]) and live.max() <= S - BS
        assert loss_mask[b, live].bool().all()

    embed = target.model.embed_tokens.weight.detach()
    head = target.lm_head.weight.detach()

    def taps_of(tok):  # each document run separately through qwen3_tiny
        th = []
        for b in range(B):
            lens = [n for n in doc_lengths[b].tolist() if n > 0]
            th.append(qwen3_run_docs(target, tok[b:b + 1], lens)[1])
        return torch.cat(th, dim=0)

    # With random tokens a random drafter hits nothing, and accuracy 0 would not test the
    # argmax path. Block j's logits depend only on tokens at positions <= anchor_j, so going
    # through the kept blocks in anchor order we may set the labels at k = 1 and k = 3 to the
    # drafter's own argmax without changing any block already visited.
    for b in range(B):
        for j in range(N_BLOCKS):
            if not keep[b, j]:
                continue
            with torch.no_grad():
                noise, pos, mask, _, a_end = block_layout(tokens, anchors, keep, doc_lengths)
                out = drafter_forward(drafter, embed, taps_of(tokens), noise, pos, mask)
                pred = (out[b, j * BS:(j + 1) * BS] @ head.T).argmax(-1)
            for k in (1, 3):
                p = anchors[b, j].item() + k
                if p < a_end[b, j] and loss_mask[b, p] and pred[k] != MASK_ID:
                    tokens[b, p] = pred[k]

    target_hidden = taps_of(tokens)
    noise, pos, mask, a_start, a_end = block_layout(tokens, anchors, keep, doc_lengths)
    assert torch.all(anchors < a_end)
    drafter.train(False)
    drafter.zero_grad(set_to_none=True)
    for p in drafter.parameters():
        p.requires_grad_(True)
    output = drafter_forward(drafter, embed, target_hidden, noise, pos, mask)
    logits = output @ head.T
    loss, accuracy, labels, m = dflash_objective(logits, tokens, loss_mask, anchors, keep,
                                                 a_end, GAMMA)
    loss.backward()
    grads = {}
    for name, p in drafter.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
        grads["grad." + name] = p.grad.detach().clone()

    # Self-checks: documents are isolated (perturbing doc B of row 1 leaves doc A's blocks
    # unchanged), and the padding block contributes nothing (its inputs don't move the loss).
    with torch.no_grad():
        blocks_a = (anchors[1] < 20).repeat_interleave(BS)
        th2 = target_hidden.clone()
        th2[1, 20:] += 1.0
        tok2 = tokens.clone()
        tok2[1, 20:] = (tok2[1, 20:] + 1) % MASK_ID
        noise2, pos2, mask2, _, _ = block_layout(tok2, anchors, keep, doc_lengths)
        out2 = drafter_forward(drafter, embed, th2, noise2, pos2, mask2)
        assert torch.equal(out2[1][blocks_a], output[1][blocks_a].detach())
        assert not torch.allclose(out2[1][~blocks_a], output[1][~blocks_a].detach())

        anchors3 = anchors.clone()
        anchors3[0, 3] = 5
        noise3, pos3, mask3, _, a_end3 = block_layout(tokens, anchors3, keep, doc_lengths)
        out3 = drafter_forward(drafter, embed, target_hidden, noise3, pos3, mask3)
        loss3, acc3, _, _ = dflash_objective(out3 @ head.T, tokens, loss_mask, anchors3, keep,
                                             a_end3, GAMMA)
        assert torch.allclose(loss3, loss, rtol=0, atol=1e-6) and acc3 == accuracy

        # Row-by-row forward equals the batched one.
        for b in range(B):
            ob = drafter_forward(drafter, embed, target_hidden[b:b + 1], noise[b:b + 1],
                                 pos[b:b + 1], mask[b:b + 1])
            assert torch.allclose(ob, output[b:b + 1].detach(), atol=1e-5)

    tensors = {
        "tokens": tokens,
        "loss_mask": loss_mask,
        "doc_lengths": doc_lengths,
        "target_hidden": target_hidden,
        "anchors": anchors,
        "keep": keep,
        "loss": loss.detach().reshape(()),
        "accuracy": accuracy.detach().reshape(()),
        # extras, for localising a mismatch
        "noise_input_ids": noise,
        "position_ids": pos,
        "attention_mask": mask,
        "labels": labels.reshape(B, N_BLOCKS * BS),
        "label_mask": m.to(torch.uint8).reshape(B, N_BLOCKS * BS),
    }
    tensors.update(grads)
    save(os.path.join(out_dir, "reference.safetensors"), tensors)
    return loss.item(), accuracy.item(), int(m.sum().item())


# ----------------------------------------------------------------------------------------
def summary(out: str) -> None:
    total = 0
    for sub in sorted(os.listdir(out)):
        d = os.path.join(out, sub)
        for fn in sorted(os.listdir(d)):
            path = os.path.join(d, fn)
            size = os.path.getsize(path)
            total += size
            print(f"  {sub}/{fn:24s} {size:>9d} B")
            if fn == "reference.safetensors":
                with safe_open(path, "pt") as f:
                    for k in f.keys():
                        if k.startswith("grad."):
                            continue
                        t = f.get_slice(k)
                        print(f"      {k:22s} {t.get_dtype():5s} {t.get_shape()}")
    print(f"  total {total} B")


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = os.path.abspath(sys.argv[1])
    os.makedirs(out, exist_ok=True)

    torch.manual_seed(0)  # nothing should draw from it; guards against accidental use
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    target = make_qwen3(os.path.join(out, "qwen3_tiny"), tied=False)
    make_qwen3(os.path.join(out, "qwen3_tiny_tied"), tied=True)
    drafter = make_dflash_tiny(os.path.join(out, "dflash_tiny"), target)
    loss, acc, n_scored = make_dflash_loss(os.path.join(out, "dflash_loss"), target, drafter)

    print(f"fixtures in {out} (torch {torch.__version__}, transformers {transformers.__version__}, "
          f"dflash {importlib.metadata.version('dflash')})")
    summary(out)
    print(f"dflash_loss: loss {loss:.6f}  accuracy {acc:.6f}  scored labels {n_scored}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
