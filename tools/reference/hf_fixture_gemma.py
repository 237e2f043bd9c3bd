# The tiny GemmaForCausalLM fixture (tests/data/hf/gemma) for `gale convert`, without transformers:
# Gemma (v1)'s forward written out in torch (1.13 is enough) from transformers' modeling_gemma.
#
#   /usr/bin/python3 tools/reference/hf_fixture_gemma.py      # writes tests/data/hf/gemma/
#
# Gemma v1 as transformers runs it (GemmaForCausalLM, eager attention, fp32):
#   x = embed_tokens[ids] * normalizer,  normalizer = torch.tensor(hidden_size ** 0.5, dtype=x.dtype)
#   per layer: h = RMSNorm(x), x += o_proj(attention(h)); h = RMSNorm(x), x += down(act(gate(h)) * up(h))
#   RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * (1 + w)       (GemmaRMSNorm: w stored zero-centred)
#   act = gelu_pytorch_tanh (hidden_activation), RoPE rotate-half with rope_theta over head_dim,
#   attention scale head_dim^-0.5, GQA / MQA (num_key_value_heads), causal mask
#   logits = RMSNorm(x) @ embed_tokens^T                     (tie_word_embeddings true)
# Sizes: vocab 100, hidden 64, intermediate 96, 2 layers, 4 heads with 1 key/value head (Gemma-2B's
# multi-query attention), head_dim 24 (not hidden / heads = 16, as Gemma's 256). The weights are
# random and far from an init (norm weights zero-centred with spread 0.3), stored in float32 so that
# the Gale -> HF round trip is bit-exact. The forward runs in float64 on those float32 values.
# Writes what save_pretrained would (config.json, model.safetensors) and golden.safetensors in
# tools/reference/hf_fixture.py's layout: tokens [12] i64, logits [12, 100] f32, loss [1] f32 (mean
# causal-LM loss), greedy [5] i64 (argmax decoding appended to the tokens).
import json
import math
import os
import struct

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf", "gemma")
V, H, F, L, NH, KV, HD = 100, 64, 96, 2, 4, 1, 24
EPS, THETA, SEQ = 1e-6, 10000.0, 12


def config():
    return {
        "architectures": ["GemmaForCausalLM"], "model_type": "gemma", "vocab_size": V, "hidden_size": H,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
        "head_dim": HD, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 64, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
        "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True, "initializer_range": 0.02,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "use_cache": True, "torch_dtype": "float32",
        "transformers_version": "4.44.2",
    }


def weights():
    g = torch.Generator().manual_seed(5)
    w = {}

    def rnd(name, shape, scale):
        w[name] = (scale * torch.randn(shape, generator=g)).float()

    rnd("model.embed_tokens.weight", (V, H), 0.15)
    for i in range(L):
        p = f"model.layers.{i}."
        rnd(p + "input_layernorm.weight", (H,), 0.3)
        rnd(p + "self_attn.q_proj.weight", (NH * HD, H), 0.15)
        rnd(p + "self_attn.k_proj.weight", (KV * HD, H), 0.15)
        rnd(p + "self_attn.v_proj.weight", (KV * HD, H), 0.15)
        rnd(p + "self_attn.o_proj.weight", (H, NH * HD), 0.6)  # large: the layers, not the √H-scaled
        # embedding, decide the next token (tied embeddings otherwise repeat the last one)
        rnd(p + "post_attention_layernorm.weight", (H,), 0.3)
        rnd(p + "mlp.gate_proj.weight", (F, H), 0.15)
        rnd(p + "mlp.up_proj.weight", (F, H), 0.15)
        rnd(p + "mlp.down_proj.weight", (H, F), 0.6)
    rnd("model.norm.weight", (H,), 0.3)
    return w


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def forward(w, ids):
    d = {k: v.double() for k, v in w.items()}
    S = ids.numel()
    x = d["model.embed_tokens.weight"][ids] * torch.tensor(H ** 0.5, dtype=torch.float32).double()
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.int64).double() / HD))
    freqs = torch.arange(S).double()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    mask = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(L):
        p = f"model.layers.{i}."
        h = rms_norm(x, d[p + "input_layernorm.weight"])
        q = (h @ d[p + "self_attn.q_proj.weight"].T).view(S, NH, HD)
        k = (h @ d[p + "self_attn.k_proj.weight"].T).view(S, KV, HD)
        v = (h @ d[p + "self_attn.v_proj.weight"].T).view(S, KV, HD)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * HD ** -0.5 + mask
        o = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(S, NH * HD)
        x = x + o @ d[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, d[p + "post_attention_layernorm.weight"])
        gate = h @ d[p + "mlp.gate_proj.weight"].T
        up = h @ d[p + "mlp.up_proj.weight"].T
        x = x + (gelu_tanh(gate) * up) @ d[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, d["model.norm.weight"])
    return x @ d["model.embed_tokens.weight"].T


def save_safetensors(path, tensors):
    dtypes = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        code, np_type = dtypes[t.dtype]
        data = t.numpy().astype(np_type).tobytes()
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header = {"__metadata__": {"format": "pt"}, **header}  # the order Gale writes: metadata, then by name
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def main():
    os.makedirs(OUT, exist_ok=True)
    w = weights()
    ids = torch.randint(0, V, (SEQ,), generator=torch.Generator().manual_seed(1))
    logits = forward(w, ids)
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
    seq = ids.clone()
    for _ in range(5):
        seq = torch.cat([seq, forward(w, seq)[-1].argmax().reshape(1)])
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config(), f, indent=2, sort_keys=True)
        f.write("\n")
    save_safetensors(os.path.join(OUT, "model.safetensors"), w)
    save_safetensors(os.path.join(OUT, "golden.safetensors"),
                     {"tokens": ids.long(), "logits": logits.float(), "loss": loss.float().reshape(1),
                      "greedy": seq[SEQ:].long()})
    # How much the √hidden normalizer and the norms' 1 + w matter (the test's damage checks rely on it).
    print("tokens", ids.tolist(), "greedy", seq[SEQ:].tolist(), "loss", float(loss))


if __name__ == "__main__":
    main()
