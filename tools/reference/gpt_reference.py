#!/usr/bin/env python3
"""Independent float64 PyTorch reference of docs/model.md: writes the golden fixtures Gale is tested against.

Everything here is written from docs/model.md (the model, loss, optimizer and LR schedule Gale
implements, with Megatron-Core GPTModel semantics) and megatron.md §4-§5 (log line quantities),
in plain PyTorch float64 with autograd, so it shares no code with Gale. For each configuration it
records, under tests/data/golden/<config>/:

  weights.safetensors  initial parameters by their Megatron names (stored as BF16: the draws are
                       rounded to bfloat16 so that f32 Gale and this f64 reference start from
                       exactly the same values, in half the space)
  inputs.safetensors   tokens, labels, loss_mask, position_ids (and document_ids with document
                       masks), each [iterations, micro-batches, B, S]
  forward.safetensors  logits [B, S, V] and per-token losses [B, S] of one forward pass
                       (iteration 0, micro-batch 0)
  grads.safetensors    the gradient of that micro-batch's loss for every parameter (f32)
  fixture.json         the configuration, the forward loss, the 10-step training series (logged
                       loss, learning rate, pre-clip grad norm), per-parameter summaries of the
                       final parameters (and of the gradients where the full tensors are not kept),
                       and the finite-difference check of this reference's own gradients

Variants reuse the weights (and, where the data is the same, the inputs) of their base config.

Usage (Debian's python3-torch and python3-numpy; `safetensors` from PyPI, see README.md):
    /tmp/gale-ref-venv/bin/python tools/reference/gpt_reference.py [--out tests/data/golden] [--only gpt,llama]
The run is deterministic: rerunning it reproduces the committed files bit for bit.
"""
import argparse
import json
import math
import os
import re
import sys

import numpy as np
import torch
import safetensors
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import muon_reference as muon_ref  # noqa: E402  (the Newton-Schulz orthogonalisation and Muon's scales)
import mup_reference as mup  # noqa: E402  (Megatron's MuP formulas: --use-mup configurations)

torch.set_default_dtype(torch.float64)
torch.use_deterministic_algorithms(True)

# ---------------------------------------------------------------------------------------------
# Configurations
# ---------------------------------------------------------------------------------------------

COMMON_MODEL = dict(
    num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=16, max_position_embeddings=32,
    tokenizer_vocab_size=96, make_vocab_size_divisible_by=128, norm_epsilon=1e-5, init_method_std=0.02,
    rotary_base=10000, rotary_percent=1.0, reset_attention_mask=False, reset_position_ids=False,
    attention_dropout=0.0, hidden_dropout=0.0,
)
GPT_MODEL = dict(COMMON_MODEL, num_query_groups=4, group_query_attention=False, kv_channels=16, ffn_hidden_size=128,
                 position_embedding_type="learned_absolute", normalization="LayerNorm", swiglu=False,
                 add_bias_linear=True, untie_embeddings_and_output_weights=False)
LLAMA_MODEL = dict(COMMON_MODEL, num_query_groups=2, group_query_attention=True, kv_channels=16, ffn_hidden_size=96,
                   position_embedding_type="rope", normalization="RMSNorm", swiglu=True,
                   add_bias_linear=False, untie_embeddings_and_output_weights=True)
ADAMW = dict(optimizer="adam", lr=1e-3, min_lr=1e-4, lr_warmup_iters=2, lr_decay_iters=10, lr_decay_style="cosine",
             lr_warmup_init=0.0, adam_beta1=0.9, adam_beta2=0.95, adam_eps=1e-8, weight_decay=0.1, clip_grad=1.0,
             micro_batch_size=2, global_batch_size=4, train_iters=10)
# Mixtral-style MoE on the LLaMA architecture: every MLP is 4 SwiGLU experts with top-2 routing.
MIXTRAL_MODEL = dict(LLAMA_MODEL, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=48, moe_aux_loss_coeff=0.1,
                     moe_z_loss_coeff=0.01)
SGD = dict(ADAMW, optimizer="sgd", lr=0.05, min_lr=0.005, sgd_momentum=0.9, clip_grad=1.5)  # some steps clip, some not
# Muon (muon_reference.py) for the 2-D weights except the word embedding and the output layer, AdamW
# (ADAMW's settings) for the rest; the Newton-Schulz iteration in f32 ("high": this float64 run
# cannot follow "medium"'s bf16 rounding).
MUON = dict(ADAMW, optimizer="muon", lr=2e-3, muon_momentum=0.9, muon_nesterov=False, muon_split_qkv=True,
            muon_scale_mode="spectral", muon_fp32_matmul_prec="high", muon_coefficient_type="quintic",
            muon_num_ns_steps=5, muon_extra_scale_factor=1.0)

# MuP's hidden Adam rate is lr/m: the µP Adam run takes a larger base rate so that the loss falls within 10 steps.
MUP_ADAMW = dict(ADAMW, lr=1e-2, min_lr=1e-3)

CONFIGS = {
    # name: model, training, seeds, which files it owns, what it shares
    "gpt": dict(model=GPT_MODEL, train=ADAMW, weight_seed=1234, data_seed=1, data="plain", mask_zeros=False,
                full_grads=True),
    "llama": dict(model=LLAMA_MODEL, train=ADAMW, weight_seed=4321, data_seed=2, data="plain", mask_zeros=True,
                  full_grads=True),
    "llama_rope50": dict(model=dict(LLAMA_MODEL, rotary_percent=0.5), train=ADAMW, weights_from="llama",
                         inputs_from="llama", full_grads=False),
    "gpt_docmask": dict(model=dict(GPT_MODEL, reset_attention_mask=True, reset_position_ids=True), train=ADAMW,
                        weights_from="gpt", data_seed=3, data="documents", mask_zeros=False, full_grads=False),
    "gpt_sgd": dict(model=GPT_MODEL, train=SGD, weights_from="gpt", inputs_from="gpt", full_grads=False,
                    forward=False),
    "gpt_muon": dict(model=GPT_MODEL, train=MUON, weights_from="gpt", inputs_from="gpt", full_grads=False,
                     forward=False),
    "llama_muon": dict(model=LLAMA_MODEL, train=dict(MUON, muon_nesterov=True, muon_scale_mode="unit_rms_norm",
                                                     muon_extra_scale_factor=0.5),
                       weights_from="llama", inputs_from="llama", full_grads=False, forward=False),
    "mixtral": dict(model=MIXTRAL_MODEL, train=ADAMW, weight_seed=777, data_seed=4, data="plain", mask_zeros=True,
                    full_grads=True),
    # ALiBi (MindSpeed's --position-embedding-type alibi) on the LLaMA weights (no position table
    # either way), plain and with document masks (the documents data of gpt_docmask).
    "llama_alibi": dict(model=dict(LLAMA_MODEL, position_embedding_type="alibi"), train=ADAMW, weights_from="llama",
                        inputs_from="llama", full_grads=False),
    # Megatron-Core's --attention-output-gate (Qwen3-Next's gated attention) on the LLaMA model: its
    # own weights (linear_qkv has NH·HD more rows), the llama inputs.
    "llama_gate": dict(model=dict(LLAMA_MODEL, attention_output_gate=True), train=ADAMW, weight_seed=2468,
                       inputs_from="llama", full_grads=True),
    # Megatron-Core's --softmax-type learnable (attention sinks, gpt-oss) on the LLaMA model: one
    # learned logit per head and layer (core_attention.softmax_offset) joins every softmax row; its
    # own weights (the logits drawn O(1) so that they matter), the llama inputs.
    "llama_sink": dict(model=dict(LLAMA_MODEL, softmax_type="learnable"), train=ADAMW, weight_seed=1357,
                       inputs_from="llama", full_grads=True),
    # Megatron-Core's --use-mup (µP, mup_reference.py has the formulas): width multiplier 64/16 = 4,
    # embedding multiplier 2.5, softmax scale √4/16 = 1/8, output multiplier 1/4 (the default 1.0
    # resolved), Adam's hidden lr and eps /4; its own µP-initialised weights and data. The SGD
    # variant (vector-like parameters' lr ×4) shares them, with an explicit output multiplier 2; the
    # LLaMA one has m = 2, output multiplier 0.75 and attention power 0.75 (softmax scale
    # 1/16^0.75), an untied output layer.
    "gpt_mup": dict(model=dict(GPT_MODEL, use_mup=True, mup_base_hidden_size=16, mup_embedding_mult=2.5,
                               mup_base_head_dim=4.0),
                    train=MUP_ADAMW, weight_seed=9090, data_seed=6, data="plain", mask_zeros=False, full_grads=True),
    "gpt_mup_sgd": dict(model=dict(GPT_MODEL, use_mup=True, mup_base_hidden_size=16, mup_embedding_mult=2.5,
                                   mup_base_head_dim=4.0, mup_output_mult=2.0),
                        train=SGD, weights_from="gpt_mup", inputs_from="gpt_mup", full_grads=False, forward=False),
    "llama_mup": dict(model=dict(LLAMA_MODEL, use_mup=True, mup_base_hidden_size=32, mup_output_mult=0.75,
                                 mup_attn_scale_power=0.75),
                      train=ADAMW, weight_seed=8080, data_seed=7, data="plain", mask_zeros=True, full_grads=False),
    "llama_alibi_docmask": dict(model=dict(LLAMA_MODEL, position_embedding_type="alibi", reset_attention_mask=True,
                                           reset_position_ids=True),
                                train=ADAMW, weights_from="llama", inputs_from="gpt_docmask", data="documents",
                                full_grads=False),
}
EOD = 95  # the document separator of the "documents" data (the last tokenizer id)


def padded_vocab(m):
    d = m["make_vocab_size_divisible_by"]
    return (m["tokenizer_vocab_size"] + d - 1) // d * d


def mup_lr_mult(name, tensor, m, t):
    """MuP's max_lr/min_lr multiplier of one parameter (mup_reference.py; 1 without --use-mup)."""
    return mup.lr_mult(name, tensor.dim(), m, t["optimizer"])


def mup_eps_mult(name, tensor, m, t):
    """MuP's Adam eps multiplier of one parameter (mup_reference.py)."""
    return mup.eps_mult(name, tensor.dim(), m, t["optimizer"])


def megatron_args(m, t):
    """The pretrain flags describing the same model and run (the vocabulary comes from the tokenizer)."""
    a = ["--num-layers", m["num_layers"], "--hidden-size", m["hidden_size"], "--num-attention-heads",
         m["num_attention_heads"], "--seq-length", m["seq_length"], "--max-position-embeddings",
         m["max_position_embeddings"], "--ffn-hidden-size", m["ffn_hidden_size"], "--kv-channels", m["kv_channels"],
         "--normalization", m["normalization"], "--norm-epsilon", m["norm_epsilon"],
         "--position-embedding-type", m["position_embedding_type"], "--init-method-std", m["init_method_std"],
         "--make-vocab-size-divisible-by", m["make_vocab_size_divisible_by"],
         "--attention-dropout", 0.0, "--hidden-dropout", 0.0]
    if m["group_query_attention"]:
        a += ["--group-query-attention", "--num-query-groups", m["num_query_groups"]]
    if m["position_embedding_type"] == "rope":
        a += ["--rotary-base", m["rotary_base"], "--rotary-percent", m["rotary_percent"]]
    if m["swiglu"]:
        a += ["--swiglu"]
    if not m["add_bias_linear"]:
        a += ["--disable-bias-linear"]
    if m["untie_embeddings_and_output_weights"]:
        a += ["--untie-embeddings-and-output-weights"]
    if m.get("attention_output_gate"):
        a += ["--attention-output-gate"]
    if m.get("softmax_type", "vanilla") != "vanilla":
        a += ["--softmax-type", m["softmax_type"]]
    if m["reset_attention_mask"]:
        a += ["--reset-attention-mask"]
    if m["reset_position_ids"]:
        a += ["--reset-position-ids"]
    if m.get("use_mup"):
        a += ["--use-mup"]
        for key in ("mup_base_hidden_size", "mup_embedding_mult", "mup_output_mult", "mup_base_head_dim",
                    "mup_attn_scale_power"):
            if key in m:
                a += ["--" + key.replace("_", "-"), m[key]]
    if m.get("num_experts"):
        a += ["--num-experts", m["num_experts"], "--moe-router-topk", m["moe_router_topk"],
              "--moe-ffn-hidden-size", m["moe_ffn_hidden_size"], "--moe-aux-loss-coeff", m["moe_aux_loss_coeff"],
              "--moe-z-loss-coeff", m["moe_z_loss_coeff"]]
    a += ["--micro-batch-size", t["micro_batch_size"], "--global-batch-size", t["global_batch_size"],
          "--train-iters", t["train_iters"], "--optimizer", t["optimizer"], "--lr", t["lr"], "--min-lr", t["min_lr"],
          "--lr-warmup-iters", t["lr_warmup_iters"], "--lr-decay-iters", t["lr_decay_iters"],
          "--lr-decay-style", t["lr_decay_style"], "--weight-decay", t["weight_decay"], "--clip-grad", t["clip_grad"]]
    if t["optimizer"] in ("adam", "muon"):
        a += ["--adam-beta1", t["adam_beta1"], "--adam-beta2", t["adam_beta2"], "--adam-eps", t["adam_eps"]]
    else:
        a += ["--sgd-momentum", t["sgd_momentum"]]
    if t["optimizer"] == "muon":
        a += ["--muon-momentum", t["muon_momentum"], "--muon-scale-mode", t["muon_scale_mode"],
              "--muon-fp32-matmul-prec", t["muon_fp32_matmul_prec"], "--muon-coefficient-type",
              t["muon_coefficient_type"], "--muon-num-ns-steps", t["muon_num_ns_steps"],
              "--muon-extra-scale-factor", t["muon_extra_scale_factor"]]
        if t["muon_nesterov"]:
            a += ["--muon-nesterov"]
        if not t["muon_split_qkv"]:
            a += ["--muon-no-split-qkv"]
    return [str(x) for x in a]


# ---------------------------------------------------------------------------------------------
# Parameters (names, shapes and order of docs/model.md) and their initial values
# ---------------------------------------------------------------------------------------------

def parameter_specs(m):
    """[(name, shape, kind)] in the order of the table in docs/model.md."""
    H, L, V, F = m["hidden_size"], m["num_layers"], padded_vocab(m), m["ffn_hidden_size"]
    NH, KV, HD = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"]
    ln = m["normalization"] == "LayerNorm"
    bias = m["add_bias_linear"]
    specs = [("embedding.word_embeddings.weight", (V, H), "weight")]
    if m["position_embedding_type"] == "learned_absolute":
        specs.append(("embedding.position_embeddings.weight", (m["max_position_embeddings"], H), "weight"))
    for i in range(L):
        p = f"decoder.layers.{i}."
        specs.append((p + "input_layernorm.weight", (H,), "norm_weight"))
        if ln:
            specs.append((p + "input_layernorm.bias", (H,), "bias"))
        qkv_rows = ((2 if m.get("attention_output_gate") else 1) * NH + 2 * KV) * HD  # + each head's gate
        specs.append((p + "self_attention.linear_qkv.weight", (qkv_rows, H), "weight"))
        if bias:
            specs.append((p + "self_attention.linear_qkv.bias", (qkv_rows,), "bias"))
        if m.get("softmax_type") == "learnable":  # one sink logit per head
            specs.append((p + "self_attention.core_attention.softmax_offset", (NH,), "sink"))
        specs.append((p + "self_attention.linear_proj.weight", (H, NH * HD), "output_weight"))
        if bias:
            specs.append((p + "self_attention.linear_proj.bias", (H,), "bias"))
        specs.append((p + "pre_mlp_layernorm.weight", (H,), "norm_weight"))
        if ln:
            specs.append((p + "pre_mlp_layernorm.bias", (H,), "bias"))
        if m.get("num_experts"):  # router [E, H], then each expert's MLP (Megatron-Core names)
            E, Fe = m["num_experts"], m["moe_ffn_hidden_size"]
            specs.append((p + "mlp.router.weight", (E, H), "weight"))
            mlps = [(p + f"mlp.experts.local_experts.{e}.", Fe) for e in range(E)]
        else:
            mlps = [(p + "mlp.", F)]
        for q, f in mlps:
            specs.append((q + "linear_fc1.weight", ((2 * f if m["swiglu"] else f), H), "weight"))
            if bias:
                specs.append((q + "linear_fc1.bias", ((2 * f if m["swiglu"] else f),), "bias"))
            specs.append((q + "linear_fc2.weight", (H, f), "output_weight"))
            if bias:
                specs.append((q + "linear_fc2.bias", (H,), "bias"))
    specs.append(("decoder.final_layernorm.weight", (H,), "norm_weight"))
    if ln:
        specs.append(("decoder.final_layernorm.bias", (H,), "bias"))
    if m["untie_embeddings_and_output_weights"]:
        specs.append(("output_layer.weight", (V, H), "weight"))
    return specs


def round_to_bf16(a):
    """float64 array -> the nearest bfloat16 values (round to nearest even), as float64."""
    return torch.from_numpy(a).to(torch.float32).to(torch.bfloat16).to(torch.float64)


def initial_weights(m, seed):
    """Megatron's init (normal(0, std); std/sqrt(2L) for linear_proj/linear_fc2), drawn with numpy.

    Biases and norm parameters are deliberately *not* Megatron's 0 and 1: small random values make
    the forward pass exercise them (a bias added twice or a norm weight ignored would otherwise go
    unnoticed). All values are rounded to bfloat16."""
    rng = np.random.RandomState(seed)
    std = m["init_method_std"]
    # --use-mup: hidden weights sigma/sqrt(m), output projections sigma/sqrt(2L)/sqrt(m), the embeddings
    # and an untied output layer sigma (Megatron's embedding init method).
    hidden_std = std / math.sqrt(mup.width_mult(m))
    out = {}
    for name, shape, kind in parameter_specs(m):
        if kind == "weight" and (name.startswith("embedding.") or name == "output_layer.weight"):
            a = rng.normal(0.0, std, size=shape)
        elif kind == "weight":
            a = rng.normal(0.0, hidden_std, size=shape)
        elif kind == "output_weight":
            a = rng.normal(0.0, hidden_std / math.sqrt(2.0 * m["num_layers"]), size=shape)
        elif kind == "norm_weight":
            a = 1.0 + rng.normal(0.0, 0.1, size=shape)
        elif kind == "sink":  # attention sink logits: O(1), so a sink takes a real share of each row
            a = rng.normal(0.0, 1.0, size=shape)
        else:
            a = rng.normal(0.0, 0.02, size=shape)
        out[name] = round_to_bf16(a)
    return out


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------

def make_inputs(cfg):
    """Token batches [iters, micro-batches, B, S+1] split into tokens/labels, with masks and positions.

    Sequences follow a random "successor" table (token t is followed by succ[t] 75% of the time), so
    the loss falls measurably within 10 steps."""
    m, t = cfg["model"], cfg["train"]
    rng = np.random.RandomState(cfg["data_seed"])
    iters, mbs, B, S = t["train_iters"], t["global_batch_size"] // t["micro_batch_size"], t["micro_batch_size"], m["seq_length"]
    vocab = m["tokenizer_vocab_size"]
    content = vocab - 1 if cfg["data"] == "documents" else vocab  # keep EOD out of the plain draws
    succ = rng.permutation(content)
    seq = np.zeros((iters, mbs, B, S + 1), dtype=np.int64)
    for idx in np.ndindex(iters, mbs, B):
        tok = rng.randint(content)
        for s in range(S + 1):
            seq[idx + (s,)] = tok
            tok = succ[tok] if rng.rand() < 0.75 else rng.randint(content)
    if cfg["data"] == "documents":  # 1-3 document ends per sample at random places
        for idx in np.ndindex(iters, mbs, B):
            for pos in rng.choice(np.arange(1, S), size=rng.randint(1, 4), replace=False):
                seq[idx + (pos,)] = EOD
    tokens, labels = seq[..., :-1], seq[..., 1:]
    loss_mask = np.ones(tokens.shape, dtype=np.float32)
    if cfg.get("mask_zeros"):
        loss_mask[rng.rand(*tokens.shape) < 0.25] = 0.0
        loss_mask[..., 0] = 1.0  # every micro-batch keeps some loss tokens
    # Megatron's get_ltor_masks_and_position_ids: a token after an EOD starts a new document.
    document_ids = np.zeros(tokens.shape, dtype=np.int64)
    position_ids = np.broadcast_to(np.arange(S, dtype=np.int64), tokens.shape).copy()
    if m["reset_attention_mask"] or m["reset_position_ids"]:
        for idx in np.ndindex(*tokens.shape[:-1]):
            doc, start = 0, 0
            for s in range(S):
                document_ids[idx + (s,)] = doc
                if m["reset_position_ids"]:
                    position_ids[idx + (s,)] = s - start
                if tokens[idx + (s,)] == EOD:
                    doc, start = doc + 1, s + 1
    out = {"tokens": tokens, "labels": labels, "loss_mask": loss_mask, "position_ids": position_ids}
    if m["reset_attention_mask"]:
        out["document_ids"] = document_ids
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# The model (docs/model.md "Forward"), computed in [B, S, H] order (the math is layout-free)
# ---------------------------------------------------------------------------------------------

def norm(x, p, prefix, m):
    w = p[prefix + ".weight"]
    eps = m["norm_epsilon"]
    if m["normalization"] == "LayerNorm":
        mean = x.mean(-1, keepdim=True)
        var = ((x - mean) ** 2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + eps) * w + p[prefix + ".bias"]
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def linear(x, p, prefix):
    y = x @ p[prefix + ".weight"].T
    b = p.get(prefix + ".bias")
    return y if b is None else y + b


def rope(x, position_ids, m):
    """Megatron's non-interleaved rotate-half RoPE on the first R = HD*rotary_percent dims. x: [B, S, heads, HD]."""
    HD = x.shape[-1]
    R = int(HD * m["rotary_percent"])
    inv_freq = torch.tensor([m["rotary_base"] ** (-2.0 * i / R) for i in range(R // 2)])
    theta = position_ids.to(torch.float64)[..., None] * inv_freq  # [B, S, R/2]
    cos = torch.cat([theta.cos(), theta.cos()], -1)[:, :, None, :]
    sin = torch.cat([theta.sin(), theta.sin()], -1)[:, :, None, :]
    xr, rest = x[..., :R], x[..., R:]
    x1, x2 = xr[..., : R // 2], xr[..., R // 2:]
    rotated = torch.cat([-x2, x1], -1)
    return torch.cat([xr * cos + rotated * sin, rest], -1)


def mlp(h, p, prefix, m, f):
    u = linear(h, p, prefix + "linear_fc1")
    g = torch.nn.functional.silu(u[..., :f]) * u[..., f:] if m["swiglu"] else 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))
    return linear(g, p, prefix + "linear_fc2")


def moe(h, p, prefix, m, aux):
    """Megatron-Core's MoE MLP written densely: every expert runs on every token and a [tokens, E]
    gate matrix keeps the top-k. Megatron's default router takes the top-k of the logits and a
    softmax over those k. Appends (load-balancing loss, z-loss) without coefficients to `aux`:
    E/(T^2 k) * sum_e (sum_t softmax(l)_te) * n_e, and mean_t logsumexp(l_t)^2."""
    E, k, Fe = m["num_experts"], m["moe_router_topk"], m["moe_ffn_hidden_size"]
    x = h.reshape(-1, h.shape[-1])
    T = x.shape[0]
    logits = x @ p[prefix + "router.weight"].T  # [T, E]
    top_logits, top_experts = torch.topk(logits, k, dim=-1)
    ordered = torch.sort(logits.detach(), dim=-1, descending=True).values
    if E > k:  # the routing must not depend on rounding: float32 Gale must make the same choice
        aux.setdefault("min_topk_margin", []).append(float((ordered[:, k - 1] - ordered[:, k]).min()))
    gates = torch.zeros(T, E).scatter(1, top_experts, torch.softmax(top_logits, dim=-1))
    y = sum(gates[:, e:e + 1] * mlp(x, p, prefix + f"experts.local_experts.{e}.", m, Fe) for e in range(E))
    routed = torch.zeros(T, E).scatter(1, top_experts, 1.0).sum(0)  # n_e
    scores = torch.softmax(logits, dim=-1)
    aux.setdefault("load_balancing", []).append(E / (T * T * k) * (scores.sum(0) * routed).sum())
    aux.setdefault("z", []).append((torch.logsumexp(logits, dim=-1) ** 2).mean())
    return y.reshape(h.shape)


def moe_objective(m, aux):
    """coeff * sum of the layers' load-balancing losses + z_coeff * their z-losses (0 without MoE)."""
    if not m.get("num_experts"):
        return 0.0
    return m["moe_aux_loss_coeff"] * sum(aux["load_balancing"]) + m["moe_z_loss_coeff"] * sum(aux["z"])


def alibi_slopes(n):
    """Press et al.'s ALiBi slopes (as MindSpeed's get_slopes): 2^(-8i/p) for the largest power of two
    p <= n, then every other slope of 2p heads for the remaining n - p."""
    p = 2 ** int(math.floor(math.log2(n)))
    slopes = [2.0 ** (-8.0 * (i + 1) / p) for i in range(p)]
    return slopes + [2.0 ** (-8.0 * (i + 1) / (2 * p)) for i in range(0, 2 * (n - p), 2)]


def forward(p, m, tokens, position_ids, document_ids=None, aux=None):
    """tokens, position_ids: [B, S] -> logits [B, S, V]. MoE layers append their auxiliary losses to aux."""
    aux = {} if aux is None else aux
    B, S = tokens.shape
    H, NH, KV, HD, F = m["hidden_size"], m["num_attention_heads"], m["num_query_groups"], m["kv_channels"], m["ffn_hidden_size"]
    per_group = NH // KV
    x = p["embedding.word_embeddings.weight"][tokens]
    if m["position_embedding_type"] == "learned_absolute":
        x = x + p["embedding.position_embeddings.weight"][position_ids]
    if m.get("use_mup"):
        x = x * m.get("mup_embedding_mult", 1.0)
    allowed = torch.tril(torch.ones(S, S, dtype=torch.bool))[None]  # [1, q, k]
    if m["reset_attention_mask"]:
        allowed = allowed & (document_ids[:, :, None] == document_ids[:, None, :])
    for i in range(m["num_layers"]):
        pre = f"decoder.layers.{i}."
        a = norm(x, p, pre + "input_layernorm", m)
        # Per query group: its query heads, (with the output gate) their gates, one key, one value head.
        gated = bool(m.get("attention_output_gate"))
        g = per_group if gated else 0
        qkv = linear(a, p, pre + "self_attention.linear_qkv").view(B, S, KV, per_group + g + 2, HD)
        q = qkv[:, :, :, :per_group, :].reshape(B, S, NH, HD)
        gate = qkv[:, :, :, per_group:per_group + g, :].reshape(B, S, NH * HD) if gated else None
        k = qkv[:, :, :, per_group + g, :]
        v = qkv[:, :, :, per_group + g + 1, :]
        if m["position_embedding_type"] == "rope":
            q, k = rope(q, position_ids, m), rope(k, position_ids, m)
        k = k.repeat_interleave(per_group, dim=2)  # query head h reads kv head h // per_group
        v = v.repeat_interleave(per_group, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * mup.softmax_scale(m)
        if m["position_embedding_type"] == "alibi":  # + m_h (j - i): index in the sequence, not position_ids
            idx = torch.arange(S, dtype=torch.float64)
            scores = scores + torch.tensor(alibi_slopes(NH))[:, None, None] * (idx[None, :] - idx[:, None])
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        if m.get("softmax_type", "vanilla") == "vanilla":
            probs = torch.softmax(scores, -1)
        else:  # the sink logit (0 for off-by-one) as one more key column, dropped after the softmax
            sink = (p[pre + "self_attention.core_attention.softmax_offset"] if m["softmax_type"] == "learnable"
                    else torch.zeros(NH))
            col = sink[None, :, None, None].expand(B, NH, S, 1)
            probs = torch.softmax(torch.cat([scores, col], -1), -1)[..., :-1]
        ctx = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(B, S, NH * HD)
        if gated:  # Megatron's _apply_output_gate: ctx * sigmoid(gate), elementwise per head channel
            ctx = ctx * torch.sigmoid(gate)
        x = x + linear(ctx, p, pre + "self_attention.linear_proj")
        h = norm(x, p, pre + "pre_mlp_layernorm", m)
        x = x + (moe(h, p, pre + "mlp.", m, aux) if m.get("num_experts") else mlp(h, p, pre + "mlp.", m, F))
    x = norm(x, p, "decoder.final_layernorm", m)
    out = p["output_layer.weight"] if m["untie_embeddings_and_output_weights"] else p["embedding.word_embeddings.weight"]
    return (x @ out.T) * mup.output_mult(m)


def token_losses(logits, labels):
    """Per-token cross entropy: logsumexp(logits) - logits[label]."""
    return torch.logsumexp(logits, -1) - logits.gather(-1, labels[..., None])[..., 0]


def micro_batch(inputs, it, mb):
    return {k: v[it, mb] for k, v in inputs.items()}


def micro_batch_loss(p, m, batch, aux=None):
    """(loss_mb = sum(l*mask)/sum(mask), per-token l, logits); MoE auxiliary losses go to aux."""
    logits = forward(p, m, batch["tokens"], batch["position_ids"], batch.get("document_ids"), aux)
    losses = token_losses(logits, batch["labels"])
    mask = batch["loss_mask"].to(torch.float64)
    return (losses * mask).sum() / mask.sum(), losses, logits


def micro_batch_objective(p, m, batch, aux=None):
    """What backward differentiates for one micro-batch (before the 1/num_microbatches scale):
    loss_mb plus the MoE auxiliary losses with their coefficients (Megatron adds their gradients,
    scaled like the loss, without adding them to the reported lm loss)."""
    aux = {} if aux is None else aux
    loss, losses, logits = micro_batch_loss(p, m, batch, aux)
    return loss + moe_objective(m, aux), loss, losses, logits


# ---------------------------------------------------------------------------------------------
# Optimizer and schedule (docs/model.md "Optimizer"; megatron.md §4.4)
# ---------------------------------------------------------------------------------------------

def learning_rate(t, num_steps, mult=1.0):
    """OptimizerParamScheduler.get_lr for a step count in samples; `mult` scales the param group's
    max_lr and min_lr (MuP's overrides), not the warmup's init_lr."""
    gbs = t["global_batch_size"]
    warmup, decay = t["lr_warmup_iters"] * gbs, t["lr_decay_iters"] * gbs
    max_lr, min_lr, init = t["lr"] * mult, t["min_lr"] * mult, t["lr_warmup_init"]
    if warmup > 0 and num_steps <= warmup:
        return init + (max_lr - init) * num_steps / warmup
    if t["lr_decay_style"] == "constant":
        return max_lr
    if num_steps > decay:
        return min_lr
    ratio = (num_steps - warmup) / (decay - warmup)
    if t["lr_decay_style"] == "linear":
        coeff = 1.0 - ratio
    elif t["lr_decay_style"] == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        raise ValueError(t["lr_decay_style"])
    return min_lr + coeff * (max_lr - min_lr)


def decays(name, tensor):
    """Megatron: no weight decay on biases and on 1-D parameters."""
    return not name.endswith(".bias") and tensor.dim() > 1


def uses_muon(name, tensor, t):
    """Megatron's Muon parameters: 2-D, not the word embedding nor the output layer."""
    return (t["optimizer"] == "muon" and tensor.dim() == 2 and name != "embedding.word_embeddings.weight"
            and name != "output_layer.weight")


def muon_settings(name, m, t):
    """muon_reference.py's configuration of one parameter (the QKV split for linear_qkv)."""
    split = None
    if t["muon_split_qkv"] and name.endswith("linear_qkv.weight"):
        kv = m["kv_channels"]
        split = [m["num_attention_heads"] // m["num_query_groups"] * kv, kv, kv]
    return dict(qkv_split=split, steps=t["muon_num_ns_steps"], kind=t["muon_coefficient_type"],
                scale_mode=t["muon_scale_mode"], extra_scale_factor=t["muon_extra_scale_factor"], bf16=False)


def train(p0, cfg, inputs):
    """The 10-iteration run: gradient accumulation, clipping, AdamW/SGD, Megatron's LR schedule."""
    m, t = cfg["model"], cfg["train"]
    p = {k: v.clone().requires_grad_(True) for k, v in p0.items()}
    state = {k: {"m": torch.zeros_like(v), "v": torch.zeros_like(v), "buf": None} for k, v in p.items()}
    mbs = t["global_batch_size"] // t["micro_batch_size"]
    series = {"loss": [], "lr": [], "grad_norm": [], "lr_used": [], "loss_differentiated": []}
    if m.get("num_experts"):
        series.update({"load_balancing_loss": [], "z_loss": [], "min_topk_margin": []})
    for it in range(t["train_iters"]):
        for v in p.values():
            v.grad = None
        loss_sum, mask_sum, diff_loss = 0.0, 0.0, 0.0
        aux = {}
        for mb in range(mbs):
            batch = micro_batch(inputs, it, mb)
            mb_aux = {}
            objective, loss_mb, losses, _ = micro_batch_objective(p, m, batch, mb_aux)
            (objective / mbs).backward()
            for key, values in mb_aux.items():
                aux.setdefault(key, []).extend(float(v) for v in values)
            mask = batch["loss_mask"].to(torch.float64)
            loss_sum += float((losses.detach() * mask).sum())
            mask_sum += float(mask.sum())
            diff_loss += float(loss_mb) / mbs
        grad_norm = math.sqrt(sum(float((v.grad ** 2).sum()) for v in p.values()))
        clip = t["clip_grad"] / (grad_norm + 1e-6)
        scale = clip if (t["clip_grad"] > 0 and clip < 1.0) else 1.0
        step = it + 1
        lr_base = learning_rate(t, (step - 1) * t["global_batch_size"])
        with torch.no_grad():
            for name, v in p.items():
                lr = learning_rate(t, (step - 1) * t["global_batch_size"], mup_lr_mult(name, v, m, t))
                eps = t.get("adam_eps", 0.0) * mup_eps_mult(name, v, m, t)
                g = v.grad * scale
                wd = t["weight_decay"] if decays(name, v) else 0.0
                s = state[name]
                if uses_muon(name, v, t):
                    mu = t["muon_momentum"]
                    if s["buf"] is None:
                        s["buf"] = torch.zeros_like(v)
                    v -= lr * wd * v
                    s["buf"] = mu * s["buf"] + (1 - mu) * g
                    u = mu * s["buf"] + (1 - mu) * g if t["muon_nesterov"] else s["buf"]
                    v -= lr * muon_ref.orthogonalised_update(u, muon_settings(name, m, t))
                elif t["optimizer"] in ("adam", "muon"):
                    b1, b2 = t["adam_beta1"], t["adam_beta2"]
                    s["m"] = b1 * s["m"] + (1 - b1) * g
                    s["v"] = b2 * s["v"] + (1 - b2) * g * g
                    m_hat = s["m"] / (1 - b1 ** step)
                    v_hat = s["v"] / (1 - b2 ** step)
                    v -= lr * (m_hat / (torch.sqrt(v_hat) + eps) + wd * v)
                else:
                    d = g + wd * v
                    s["buf"] = d.clone() if s["buf"] is None else t["sgd_momentum"] * s["buf"] + d
                    v -= lr * s["buf"]
        series["loss"].append(loss_sum / mask_sum)
        if m.get("num_experts"):  # Megatron's tracker: sum over micro-batches / their number, mean over layers
            layers = len(aux["load_balancing"]) // mbs
            series["load_balancing_loss"].append(float(sum(aux["load_balancing"])) / mbs / layers)
            series["z_loss"].append(float(sum(aux["z"])) / mbs / layers)
            series["min_topk_margin"].append(min(aux["min_topk_margin"]))
        series["loss_differentiated"].append(diff_loss)
        series["grad_norm"].append(grad_norm)
        series["lr_used"].append(lr_base)
        series["lr"].append(learning_rate(t, step * t["global_batch_size"]))
    return {k: v.detach() for k, v in p.items()}, series


# ---------------------------------------------------------------------------------------------
# Checks of the reference itself
# ---------------------------------------------------------------------------------------------

def finite_difference_check(p0, m, batch, rng):
    """Central differences (h = 1e-6, float64) against autograd, on 3 elements of every parameter kind."""
    p = {k: v.clone().requires_grad_(True) for k, v in p0.items()}
    loss = micro_batch_objective(p, m, batch)[0]
    loss.backward()
    kinds = {}
    for name in p0:  # one parameter of each kind: the last layer's copy for per-layer parameters
        kinds[name.split(".", 3)[-1] if name.startswith("decoder.layers.") else name] = name
    h, worst, checked = 1e-6, 0.0, []
    for kind, name in sorted(kinds.items()):
        n = p0[name].numel()
        picks = list(rng.choice(n, size=min(3, n), replace=False))
        if name == "embedding.word_embeddings.weight":  # also a padded vocabulary row
            picks.append((padded_vocab(m) - 1) * m["hidden_size"] + 5)
        for e in picks:
            e = int(e)
            flat = p0[name].clone().view(-1)
            values = []
            for sign in (1.0, -1.0):
                q = dict(p0)
                f = flat.clone()
                f[e] += sign * h
                q[name] = f.view(p0[name].shape)
                values.append(float(micro_batch_objective(q, m, batch)[0]))
            fd = (values[0] - values[1]) / (2 * h)
            ad = float(p[name].grad.view(-1)[e])
            err = abs(fd - ad)
            tol = 1e-8 + 1e-6 * abs(ad)
            if not err <= tol:
                raise AssertionError(f"finite differences disagree for {name}[{e}]: fd {fd!r} autograd {ad!r}")
            worst = max(worst, err / max(abs(ad), 1e-8))
            checked.append(name)
    return {"step": h, "elements_checked": len(checked), "parameters": sorted(set(checked)),
            "max_relative_error": worst, "tolerance": "abs(fd - autograd) <= 1e-8 + 1e-6 * abs(autograd)"}


def train_with_torch_optim(p0, cfg, inputs):
    """The same run through torch.optim.AdamW/SGD and clip_grad_norm_ (a cross-check of train())."""
    m, t = cfg["model"], cfg["train"]
    p = {k: v.clone().requires_grad_(True) for k, v in p0.items()}
    # One group per (weight decay, MuP lr multiplier, MuP eps multiplier), as Megatron's param groups.
    keyed = {}
    for k, v in p.items():
        key = (decays(k, v), mup_lr_mult(k, v, m, t), mup_eps_mult(k, v, m, t))
        keyed.setdefault(key, []).append(v)
    groups = [{"params": vs, "weight_decay": t["weight_decay"] if d else 0.0, "lr_mult": lm,
               **({"eps": t["adam_eps"] * em} if t["optimizer"] == "adam" else {})}
              for (d, lm, em), vs in keyed.items()]
    if t["optimizer"] == "adam":
        opt = torch.optim.AdamW(groups, lr=0.0, betas=(t["adam_beta1"], t["adam_beta2"]), eps=t["adam_eps"])
    else:
        opt = torch.optim.SGD(groups, lr=0.0, momentum=t["sgd_momentum"])
    mbs = t["global_batch_size"] // t["micro_batch_size"]
    series = {"loss": [], "grad_norm": [], "lr": []}
    for it in range(t["train_iters"]):
        opt.zero_grad(set_to_none=True)
        num, den = 0.0, 0.0
        for mb in range(mbs):
            batch = micro_batch(inputs, it, mb)
            aux = {}
            logits = forward(p, m, batch["tokens"], batch["position_ids"], batch.get("document_ids"), aux)
            losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                                                       reduction="none")
            mask = batch["loss_mask"].reshape(-1).to(torch.float64)
            (((losses * mask).sum() / mask.sum() + moe_objective(m, aux)) / mbs).backward()
            num, den = num + float((losses.detach() * mask).sum()), den + float(mask.sum())
        norm = float(torch.nn.utils.clip_grad_norm_(list(p.values()), t["clip_grad"]))
        for g in opt.param_groups:
            g["lr"] = learning_rate(t, it * t["global_batch_size"], g["lr_mult"])
        opt.step()
        series["loss"].append(num / den)
        series["grad_norm"].append(norm)
        series["lr"].append(learning_rate(t, (it + 1) * t["global_batch_size"]))
    return {k: v.detach() for k, v in p.items()}, series


def train_with_muon_reference(p0, cfg, inputs):
    """The muon run again: Muon parameters through muon_reference.muon-style in-place updates (lerp_,
    add_ with alpha), the others through torch.optim.AdamW, clipping by clip_grad_norm_."""
    m, t = cfg["model"], cfg["train"]
    p = {k: v.clone().requires_grad_(True) for k, v in p0.items()}
    adam = {k: v for k, v in p.items() if not uses_muon(k, v, t)}
    groups = [{"params": [v for k, v in adam.items() if decays(k, v)], "weight_decay": t["weight_decay"]},
              {"params": [v for k, v in adam.items() if not decays(k, v)], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=0.0, betas=(t["adam_beta1"], t["adam_beta2"]), eps=t["adam_eps"])
    bufs = {k: torch.zeros_like(v) for k, v in p.items() if k not in adam}
    mbs = t["global_batch_size"] // t["micro_batch_size"]
    series = {"loss": [], "grad_norm": [], "lr": []}
    for it in range(t["train_iters"]):
        opt.zero_grad(set_to_none=True)
        for v in p.values():
            v.grad = None
        num, den = 0.0, 0.0
        for mb in range(mbs):
            batch = micro_batch(inputs, it, mb)
            logits = forward(p, m, batch["tokens"], batch["position_ids"], batch.get("document_ids"), {})
            losses = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1),
                                                       reduction="none")
            mask = batch["loss_mask"].reshape(-1).to(torch.float64)
            ((losses * mask).sum() / mask.sum() / mbs).backward()
            num, den = num + float((losses.detach() * mask).sum()), den + float(mask.sum())
        norm = float(torch.nn.utils.clip_grad_norm_(list(p.values()), t["clip_grad"]))
        lr = learning_rate(t, it * t["global_batch_size"])
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        with torch.no_grad():
            for k, buf in bufs.items():
                v, g = p[k], p[k].grad
                v.add_(v, alpha=-t["weight_decay"] * lr)
                buf.lerp_(g, 1 - t["muon_momentum"])
                u = g.lerp(buf, t["muon_momentum"]) if t["muon_nesterov"] else buf
                v.add_(muon_ref.orthogonalised_update(u, muon_settings(k, m, t)), alpha=-lr)
        series["loss"].append(num / den)
        series["grad_norm"].append(norm)
        series["lr"].append(learning_rate(t, (it + 1) * t["global_batch_size"]))
    return {k: v.detach() for k, v in p.items()}, series


def self_checks():
    """The building blocks against PyTorch's own (or differently written) versions."""
    rng = torch.Generator().manual_seed(5)
    x = torch.randn(3, 5, 64, generator=rng)
    w, b = torch.randn(64, generator=rng), torch.randn(64, generator=rng)
    m_ln = dict(normalization="LayerNorm", norm_epsilon=1e-5)
    assert torch.allclose(norm(x, {"n.weight": w, "n.bias": b}, "n", m_ln),
                          torch.nn.functional.layer_norm(x, (64,), w, b, 1e-5), rtol=0, atol=1e-12)
    rms = norm(x, {"n.weight": w}, "n", dict(normalization="RMSNorm", norm_epsilon=1e-5))
    assert torch.allclose(rms, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, rtol=0, atol=1e-12)
    u = torch.randn(100, generator=rng)
    assert torch.allclose(0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0))), torch.nn.functional.gelu(u), rtol=0, atol=1e-14)
    # RoPE as complex rotation of the pairs (x[i], x[i + R/2]) by theta_i, on the first R dims.
    for pct in (1.0, 0.5):
        q = torch.randn(2, 7, 3, 16, generator=rng)
        pos = torch.randint(0, 30, (2, 7), generator=rng)
        got = rope(q, pos, dict(rotary_base=10000, rotary_percent=pct))
        R = int(16 * pct)
        theta = pos[..., None, None].to(torch.float64) * (10000.0 ** (-torch.arange(0, R, 2) / R))
        z = torch.complex(q[..., : R // 2], q[..., R // 2:R]) * torch.exp(1j * theta)
        want = torch.cat([z.real, z.imag, q[..., R:]], -1)
        assert torch.allclose(got, want, rtol=0, atol=1e-12), "rope"
    # Grouped-query attention and the QKV row layout, against a per-head loop.
    m = dict(LLAMA_MODEL, num_layers=1, untie_embeddings_and_output_weights=True)
    p = {k: v + 0.01 * torch.randn(v.shape, generator=rng) for k, v in initial_weights(m, 3).items()}
    tokens = torch.randint(0, 96, (2, 16), generator=rng)
    pos = torch.arange(16).expand(2, 16)
    got = forward(p, m, tokens, pos)
    want = forward_by_loops(p, m, tokens, pos)
    assert torch.allclose(got, want, rtol=0, atol=1e-10), float((got - want).abs().max())
    ma = dict(m, position_embedding_type="alibi")
    got, want = forward(p, ma, tokens, pos), forward_by_loops(p, ma, tokens, pos)
    assert torch.allclose(got, want, rtol=0, atol=1e-10), float((got - want).abs().max())
    assert float((got - forward(p, m, tokens, pos)).abs().max()) > 1e-3, "alibi changes nothing"
    # The slopes against the Press et al. recursion (power-of-two heads, then every other slope of 2p).
    def press(n):
        if math.log2(n).is_integer():
            first = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
            return [first ** (i + 1) for i in range(n)]
        c = 2 ** math.floor(math.log2(n))
        return press(c) + press(2 * c)[0::2][: n - c]
    for n in (1, 4, 8, 12, 16, 20):
        assert all(abs(a - b) < 1e-15 for a, b in zip(alibi_slopes(n), press(n))) and len(alibi_slopes(n)) == n, n
    # The dense-gate MoE against a token-by-token loop (sort, softmax of the k largest logits).
    mm = dict(MIXTRAL_MODEL, num_layers=1)
    pm = {k: v + 0.05 * torch.randn(v.shape, generator=rng) for k, v in initial_weights(mm, 8).items()}
    h = torch.randn(3, 5, 64, generator=rng)
    got = moe(h, pm, "decoder.layers.0.mlp.", mm, {}).reshape(15, 64)
    for t_, x_ in enumerate(h.reshape(15, 64)):
        l_ = pm["decoder.layers.0.mlp.router.weight"] @ x_
        chosen = sorted(range(4), key=lambda e: -float(l_[e]))[:2]
        w_ = torch.exp(l_[chosen]) / torch.exp(l_[chosen]).sum()
        want = sum(w_[j] * mlp(x_, pm, f"decoder.layers.0.mlp.experts.local_experts.{e}.", mm, 48)
                   for j, e in enumerate(chosen))
        assert torch.allclose(got[t_], want, rtol=0, atol=1e-12), "moe"
    # Cross entropy.
    logits, labels = torch.randn(4, 9, generator=rng), torch.randint(0, 9, (4,), generator=rng)
    assert torch.allclose(token_losses(logits, labels), torch.nn.functional.cross_entropy(logits, labels, reduction="none"),
                          rtol=0, atol=1e-13)
    # Schedule: warmup from 0, cosine to min_lr, min_lr after the decay.
    t = dict(ADAMW)
    assert learning_rate(t, 0) == 0.0 and learning_rate(t, 4) == 5e-4 and learning_rate(t, 8) == 1e-3
    assert abs(learning_rate(t, 24) - 5.5e-4) < 1e-18 and learning_rate(t, 40) == 1e-4 and learning_rate(t, 44) == 1e-4


def forward_by_loops(p, m, tokens, position_ids):
    """forward() for one layer with attention written head by head and query by query."""
    B, S = tokens.shape
    NH, KV, HD, F = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"], m["ffn_hidden_size"]
    x = p["embedding.word_embeddings.weight"][tokens]
    a = norm(x, p, "decoder.layers.0.input_layernorm", m)
    W = p["decoder.layers.0.self_attention.linear_qkv.weight"]
    ctx = torch.zeros(B, S, NH * HD)
    rows_per_group = (NH // KV + 2) * HD
    for h in range(NH):
        g, j = h // (NH // KV), h % (NH // KV)
        base = g * rows_per_group
        q = a @ W[base + j * HD: base + (j + 1) * HD].T
        k = a @ W[base + (NH // KV) * HD: base + (NH // KV + 1) * HD].T
        v = a @ W[base + (NH // KV + 1) * HD: base + (NH // KV + 2) * HD].T
        if m["position_embedding_type"] == "rope":
            q = rope(q[:, :, None], position_ids, m)[:, :, 0]
            k = rope(k[:, :, None], position_ids, m)[:, :, 0]
        # ALiBi as Bloom writes it: + m_h·j (the softmax cancels the row's constant −m_h·i).
        slope = alibi_slopes(NH)[h] if m["position_embedding_type"] == "alibi" else 0.0
        for bi in range(B):
            for i in range(S):
                s = torch.stack([q[bi, i] @ k[bi, j2] / math.sqrt(HD) + slope * j2 for j2 in range(i + 1)])
                ctx[bi, i, h * HD:(h + 1) * HD] = torch.softmax(s, 0) @ v[bi, : i + 1]
    x = x + ctx @ p["decoder.layers.0.self_attention.linear_proj.weight"].T
    u = norm(x, p, "decoder.layers.0.pre_mlp_layernorm", m) @ p["decoder.layers.0.mlp.linear_fc1.weight"].T
    x = x + (torch.nn.functional.silu(u[..., :F]) * u[..., F:]) @ p["decoder.layers.0.mlp.linear_fc2.weight"].T
    return norm(x, p, "decoder.final_layernorm", m) @ p["output_layer.weight"].T


def summary(t, reference=None, samples=8):
    """Exact float64 statistics of a tensor (and of its difference from `reference`) plus sampled elements."""
    flat = t.reshape(-1)
    n = flat.numel()
    idx = sorted(set(int(i) for i in np.linspace(0, n - 1, num=min(samples, n)).round()))
    out = {"numel": n, "norm": float(flat.norm()), "sum": float(flat.sum()), "abs_max": float(flat.abs().max()),
           "sample_index": idx, "sample_value": [float(flat[i]) for i in idx]}
    if reference is not None:
        out["update_norm"] = float((flat - reference.reshape(-1)).norm())
    return out


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def compact_json(obj):
    """Indented JSON with every list of numbers or strings on one line (floats keep all 17 digits)."""
    text = json.dumps(obj, indent=1)
    return re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda mt: "[" + re.sub(r",\s+", ", ", mt.group(1)) + "]", text)


def write_tensors(path, tensors, metadata):
    save_file({k: v.contiguous() for k, v in tensors.items()}, path, metadata=metadata)


def run_config(name, out_root, cache):
    cfg = CONFIGS[name]
    m, t = cfg["model"], cfg["train"]
    out_dir = os.path.join(out_root, name)
    os.makedirs(out_dir, exist_ok=True)
    files = {}
    base = cfg.get("weights_from")
    if base:
        weights = cache[base]["weights"]
        files["weights"] = f"../{base}/weights.safetensors"
    else:
        weights = initial_weights(m, cfg["weight_seed"])
        write_tensors(os.path.join(out_dir, "weights.safetensors"), {k: v.to(torch.bfloat16) for k, v in weights.items()},
                      {"content": f"initial parameters of golden config '{name}' (bfloat16-exact draws)"})
        files["weights"] = "weights.safetensors"
    assert [n for n, _, _ in parameter_specs(m)] == list(weights), "weights do not match the model's parameters"
    if cfg.get("inputs_from"):
        inputs = cache[cfg["inputs_from"]]["inputs"]
        files["inputs"] = f"../{cfg['inputs_from']}/inputs.safetensors"
    else:
        inputs = make_inputs(cfg)
        write_tensors(os.path.join(out_dir, "inputs.safetensors"), inputs,
                      {"content": "token batches [iterations, micro-batches, B, S]"})
        files["inputs"] = "inputs.safetensors"
    cache[name] = {"weights": weights, "inputs": inputs}

    fixture = {"name": name, "generator": "tools/reference/gpt_reference.py",
               "versions": {"torch": torch.__version__, "numpy": np.__version__, "safetensors": safetensors.__version__,
                            "python": sys.version.split()[0]},
               "model": dict(m, padded_vocab_size=padded_vocab(m)), "training": t,
               "megatron_args": megatron_args(m, t),
               "parameters": [{"name": n, "shape": list(shape)} for n, shape, _ in parameter_specs(m)],
               "eod_token": EOD if cfg.get("data") == "documents" else None,
               "files": files}

    batch = micro_batch(inputs, 0, 0)
    p = {k: v.clone().requires_grad_(True) for k, v in weights.items()}
    aux = {}
    objective, loss, losses, logits = micro_batch_objective(p, m, batch, aux)
    objective.backward()
    grads = {k: v.grad.detach() for k, v in p.items()}
    if cfg.get("forward", True):
        write_tensors(os.path.join(out_dir, "forward.safetensors"),
                      {"logits": logits.detach().to(torch.float32), "token_losses": losses.detach().to(torch.float32)},
                      {"content": "forward pass of iteration 0, micro-batch 0: logits [B, S, V], per-token losses [B, S]"})
        files["forward"] = "forward.safetensors"
        fixture["forward"] = {"iteration": 0, "micro_batch": 0, "loss": float(loss),
                              "logits_norm": float(logits.detach().norm())}
        if m.get("num_experts"):  # the gradients are those of loss + the coefficients' aux terms
            fixture["forward"]["load_balancing_loss"] = [float(v) for v in aux["load_balancing"]]
            fixture["forward"]["z_loss"] = [float(v) for v in aux["z"]]
            fixture["forward"]["min_topk_margin"] = min(aux["min_topk_margin"])
        if cfg["full_grads"]:
            write_tensors(os.path.join(out_dir, "grads.safetensors"), {k: v.to(torch.float32) for k, v in grads.items()},
                          {"content": "gradient of the iteration-0 micro-batch-0 loss for every parameter"})
            files["grads"] = "grads.safetensors"
        fixture["grad_summary"] = {k: summary(v) for k, v in grads.items()}
        fixture["finite_difference"] = finite_difference_check(weights, m, batch, np.random.RandomState(99))

    final, series = train(weights, cfg, inputs)
    if t["optimizer"] == "muon":  # no torch.optim Muon: the cross-check is muon_reference.py's own (in place)
        check_final, check_series = train_with_muon_reference(weights, cfg, inputs)
    else:
        check_final, check_series = train_with_torch_optim(weights, cfg, inputs)
    diff = max(float((final[k] - check_final[k]).abs().max()) for k in final)
    series_diff = max(abs(a - b) for k in ("loss", "grad_norm", "lr") for a, b in zip(series[k], check_series[k]))
    assert diff < 1e-12 and series_diff < 1e-12, f"{name}: torch.optim cross-check differs by {diff}, {series_diff}"
    if m.get("num_experts"):  # float32 Gale routes like this float64 run only with clear top-k margins
        assert min(series["min_topk_margin"]) > 1e-4, f"{name}: a top-k margin of {min(series['min_topk_margin'])}"
    fixture["train"] = series
    fixture["cross_checks"] = {"torch_optim_final_params_max_abs_diff": diff, "torch_optim_series_max_abs_diff": series_diff}
    fixture["final_params"] = {k: summary(v, weights[k]) for k, v in final.items()}
    with open(os.path.join(out_dir, "fixture.json"), "w") as f:
        f.write(compact_json(fixture) + "\n")
    fd = fixture.get("finite_difference")
    print(f"{name}: " + (f"loss {fixture['forward']['loss']:.6f}; " if "forward" in fixture else "") +
          f"train loss {series['loss'][0]:.6f} -> {series['loss'][-1]:.6f}; "
          f"grad norm {series['grad_norm'][0]:.4f} -> {series['grad_norm'][-1]:.4f}" +
          (f"; finite differences: {fd['elements_checked']} elements, max rel err {fd['max_relative_error']:.2e}" if fd else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/golden")))
    ap.add_argument("--only", default=",".join(CONFIGS), help="comma-separated configs (bases are always computed)")
    args = ap.parse_args()
    self_checks()
    wanted = args.only.split(",")
    cache = {}
    for name in CONFIGS:  # bases come first in CONFIGS
        if name in wanted or any(CONFIGS[w].get("weights_from") == name or CONFIGS[w].get("inputs_from") == name for w in wanted):
            run_config(name, args.out, cache)


if __name__ == "__main__":
    main()
