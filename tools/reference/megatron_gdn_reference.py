"""Tiny Megatron-Core Gated DeltaNet (-2) GPT checkpoints in the legacy `torch` format, laid out by Megatron's split rules.

Writes tests/data/megatron/<variant>/ for variant gdn (GatedDeltaNet) and gdn2 (GatedDeltaNet2), the fixtures of
tests/train/megatron_gdn_checkpoint_test.cc and tests/cli/megatron_gdn_cli_test.cc:
  tp1/      iter_0000007/mp_rank_00/model_optim_rng.pt
  tp2/      iter_0000007/mp_rank_{00,01}/model_optim_rng.pt: the same weights as TP 2 ranks hold them
  tp2pp2/   iter_0000007/mp_rank_{00,01}_{000,001}/model_optim_rng.pt (gdn only): TP 2 x PP 2, each stage
            numbering its layers from 0
each a torch.save of {'args': argparse.Namespace, 'checkpoint_version': 3.0, 'iteration': 7, 'model': state dict}
(what Megatron's generate_state_dict saves with --ckpt-format torch; no optimizer or RNG state).

Megatron's GatedDeltaNet needs CUDA and flash-linear-attention kernels (megatron/core/ssm/gated_delta_net/), so
the model is not built here: the state dicts are written from Megatron main's rules, which this script restates:
  * Transformer Engine's spec (the only one Megatron builds GDN with): a GDN layer holds
    self_attention.in_proj.{layer_norm_weight, weight}, conv1d.weight [C, 1, K] (nn.Conv1d, no bias), dt_bias,
    A_log, out_norm.weight [DV], out_proj.weight; an attention layer self_attention.linear_qkv.{layer_norm_weight,
    weight}, linear_proj.weight; every layer mlp.linear_fc1.{layer_norm_weight, weight}, mlp.linear_fc2.weight;
    each TE linear an `_extra_state` (None here, as Gale writes it).
  * common.py: in_proj is column-parallel (gather_output False) over in_proj_dim; each rank's output is split by
    in_proj_split_sections, the per-rank sizes of the sections (GDN: query, key, value, z, beta, alpha =
    qk/TP, qk/TP, v/TP, v/TP, NV/TP, NV/TP; GDN2: query, key, value, z, f, b, w = qk/TP, qk/TP, v/TP, v/TP,
    qk/TP, qk/TP, v/TP), and sharded_state_dict splits rank r's in_proj.weight by those sections into
    in_proj.weight.<name> shards of the global section: so rank r's in_proj rows are [q_r; k_r; v_r; z_r; ...],
    the r-th 1/TP of each global section. conv1d (conv_dim_local_tp = conv_dim / TP channels, partition_dim 0)
    likewise is [q_r; k_r; v_r]. dt_bias (GDN: NV; GDN2: qk_dim) and A_log (GDN: NV; GDN2: NK) are
    tensor_model_parallel with partition_dim 0: contiguous 1/TP. out_proj is row-parallel (input_is_parallel):
    columns split. out_norm (hidden_size = value_head_dim) is replicated.
  * the dense parts as Megatron-Core's GPT: linear_qkv rows per query group, SwiGLU fc1 [gate_r; up_r],
    linear_proj / fc2 columns, embedding and output_layer vocabulary rows, norms replicated.
and tests/data/megatron/gdn_reference.json: per variant the logits and per-token losses of the TP 1 model on 8 tokens,
computed here in float64 from Megatron's math (gdn.py / gdn2.py `_compute_gates`, the gated delta rule and GDN2's
S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T, the gated RMSNorm, RoPE attention, SwiGLU).
The TP 1 state dict is the "whole" model; the TP 2 files are cut from it by the rules above (the test checks that
Gale reads them into the TP 1 tensors and writes them back byte for byte).
Run (torch 1.13 is enough): /usr/bin/python3 tools/reference/megatron_gdn_reference.py tests/data/megatron
"""
import argparse
import json
import os
import shutil
import sys

import torch

LAYERS, HIDDEN, HEADS, FFN, VOCAB, PADDED = 4, 16, 2, 32, 50, 64
NK, NV, DK, DV, K = 2, 4, 4, 4, 4
PATTERN = [1, 1, 1, 0]  # --linear-attention-freq [1,1,1,0]: 1 a GDN layer, 0 full attention
ITERATION = 7
QK, VD = NK * DK, NV * DV


def in_proj_sections(variant):
    if variant == "gdn2":
        return [QK, QK, VD, VD, QK, QK, VD]  # query, key, value, z, f, b, w
    return [QK, QK, VD, VD, NV, NV]  # query, key, value, z, beta, alpha


def megatron_args(variant, tp, pp):
    return argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        kv_channels=HIDDEN // HEADS, group_query_attention=False, num_query_groups=1, seq_length=16,
        max_position_embeddings=16, position_embedding_type="rope", add_position_embedding=False,
        rotary_base=10000, rotary_percent=1.0, rotary_interleaved=False, normalization="RMSNorm",
        norm_epsilon=1e-6, swiglu=True, untie_embeddings_and_output_weights=True, add_bias_linear=False,
        add_qkv_bias=False, apply_layernorm_1p=False, make_vocab_size_divisible_by=16, padded_vocab_size=PADDED,
        vocab_size=VOCAB, tokenizer_type="NullTokenizer", tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=None,
        transformer_impl="transformer_engine", consumed_train_samples=56, consumed_valid_samples=0,
        skipped_train_samples=0, iteration=ITERATION, params_dtype=torch.float32, fp16=False, bf16=False,
        experimental_attention_variant=variant, linear_attention_freq=list(PATTERN), linear_conv_kernel_dim=K,
        linear_key_head_dim=DK, linear_value_head_dim=DV, linear_num_key_heads=NK, linear_num_value_heads=NV)


def whole_state_dict(variant):
    """The TP 1 state dict (Megatron's names and shapes), deterministic values."""
    g = torch.Generator().manual_seed(2024 if variant == "gdn" else 2025)

    def randn(*shape, scale=0.3):
        return torch.randn(*shape, generator=g) * scale

    sd = {"embedding.word_embeddings.weight": randn(PADDED, HIDDEN, scale=1.0)}
    for i, kind in enumerate(PATTERN):
        p = "decoder.layers.%d." % i
        if kind:
            rows = sum(in_proj_sections(variant))
            sd[p + "self_attention.in_proj.layer_norm_weight"] = 1 + randn(HIDDEN, scale=0.1)
            sd[p + "self_attention.in_proj.weight"] = randn(rows, HIDDEN)
            sd[p + "self_attention.in_proj._extra_state"] = None
            sd[p + "self_attention.conv1d.weight"] = randn(2 * QK + VD, 1, K, scale=0.5)
            sd[p + "self_attention.dt_bias"] = randn(QK if variant == "gdn2" else NV, scale=1.0)
            sd[p + "self_attention.A_log"] = torch.log(1 + 15 * torch.rand(NK if variant == "gdn2" else NV,
                                                                            generator=g))
            sd[p + "self_attention.out_norm.weight"] = 1 + randn(DV, scale=0.1)
            sd[p + "self_attention.out_proj.weight"] = randn(HIDDEN, VD)
            sd[p + "self_attention.out_proj._extra_state"] = None
        else:
            sd[p + "self_attention.linear_qkv.layer_norm_weight"] = 1 + randn(HIDDEN, scale=0.1)
            sd[p + "self_attention.linear_qkv.weight"] = randn(3 * HIDDEN, HIDDEN)
            sd[p + "self_attention.linear_qkv._extra_state"] = None
            sd[p + "self_attention.linear_proj.weight"] = randn(HIDDEN, HIDDEN)
            sd[p + "self_attention.linear_proj._extra_state"] = None
        sd[p + "mlp.linear_fc1.layer_norm_weight"] = 1 + randn(HIDDEN, scale=0.1)
        sd[p + "mlp.linear_fc1.weight"] = randn(2 * FFN, HIDDEN)
        sd[p + "mlp.linear_fc1._extra_state"] = None
        sd[p + "mlp.linear_fc2.weight"] = randn(HIDDEN, FFN)
        sd[p + "mlp.linear_fc2._extra_state"] = None
    sd["decoder.final_layernorm.weight"] = 1 + randn(HIDDEN, scale=0.1)
    sd["output_layer.weight"] = randn(PADDED, HIDDEN, scale=0.5)
    sd["output_layer._extra_state"] = None
    return sd


def sections_piece(t, sections, tp, r):
    """Rank r's rows of a tensor whose row sections are each split over TP on their own."""
    out, start = [], 0
    for n in sections:
        out.append(t[start + r * (n // tp): start + (r + 1) * (n // tp)])
        start += n
    return torch.cat(out, 0).clone()


def rows_piece(t, tp, r):
    n = t.shape[0] // tp
    return t[r * n:(r + 1) * n].clone()


def cols_piece(t, tp, r):
    n = t.shape[1] // tp
    return t[:, r * n:(r + 1) * n].clone()


def piece(name, t, variant, tp, r):
    if t is None or tp == 1:
        return t
    if name.endswith("in_proj.weight"):
        return sections_piece(t, in_proj_sections(variant), tp, r)
    if name.endswith("conv1d.weight"):
        return sections_piece(t, [QK, QK, VD], tp, r)
    if name.endswith(("dt_bias", "A_log", "linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
        return rows_piece(t, tp, r)  # linear_qkv: whole query groups (one per head without GQA)
    if name.endswith("linear_fc1.weight"):  # SwiGLU: [gate_r; up_r]
        gate, up = t[:FFN], t[FFN:]
        return torch.cat([rows_piece(gate, tp, r), rows_piece(up, tp, r)], 0)
    if name.endswith(("out_proj.weight", "linear_proj.weight", "linear_fc2.weight")):
        return cols_piece(t, tp, r)
    return t.clone()  # norms, out_norm: replicated


def stage_of(name, pp):
    """(stage, stage-local name) of a whole-model name; None for a tensor every stage lacks."""
    if name.startswith("decoder.layers."):
        i = int(name.split(".")[2])
        per = LAYERS // pp
        rest = name.split(".", 3)[3]
        return i // per, "decoder.layers.%d.%s" % (i - (i // per) * per, rest)
    if name.startswith("embedding."):
        return 0, name
    return pp - 1, name  # final_layernorm, output_layer


def save(root, variant, tp, pp):
    whole = whole_state_dict(variant)
    iter_dir = os.path.join(root, "iter_%07d" % ITERATION)
    for p in range(pp):
        for r in range(tp):
            sd = {}
            for name, t in whole.items():
                stage, local = stage_of(name, pp)
                if stage == p:
                    sd[local] = piece(name, t, variant, tp, r)
            rank = "mp_rank_%02d" % r if pp == 1 else "mp_rank_%02d_%03d" % (r, p)
            os.makedirs(os.path.join(iter_dir, rank))
            torch.save({"args": megatron_args(variant, tp, pp), "checkpoint_version": 3.0, "iteration": ITERATION,
                        "model": sd}, os.path.join(iter_dir, rank, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gdn_mixer(sd, p, u, variant):
    """Megatron's GatedDeltaNet (gdn.py, common.py) in float64, one sequence u [S, H], written from its math."""
    S = u.shape[0]
    zx = u @ sd[p + "in_proj.weight"].T
    sections = torch.split(zx, in_proj_sections(variant), dim=-1)
    q, k, v, z = sections[:4]
    b, a = (None, sections[4:]) if variant == "gdn2" else sections[4:]
    qkv = torch.cat([q, k, v], -1)  # conv1d over [q | k | v] channels, causal, no bias, then SiLU
    w = sd[p + "conv1d.weight"][:, 0, :]  # [C, K]
    padded = torch.cat([torch.zeros(K - 1, qkv.shape[1], dtype=qkv.dtype), qkv], 0)
    conv = torch.stack([(padded[s:s + K] * w.T).sum(0) for s in range(S)], 0)
    conv = torch.nn.functional.silu(conv)
    q, k, v = torch.split(conv, [QK, QK, VD], dim=-1)
    q, k, v = q.reshape(S, NK, DK), k.reshape(S, NK, DK), v.reshape(S, NV, DV)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)  # FLA's l2norm
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    r = NV // NK
    q, k = q.repeat_interleave(r, 1), k.repeat_interleave(r, 1)  # value head h reads key head h // r
    o = torch.zeros(S, NV, DV, dtype=u.dtype)
    if variant == "gdn2":  # S_t = (I - k (e*k)^T) Diag(exp g) S_{t-1} + k (w*v)^T, channel-wise gates
        f, e, wr = a  # the f, b, w sections (gdn2.py's _compute_gates)
        g = -sd[p + "A_log"].exp().repeat_interleave(DK) * torch.nn.functional.softplus(f + sd[p + "dt_bias"])
        g = g.reshape(S, NK, DK).repeat_interleave(r, 1)
        e = torch.sigmoid(e).reshape(S, NK, DK).repeat_interleave(r, 1)
        wr = torch.sigmoid(wr).reshape(S, NV, DV)
        for h in range(NV):
            state = torch.zeros(DK, DV, dtype=u.dtype)
            for s in range(S):
                decayed = g[s, h].exp()[:, None] * state
                state = decayed - torch.outer(k[s, h], decayed.T @ (e[s, h] * k[s, h])) + \
                    torch.outer(k[s, h], wr[s, h] * v[s, h])
                o[s, h] = state.T @ q[s, h] / DK ** 0.5
    else:
        g = -sd[p + "A_log"].exp() * torch.nn.functional.softplus(a + sd[p + "dt_bias"])  # [S, NV]
        beta = torch.sigmoid(b)
        for h in range(NV):
            state = torch.zeros(DK, DV, dtype=u.dtype)
            for s in range(S):
                state = state * g[s, h].exp()
                state = state + torch.outer(k[s, h], beta[s, h] * (v[s, h] - state.T @ k[s, h]))
                o[s, h] = state.T @ q[s, h] / DK ** 0.5
    y = rms_norm(o, sd[p + "out_norm.weight"]) * torch.nn.functional.silu(z.reshape(S, NV, DV))
    return y.reshape(S, VD) @ sd[p + "out_proj.weight"].T


def attention(sd, p, x):
    """Megatron-Core's self-attention: [q; k; v] per head (no GQA), RoPE (rotate-half), causal softmax."""
    S, D = x.shape[0], HIDDEN // HEADS
    qkv = (x @ sd[p + "linear_qkv.weight"].T).reshape(S, HEADS, 3, D)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    inv = 1.0 / 10000 ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]

    def rope(t):
        half = torch.cat([-t[..., D // 2:], t[..., :D // 2]], -1)
        return t * cos + half * sin

    q, k = rope(q), rope(k)
    scores = torch.einsum("shd,thd->hst", q, k) / D ** 0.5
    scores = scores.masked_fill(torch.triu(torch.ones(S, S, dtype=torch.bool), 1), float("-inf"))
    out = torch.einsum("hst,thd->shd", torch.softmax(scores, -1), v).reshape(S, HIDDEN)
    return out @ sd[p + "linear_proj.weight"].T


def reference_logits(variant, tokens):
    sd = {k: v.double() for k, v in whole_state_dict(variant).items() if v is not None}
    x = sd["embedding.word_embeddings.weight"][tokens]
    for i, kind in enumerate(PATTERN):
        p = "decoder.layers.%d." % i
        if kind:
            x = x + gdn_mixer(sd, p + "self_attention.", rms_norm(x, sd[p + "self_attention.in_proj.layer_norm_weight"]),
                              variant)
        else:
            x = x + attention(sd, p + "self_attention.", rms_norm(x, sd[p + "self_attention.linear_qkv.layer_norm_weight"]))
        h = rms_norm(x, sd[p + "mlp.linear_fc1.layer_norm_weight"]) @ sd[p + "mlp.linear_fc1.weight"].T
        x = x + (torch.nn.functional.silu(h[:, :FFN]) * h[:, FFN:]) @ sd[p + "mlp.linear_fc2.weight"].T
    x = rms_norm(x, sd["decoder.final_layernorm.weight"])
    return x @ sd["output_layer.weight"].T  # [S, padded vocabulary]


def main():
    out = sys.argv[1]
    for variant, layouts in (("gdn", [(1, 1), (2, 1), (2, 2)]), ("gdn2", [(1, 1), (2, 1)])):
        base = os.path.join(out, variant)
        shutil.rmtree(base, ignore_errors=True)
        for tp, pp in layouts:
            name = "tp%d" % tp + ("pp%d" % pp if pp > 1 else "")
            save(os.path.join(base, name), variant, tp, pp)
    tokens = [3, 17, 42, 8, 0, 49, 25, 11]
    labels = tokens[1:] + tokens[:1]
    ref = {}
    for variant in ("gdn", "gdn2"):
        logits = reference_logits(variant, tokens)
        losses = torch.logsumexp(logits, -1) - logits[torch.arange(len(tokens)), labels]
        ref[variant] = {"tokens": tokens, "labels": labels, "logits": logits.tolist(), "losses": losses.tolist()}
    with open(os.path.join(out, "gdn_reference.json"), "w") as f:
        json.dump(ref, f)
    print("wrote", out)


if __name__ == "__main__":
    main()
