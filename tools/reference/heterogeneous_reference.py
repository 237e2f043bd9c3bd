#!/usr/bin/env python3
"""Float64 numpy golden values for Gale's heterogeneous layers (--heterogeneous-layers-config-*),
written from Megatron-Core's heterogeneous layer specs (megatron/core/models/gpt/heterogeneous/) and
the Llama-Nemotron NAS config format, sharing no code with Gale.

A tiny Llama-style model (RMSNorm eps 1e-5, SwiGLU, no biases, untied output layer, no position
embedding) whose five layers cover every sub-block kind:
  0: attention with n_heads_in_group 4 (1 query group) | MLP ffn_hidden_size 12
  1: attention no_op                                     | MLP replace_with_linear
  2: attention replace_with_linear                       | MLP ffn_mult 1.5 (int(2*1.5*8/3) = 8 -> 256)
  3: attention n_heads_in_group 1 (4 groups)             | MLP no_op
  4: attention no_op                                     | MLP no_op
A usual sub-block is x + f(norm(x)); a linear replacement x + norm(x) W^T (W [H, H]); a no_op the
identity (no norm, no residual). linear_qkv rows are Megatron's per-group [q heads | k | v].
Writes tests/data/reference/heterogeneous/golden.json: the block_configs, weights by Megatron name
(float32 values), tokens, labels, loss mask, per-token losses and their masked mean.
Usage: /tmp/venv_hetero/bin/python tools/reference/heterogeneous_reference.py (numpy only; deterministic).
"""
import json
import math
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "heterogeneous",
                   "golden.json")
H, NH, HD, KV, F, V, S, B = 8, 4, 2, 2, 16, 16, 5, 2
EPS = 1e-5
BLOCKS = [
    {"attention": {"n_heads_in_group": 4, "no_op": False, "replace_with_linear": False},
     "ffn": {"ffn_hidden_size": 12, "no_op": False, "replace_with_linear": False}},
    {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
     "ffn": {"ffn_mult": None, "no_op": False, "replace_with_linear": True}},
    {"attention": {"n_heads_in_group": None, "no_op": False, "replace_with_linear": True},
     "ffn": {"ffn_mult": 1.5, "no_op": False, "replace_with_linear": False}},
    {"attention": {"n_heads_in_group": 1, "no_op": False, "replace_with_linear": False},
     "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False}},
    {"attention": {"n_heads_in_group": None, "no_op": True, "replace_with_linear": False},
     "ffn": {"ffn_mult": None, "no_op": True, "replace_with_linear": False}},
]

rng = np.random.default_rng(20261203)
weights = {}


def param(name, shape, std=0.3, ones=False):
    w = (1.0 + 0.1 * rng.standard_normal(shape)) if ones else std * rng.standard_normal(shape)
    w = w.astype(np.float32).astype(np.float64)  # exactly what Gale's f32 holds
    weights[name] = w
    return w


def rms_norm(x, w):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def ffn_of(block):
    f = block["ffn"]
    if f.get("ffn_hidden_size") is not None:
        return f["ffn_hidden_size"]
    if f.get("ffn_mult") is not None:
        n = int(2 * f["ffn_mult"] * H / 3)
        return n if n % 256 == 0 else n + 256 - n % 256
    return F


def groups_of(block):
    n = block["attention"].get("n_heads_in_group")
    return KV if n is None else NH // n


def attention(x, wqkv, wproj, kv):
    """x [S, H] of one sample; causal softmax attention with kv query groups."""
    per = NH // kv
    qkv = x @ wqkv.T  # [S, kv * (per + 2) * HD]
    qkv = qkv.reshape(S, kv, per + 2, HD)
    out = np.zeros((S, NH, HD))
    for g in range(kv):
        k, v = qkv[:, g, per], qkv[:, g, per + 1]
        for j in range(per):
            q = qkv[:, g, j]
            scores = q @ k.T / math.sqrt(HD)
            scores = np.where(np.tril(np.ones((S, S), dtype=bool)), scores, -np.inf)
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            out[:, g * per + j] = p @ v
    return out.reshape(S, NH * HD) @ wproj.T


def main():
    emb = param("embedding.word_embeddings.weight", (V, H))
    layers = []
    for i, block in enumerate(BLOCKS):
        p = f"decoder.layers.{i}."
        L = {}
        a, f = block["attention"], block["ffn"]
        if not a["no_op"]:
            L["norm1"] = param(p + "input_layernorm.weight", (H,), ones=True)
            if a["replace_with_linear"]:
                L["attn_linear"] = param(p + "self_attention.weight", (H, H))
            else:
                kv = groups_of(block)
                L["kv"] = kv
                L["qkv"] = param(p + "self_attention.linear_qkv.weight", ((NH + 2 * kv) * HD, H))
                L["proj"] = param(p + "self_attention.linear_proj.weight", (H, NH * HD))
        if not f["no_op"]:
            L["norm2"] = param(p + "pre_mlp_layernorm.weight", (H,), ones=True)
            if f["replace_with_linear"]:
                L["mlp_linear"] = param(p + "mlp.weight", (H, H))
            else:
                ff = ffn_of(block)
                L["fc1"] = param(p + "mlp.linear_fc1.weight", (2 * ff, H))
                L["fc2"] = param(p + "mlp.linear_fc2.weight", (H, ff))
        layers.append(L)
    final_w = param("decoder.final_layernorm.weight", (H,), ones=True)
    out_w = param("output_layer.weight", (V, H))

    tokens = rng.integers(0, V, size=(B, S))
    labels = rng.integers(0, V, size=(B, S))
    loss_mask = np.ones((B, S))
    loss_mask[1, 2] = 0.0
    losses = np.zeros((B, S))
    for b in range(B):
        x = emb[tokens[b]]
        for i, block in enumerate(BLOCKS):
            L = layers[i]
            if "norm1" in L:
                n = rms_norm(x, L["norm1"])
                x = x + (n @ L["attn_linear"].T if "attn_linear" in L else attention(n, L["qkv"], L["proj"], L["kv"]))
            if "norm2" in L:
                n = rms_norm(x, L["norm2"])
                if "mlp_linear" in L:
                    x = x + n @ L["mlp_linear"].T
                else:
                    u = n @ L["fc1"].T
                    ff = u.shape[1] // 2
                    x = x + (silu(u[:, :ff]) * u[:, ff:]) @ L["fc2"].T
        logits = rms_norm(x, final_w) @ out_w.T
        m = logits.max(axis=1, keepdims=True)
        lse = (m + np.log(np.exp(logits - m).sum(axis=1, keepdims=True)))[:, 0]
        losses[b] = lse - logits[np.arange(S), labels[b]]
    mean = float((losses * loss_mask).sum() / loss_mask.sum())
    fixture = {
        "config": {"hidden_size": H, "num_attention_heads": NH, "kv_channels": H // NH, "num_query_groups": KV,
                   "ffn_hidden_size": F, "vocab_size": V, "seq_length": S, "micro_batch_size": B,
                   "num_hidden_layers": len(BLOCKS), "norm_epsilon": EPS},
        "heterogeneous_config": {"num_hidden_layers": len(BLOCKS), "hidden_size": H, "num_attention_heads": NH,
                                 "hidden_act": "silu", "block_configs": BLOCKS},
        "ffn_sizes": [ffn_of(b) if not b["ffn"]["no_op"] and not b["ffn"]["replace_with_linear"] else 0
                      for b in BLOCKS],
        "weights": {k: [float(v) for v in w.reshape(-1)] for k, w in weights.items()},
        "tokens": tokens.tolist(),
        "labels": labels.tolist(),
        "loss_mask": loss_mask.tolist(),
        "token_losses": losses.tolist(),
        "loss": mean,
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: loss {mean:.12f}, {sum(w.size for w in weights.values())} weights")


if __name__ == "__main__":
    main()
