# Tiny random InternLM2ForCausalLM and Phi3ForCausalLM models in Hugging Face's exact layout, with golden
# logits from an independent plain-torch forward written from the public modeling code (no transformers).
#
#   /usr/bin/python3 tools/reference/hf_fixture_internlm2_phi3.py     # writes tests/data/hf/{internlm2,phi3}/
#
# Both: 2 layers, hidden 64, 4 heads of 16, 2 key/value heads, SwiGLU 96, vocabulary 100, untied lm head,
# RMSNorm (eps 1e-5), rotate-half RoPE, f32 weights; golden.safetensors as hf_fixture.py's: tokens [12] i64,
# logits [12, 100] f32, loss [1] f32, greedy [5] i64 (greedy decoding recomputing the whole sequence).
# The forward runs in float64 (stored f32).
#
# internlm2 (modeling_internlm2.py, trust_remote_code): model.tok_embeddings, layers.i.attention_norm,
#   attention.wqkv [(NH + 2 KV) D, H] viewed as [KV, NH/KV + 2, D, H] (per key/value group: its query
#   heads, then k, then v), attention.wo, ffn_norm, feed_forward.w1 (gate) / w3 (up) / w2 (down),
#   model.norm, output; "bias": false; rope_scaling {"type": "linear", "factor": 2}: positions / 2
#   (InternLM2LinearScalingRotaryEmbedding).
# phi3 (transformers' modeling_phi3.py): model.embed_tokens, self_attn.qkv_proj [q NH·D; k KV·D; v KV·D],
#   self_attn.o_proj, mlp.gate_up_proj [gate F; up F] (up * silu(gate)), mlp.down_proj, input_layernorm,
#   post_attention_layernorm, model.norm, lm_head; rope_scaling null; sliding_window 5 with transformers'
#   sliding mask (Mistral's: query i sees keys j <= i with i - j < 5).
import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "hf")
H, NH, KV, D, F, V, L, S = 64, 4, 2, 16, 96, 100, 2, 12
EPS = 1e-5


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        a = tensors[name].contiguous().numpy()
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def rope(x, pos, theta):  # x [heads, S, D], rotate-half, positions already scaled
    inv = 1.0 / (theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q, k, v, window):  # q [NH, S, D], k/v [KV, S, D]
    n = q.shape[1]
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    visible = j <= i
    if window is not None:
        visible = visible & (i - j < window)
    k, v = k.repeat_interleave(NH // KV, 0), v.repeat_interleave(NH // KV, 0)
    scores = (q @ k.transpose(1, 2)) / (D ** 0.5)
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, NH * D)


def internlm2_logits(w, cfg, tokens):
    n = len(tokens)
    pos = torch.arange(n, dtype=torch.float64) / cfg["rope_scaling"]["factor"]
    x = w["model.tok_embeddings.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "attention_norm.weight"])
        qkv = (h @ w[p + "attention.wqkv.weight"].T).view(n, KV, NH // KV + 2, D)
        q = qkv[:, :, : NH // KV, :].reshape(n, NH, D).transpose(0, 1)
        k = qkv[:, :, -2, :].transpose(0, 1)
        v = qkv[:, :, -1, :].transpose(0, 1)
        q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
        x = x + attention(q, k, v, None) @ w[p + "attention.wo.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"])
        gate, up = h @ w[p + "feed_forward.w1.weight"].T, h @ w[p + "feed_forward.w3.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "feed_forward.w2.weight"].T
    return rms_norm(x, w["model.norm.weight"]) @ w["output.weight"].T


def phi3_logits(w, cfg, tokens):
    n = len(tokens)
    pos = torch.arange(n, dtype=torch.float64)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"])
        qkv = h @ w[p + "self_attn.qkv_proj.weight"].T
        q = qkv[:, : NH * D].view(n, NH, D).transpose(0, 1)
        k = qkv[:, NH * D: (NH + KV) * D].view(n, KV, D).transpose(0, 1)
        v = qkv[:, (NH + KV) * D:].view(n, KV, D).transpose(0, 1)
        q, k = rope(q, pos, cfg["rope_theta"]), rope(k, pos, cfg["rope_theta"])
        x = x + attention(q, k, v, cfg["sliding_window"]) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = (h @ w[p + "mlp.gate_up_proj.weight"].T).chunk(2, dim=-1)
        x = x + (up * torch.nn.functional.silu(gate)) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def random_weights(g, names_shapes):
    out = {}
    for name, shape in names_shapes:
        if len(shape) == 1:  # norm weights around 1
            out[name] = (1.0 + 0.1 * torch.randn(shape, generator=g)).float()
        else:
            out[name] = (torch.randn(shape, generator=g) * (0.5 if "emb" in name else 0.15)).float()
    return out


def internlm2_weights(g):
    ns = [("model.tok_embeddings.weight", (V, H))]
    for i in range(L):
        p = f"model.layers.{i}."
        ns += [(p + "attention_norm.weight", (H,)), (p + "attention.wqkv.weight", ((NH + 2 * KV) * D, H)),
               (p + "attention.wo.weight", (H, NH * D)), (p + "ffn_norm.weight", (H,)),
               (p + "feed_forward.w1.weight", (F, H)), (p + "feed_forward.w3.weight", (F, H)),
               (p + "feed_forward.w2.weight", (H, F))]
    ns += [("model.norm.weight", (H,)), ("output.weight", (V, H))]
    return random_weights(g, ns)


def phi3_weights(g):
    ns = [("model.embed_tokens.weight", (V, H))]
    for i in range(L):
        p = f"model.layers.{i}."
        ns += [(p + "input_layernorm.weight", (H,)), (p + "self_attn.qkv_proj.weight", ((NH + 2 * KV) * D, H)),
               (p + "self_attn.o_proj.weight", (H, NH * D)), (p + "post_attention_layernorm.weight", (H,)),
               (p + "mlp.gate_up_proj.weight", (2 * F, H)), (p + "mlp.down_proj.weight", (H, F))]
    ns += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return random_weights(g, ns)


INTERNLM2_CONFIG = {
    "architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2",
    "auto_map": {"AutoConfig": "configuration_internlm2.InternLM2Config",
                 "AutoModelForCausalLM": "modeling_internlm2.InternLM2ForCausalLM"},
    "attn_implementation": "eager", "bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
    "hidden_act": "silu", "hidden_size": H, "initializer_range": 0.02, "intermediate_size": F,
    "max_position_embeddings": 64, "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": KV,
    "pretraining_tp": 1, "rms_norm_eps": EPS, "rope_scaling": {"type": "linear", "factor": 2.0},
    "rope_theta": 50000, "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": True,
    "vocab_size": V,
}

PHI3_CONFIG = {
    "architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "attention_bias": False,
    "attention_dropout": 0.0, "bos_token_id": 1, "embd_pdrop": 0.0, "eos_token_id": 32000, "hidden_act": "silu",
    "hidden_size": H, "initializer_range": 0.02, "intermediate_size": F, "max_position_embeddings": 64,
    "num_attention_heads": NH, "num_hidden_layers": L, "num_key_value_heads": KV,
    "original_max_position_embeddings": 64, "pad_token_id": 32000, "partial_rotary_factor": 1.0,
    "resid_pdrop": 0.0, "rms_norm_eps": EPS, "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": 5,
    "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": True, "vocab_size": V,
}


def write_fixture(name, cfg, weights, logits_fn, tokens):
    w64 = {k: v.double() for k, v in weights.items()}
    logits = logits_fn(w64, cfg, tokens)
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:]).reshape(1)
    seq = tokens.clone()
    for _ in range(5):
        seq = torch.cat([seq, logits_fn(w64, cfg, seq)[-1].argmax().reshape(1)])
    out = os.path.join(DATA, name)
    os.makedirs(out, exist_ok=True)
    write_safetensors(os.path.join(out, "model.safetensors"), weights)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(out, "golden.safetensors"),
                      {"tokens": tokens, "logits": logits.float(), "loss": loss.float(), "greedy": seq[len(tokens):]})
    print("wrote", out, "greedy", seq[len(tokens):].tolist(), "loss", loss.item())
    return w64, logits


def main():
    g = torch.Generator().manual_seed(20240611)
    tokens = torch.randint(0, V, (S,), generator=g)
    w, logits = write_fixture("internlm2", INTERNLM2_CONFIG, internlm2_weights(g), internlm2_logits, tokens)
    # Self-checks of the layout: a per-head [q; k; v] reading of wqkv and unscaled positions both change
    # the logits (so the golden values see the grouping and the linear factor).
    cfg = dict(INTERNLM2_CONFIG, rope_scaling={"type": "linear", "factor": 1.0})
    assert (internlm2_logits(w, cfg, tokens) - logits).abs().max() > 1e-2
    w2, logits = write_fixture("phi3", PHI3_CONFIG, phi3_weights(g), phi3_logits, tokens)
    cfg = dict(PHI3_CONFIG, sliding_window=None)
    assert (phi3_logits(w2, cfg, tokens) - logits).abs().max() > 1e-2  # the window matters
    cfg = dict(PHI3_CONFIG, sliding_window=S)
    assert (phi3_logits(w2, cfg, tokens) - phi3_logits(w2, dict(PHI3_CONFIG, sliding_window=None), tokens)).abs().max() == 0


if __name__ == "__main__":
    main()
