# Tiny random BaichuanForCausalLM (Baichuan2-7B form) and ChatGLMModel (ChatGLM3-6B form) models in Hugging Face's
# exact layout, with golden logits from an independent plain-torch forward written from the public modeling code
# (modeling_baichuan.py / modeling_chatglm.py, loaded with trust_remote_code; no transformers needed here).
#
#   /usr/bin/python3 tools/reference/hf_fixture_baichuan_chatglm.py     # writes tests/data/hf/{baichuan2,chatglm3}/
#
# Both: 2 layers, hidden 64, 4 query heads, SwiGLU 96, vocabulary 100, untied head, RMSNorm, f32 weights;
# golden.safetensors as hf_fixture.py's: tokens [12] i64, logits [12, 100] f32, loss [1] f32, greedy [5] i64
# (greedy decoding recomputing the whole sequence). The forward runs in float64 (stored f32).
#
# baichuan2 (Baichuan2-7B's modeling_baichuan.py): model.embed_tokens, layers.i.input_layernorm,
#   self_attn.W_pack [3·H, H] = [q; k; v] (multi-head), self_attn.o_proj, post_attention_layernorm,
#   mlp.gate_proj / up_proj / down_proj, model.norm, lm_head; rotate-half RoPE with base 10000 (no rope_theta
#   key); rms_norm_eps 1e-6. lm_head is a NormHead: the logits use each vocabulary row divided by its L2 norm
#   (F.normalize, in training at every forward, in eval once), so the stored rows are left unnormalised here.
# chatglm3 (ChatGLM3-6B's modeling_chatglm.py, GLM-4-9B's chat format alike): transformer.embedding.word_embeddings,
#   transformer.encoder.layers.i.input_layernorm, self_attention.query_key_value [(NH + 2 G)·D, H] + bias
#   = [q NH·D; k G·D; v G·D] (multi_query_group_num G = 2, kv_channels D = 24, not hidden / heads),
#   self_attention.dense, post_attention_layernorm, mlp.dense_h_to_4h [2F, H] = [gate; up] (silu(gate) * up),
#   mlp.dense_4h_to_h, transformer.encoder.final_layernorm, transformer.output_layer; RoPE on the first D / 2
#   dimensions of each head in interleaved pairs (x[2i], x[2i+1]) with base 10000 · rope_ratio (2 here) and
#   θ_i = base^(-2i / (D / 2)); the rest of the head passes through. transformer.rotary_pos_emb.inv_freq is a
#   saved buffer the forward does not read (it recomputes θ); written as 1 / 10000^(2i / (D / 2)) in float64
#   rounded to f32.
import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "hf")
H, NH, F, V, L, S = 64, 4, 96, 100, 2, 12


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


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_half(x, pos, theta, d):  # x [heads, S, d], rotate-half over the whole head
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos[:, None] * inv[None, :]
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def rope_glm(x, pos, base, d):  # x [heads, S, d]: pairs (2i, 2i+1) of the first d / 2 dimensions
    rot = d // 2
    theta = 1.0 / (base ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    ang = pos[:, None] * theta[None, :]  # [S, rot / 2]
    cos, sin = ang.cos(), ang.sin()
    xr, xp = x[..., :rot], x[..., rot:]
    a, b = xr[..., 0::2], xr[..., 1::2]
    out = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    return torch.cat([out, xp], -1)


def attention(q, k, v, d):  # q [NH, S, d], k/v [G, S, d]
    n, groups = q.shape[1], k.shape[0]
    visible = torch.arange(n)[None, :] <= torch.arange(n)[:, None]
    k, v = k.repeat_interleave(NH // groups, 0), v.repeat_interleave(NH // groups, 0)
    scores = (q @ k.transpose(1, 2)) / (d ** 0.5)
    scores = scores.masked_fill(~visible, float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, NH * d)


BAICHUAN_D = H // NH
CHATGLM_D, CHATGLM_G = 24, 2


def baichuan_logits(w, cfg, tokens):
    n, d, eps = len(tokens), BAICHUAN_D, cfg["rms_norm_eps"]
    pos = torch.arange(n, dtype=torch.float64)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q, k, v = (h @ w[p + "self_attn.W_pack.weight"].T).split(H, dim=-1)
        q, k, v = (t.view(n, NH, d).transpose(0, 1) for t in (q, k, v))
        q, k = rope_half(q, pos, 10000.0, d), rope_half(k, pos, 10000.0, d)
        x = x + attention(q, k, v, d) @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = torch.nn.functional.normalize(w["lm_head.weight"])  # NormHead
    return rms_norm(x, w["model.norm.weight"], eps) @ head.T


def chatglm_logits(w, cfg, tokens):
    n, d, g, eps = len(tokens), CHATGLM_D, CHATGLM_G, cfg["layernorm_epsilon"]
    pos = torch.arange(n, dtype=torch.float64)
    base = 10000.0 * cfg.get("rope_ratio", 1.0)
    x = w["transformer.embedding.word_embeddings.weight"][tokens]
    for layer in range(L):
        p = f"transformer.encoder.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        qkv = h @ w[p + "self_attention.query_key_value.weight"].T + w[p + "self_attention.query_key_value.bias"]
        q = qkv[:, : NH * d].view(n, NH, d).transpose(0, 1)
        k = qkv[:, NH * d: (NH + g) * d].view(n, g, d).transpose(0, 1)
        v = qkv[:, (NH + g) * d:].view(n, g, d).transpose(0, 1)
        q, k = rope_glm(q, pos, base, d), rope_glm(k, pos, base, d)
        x = x + attention(q, k, v, d) @ w[p + "self_attention.dense.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = (h @ w[p + "mlp.dense_h_to_4h.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.dense_4h_to_h.weight"].T
    x = rms_norm(x, w["transformer.encoder.final_layernorm.weight"], eps)
    return x @ w["transformer.output_layer.weight"].T


def random_weights(g, names_shapes):
    out = {}
    for name, shape in names_shapes:
        if len(shape) == 1 and "bias" not in name:  # norm weights around 1
            out[name] = (1.0 + 0.1 * torch.randn(shape, generator=g)).float()
        else:
            scale = 0.5 if "emb" in name else 0.3 if name == "lm_head.weight" else 0.15
            out[name] = (torch.randn(shape, generator=g) * scale).float()
    return out


def baichuan_weights(g):
    ns = [("model.embed_tokens.weight", (V, H))]
    for i in range(L):
        p = f"model.layers.{i}."
        ns += [(p + "input_layernorm.weight", (H,)), (p + "self_attn.W_pack.weight", (3 * H, H)),
               (p + "self_attn.o_proj.weight", (H, H)), (p + "post_attention_layernorm.weight", (H,)),
               (p + "mlp.gate_proj.weight", (F, H)), (p + "mlp.up_proj.weight", (F, H)),
               (p + "mlp.down_proj.weight", (H, F))]
    ns += [("model.norm.weight", (H,)), ("lm_head.weight", (V, H))]
    return random_weights(g, ns)


def chatglm_weights(g):
    d, grp = CHATGLM_D, CHATGLM_G
    ns = [("transformer.embedding.word_embeddings.weight", (V, H))]
    for i in range(L):
        p = f"transformer.encoder.layers.{i}."
        rows = (NH + 2 * grp) * d
        ns += [(p + "input_layernorm.weight", (H,)), (p + "self_attention.query_key_value.weight", (rows, H)),
               (p + "self_attention.query_key_value.bias", (rows,)), (p + "self_attention.dense.weight", (H, NH * d)),
               (p + "post_attention_layernorm.weight", (H,)), (p + "mlp.dense_h_to_4h.weight", (2 * F, H)),
               (p + "mlp.dense_4h_to_h.weight", (H, F))]
    ns += [("transformer.encoder.final_layernorm.weight", (H,)), ("transformer.output_layer.weight", (V, H))]
    w = random_weights(g, ns)
    rot = d // 2
    w["transformer.rotary_pos_emb.inv_freq"] = (
        1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))).float()
    return w


BAICHUAN_CONFIG = {
    "architectures": ["BaichuanForCausalLM"], "model_type": "baichuan",
    "auto_map": {"AutoConfig": "configuration_baichuan.BaichuanConfig",
                 "AutoModelForCausalLM": "modeling_baichuan.BaichuanForCausalLM"},
    "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "gradient_checkpointing": False, "hidden_act": "silu",
    "hidden_size": H, "initializer_range": 0.02, "intermediate_size": F, "max_position_embeddings": 64,
    "model_max_length": 64, "num_attention_heads": NH, "num_hidden_layers": L, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "tokenizer_class": "BaichuanTokenizer", "torch_dtype": "float32", "use_cache": True,
    "vocab_size": V, "z_loss_weight": 0,
}

CHATGLM_CONFIG = {
    "architectures": ["ChatGLMModel"], "model_type": "chatglm",
    "auto_map": {"AutoConfig": "configuration_chatglm.ChatGLMConfig",
                 "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
                 "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration"},
    "add_bias_linear": False, "add_qkv_bias": True, "apply_query_key_layer_scaling": True,
    "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0, "attention_softmax_in_fp32": True,
    "bias_dropout_fusion": True, "ffn_hidden_size": F, "fp32_residual_connection": False, "hidden_dropout": 0.0,
    "hidden_size": H, "kv_channels": CHATGLM_D, "layernorm_epsilon": 1e-5, "multi_query_attention": True,
    "multi_query_group_num": CHATGLM_G, "num_attention_heads": NH, "num_layers": L, "original_rope": True,
    "padded_vocab_size": V, "post_layer_norm": True, "rmsnorm": True, "rope_ratio": 2.0, "seq_length": 64,
    "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": True, "eos_token_id": 2, "pad_token_id": 0,
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
    g = torch.Generator().manual_seed(20240612)
    tokens = torch.randint(0, V, (S,), generator=g)
    w, logits = write_fixture("baichuan2", BAICHUAN_CONFIG, baichuan_weights(g), baichuan_logits, tokens)
    # The NormHead matters: the stored rows are far from unit length.
    assert (w["lm_head.weight"].norm(dim=1) - 1).abs().min() > 0.3
    w2, logits2 = write_fixture("chatglm3", CHATGLM_CONFIG, chatglm_weights(g), chatglm_logits, tokens)
    # The interleaved pairs, the half-head rotation and rope_ratio each change the logits.
    assert (chatglm_logits(w2, dict(CHATGLM_CONFIG, rope_ratio=1.0), tokens) - logits2).abs().max() > 1e-2
    d = CHATGLM_D
    q = torch.randn(NH, S, d, dtype=torch.float64)
    pos = torch.arange(S, dtype=torch.float64)
    half = torch.cat([rope_half(q[..., : d // 2], pos, 20000.0, d // 2), q[..., d // 2:]], -1)
    assert (rope_glm(q, pos, 20000.0, d) - half).abs().max() > 1e-2


if __name__ == "__main__":
    main()
