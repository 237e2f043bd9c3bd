#!/usr/bin/env python3
"""Float64 reference for Gemma-2's layer features (Gale's --attn-logit-softcapping, --output-logit-softcapping,
--query-pre-attn-scalar, --post-norm, --interleave-sliding-window) on a tiny two-layer model.

The model follows the Gemma-2 decoder layer of Hugging Face transformers (modeling_gemma2) with the parts Gale
shares with Megatron: RMSNorm with a plain weight, SwiGLU, rotate-half RoPE, Megatron's packed linear_qkv rows
(per query group: its query heads, then the key and the value head), no biases, untied output layer.
    h   = x + post_attn_norm(attn(input_layernorm(x)))
    out = h + post_mlp_layernorm(mlp(pre_mlp_layernorm(h)))
    attention scores s = (q.k) / sqrt(query_pre_attn_scalar), then cap*tanh(s/cap), then the causal mask (and
    in layers 1, 3, ... (1-based) the sliding window: keys i-W+1 .. i), then softmax
    logits = out_cap * tanh(final_layernorm(x) @ W_out^T / out_cap), loss = mean token cross-entropy
Weights are drawn here (seeded); the fixture holds them with the loss, the logits and every gradient.
Writes tests/data/reference/gemma2_layer.json. Needs torch (1.13 works) and numpy.
"""
import json
import math
import os

import torch

torch.set_default_dtype(torch.float64)

CFG = dict(num_layers=2, hidden_size=8, num_attention_heads=2, num_query_groups=1, kv_channels=4,
           ffn_hidden_size=12, vocab_size=16, seq_length=7, micro_batch_size=2, norm_epsilon=1e-6,
           rotary_base=10000.0, attn_logit_softcapping=1.5, output_logit_softcapping=2.0,
           query_pre_attn_scalar=3, interleave_sliding_window=3)


def shapes(c):
    H, NH, KV, HD, F, V = (c[k] for k in ("hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
                                          "ffn_hidden_size", "vocab_size"))
    out = {"embedding.word_embeddings.weight": [V, H]}
    for i in range(c["num_layers"]):
        p = f"decoder.layers.{i}."
        out[p + "input_layernorm.weight"] = [H]
        out[p + "self_attention.linear_qkv.weight"] = [(NH + 2 * KV) * HD, H]
        out[p + "self_attention.linear_proj.weight"] = [H, NH * HD]
        out[p + "post_attn_norm.weight"] = [H]
        out[p + "pre_mlp_layernorm.weight"] = [H]
        out[p + "mlp.linear_fc1.weight"] = [2 * F, H]
        out[p + "mlp.linear_fc2.weight"] = [H, F]
        out[p + "post_mlp_layernorm.weight"] = [H]
    out["decoder.final_layernorm.weight"] = [H]
    out["output_layer.weight"] = [V, H]
    return out


def rms(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def rotary(x, pos, base):
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    ang = pos[:, None].to(torch.float64) * freq[None, :]  # [S, d/2]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    half1, half2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos[None, :, None, :] + torch.cat([-half2, half1], -1) * sin[None, :, None, :]


def model_loss(p, c, tokens, labels):
    B, S = tokens.shape
    NH, KV, HD, F, eps = (c[k] for k in ("num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
                                         "norm_epsilon"))
    g = NH // KV
    pos = torch.arange(S)
    x = p["embedding.word_embeddings.weight"][tokens]  # [B, S, H]
    for i in range(c["num_layers"]):
        pre = f"decoder.layers.{i}."
        a = rms(x, p[pre + "input_layernorm.weight"], eps)
        qkv = (a @ p[pre + "self_attention.linear_qkv.weight"].T).view(B, S, KV, g + 2, HD)
        q = rotary(qkv[:, :, :, :g].reshape(B, S, NH, HD), pos, c["rotary_base"])
        k = rotary(qkv[:, :, :, g], pos, c["rotary_base"]).repeat_interleave(g, dim=2)
        v = qkv[:, :, :, g + 1].repeat_interleave(g, dim=2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(c["query_pre_attn_scalar"])
        cap = c["attn_logit_softcapping"]
        s = cap * torch.tanh(s / cap)
        qi, kj = pos[:, None], pos[None, :]
        visible = kj <= qi
        if i % 2 == 0:  # layer number i + 1 odd: the sliding window
            visible = visible & (qi - kj < c["interleave_sliding_window"])
        s = s.masked_fill(~visible[None, None], float("-inf"))
        ctx = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, -1), v).reshape(B, S, NH * HD)
        o = ctx @ p[pre + "self_attention.linear_proj.weight"].T
        x = x + rms(o, p[pre + "post_attn_norm.weight"], eps)
        m = rms(x, p[pre + "pre_mlp_layernorm.weight"], eps)
        u = m @ p[pre + "mlp.linear_fc1.weight"].T
        y = (torch.nn.functional.silu(u[..., :F]) * u[..., F:]) @ p[pre + "mlp.linear_fc2.weight"].T
        x = x + rms(y, p[pre + "post_mlp_layernorm.weight"], eps)
    z = rms(x, p["decoder.final_layernorm.weight"], eps) @ p["output_layer.weight"].T
    oc = c["output_logit_softcapping"]
    logits = oc * torch.tanh(z / oc)
    loss = torch.nn.functional.cross_entropy(logits.reshape(B * S, -1), labels.reshape(-1))
    return loss, logits


def main():
    c = CFG
    gen = torch.Generator().manual_seed(20240603)
    params = {}
    for name, shape in shapes(c).items():
        if name.endswith("norm.weight"):
            params[name] = 1.0 + 0.3 * torch.randn(shape, generator=gen)
        else:  # large enough that both caps bite
            params[name] = 0.8 * torch.randn(shape, generator=gen)
        params[name].requires_grad_(True)
    B, S, V = c["micro_batch_size"], c["seq_length"], c["vocab_size"]
    tokens = torch.randint(0, V, (B, S), generator=gen)
    labels = torch.randint(0, V, (B, S), generator=gen)
    loss, logits = model_loss(params, c, tokens, labels)
    loss.backward()
    flat = lambda t: [float(v) for v in t.detach().reshape(-1)]
    out = {"config": c, "tokens": tokens.tolist(), "labels": labels.tolist(), "loss": float(loss),
           "logits": flat(logits), "weights": {k: flat(v) for k, v in params.items()},
           "grads": {k: flat(v.grad) for k, v in params.items()}}
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "gemma2_layer.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
    print("loss", float(loss), "->", os.path.normpath(path))


if __name__ == "__main__":
    main()
