# The tiny Gemma2ForCausalLM fixture (tests/data/hf/gemma2) for `gale convert`, without transformers:
# Gemma-2's forward written out in torch (1.13 is enough) from transformers' modeling_gemma2 (eager).
#
#   /usr/bin/python3 tools/reference/hf_fixture_gemma2.py           # writes tests/data/hf/gemma2/
#   /usr/bin/python3 tools/reference/hf_fixture_gemma2.py --gemma3  # writes tests/data/hf/gemma3/
#
# --gemma3: Gemma3ForCausalLM's text model (model_type gemma3_text) the same way, from modeling_gemma3:
# Gemma-2's layer plus q_norm / k_norm (Gemma3RMSNorm, 1 + w, over head_dim, on every query / key head
# before RoPE), sliding layers from sliding_window_pattern P (layer i full iff (i + 1) % P == 0; here P = 3:
# sliding, sliding, full), no soft-caps (Gemma3TextConfig's null), and one RoPE base for all layers
# (rope_local_base_freq = rope_theta: what Gale reads).
#
# Gemma-2 as transformers runs it (Gemma2ForCausalLM, eager attention, fp32):
#   x = embed_tokens[ids] * normalizer,  normalizer = torch.tensor(hidden_size ** 0.5, dtype=x.dtype)
#   per layer i:
#     x += post_attention_layernorm(o_proj(attention_i(input_layernorm(x))))
#     x += post_feedforward_layernorm(down(act(gate(h)) * up(h))),  h = pre_feedforward_layernorm(x)
#   RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * (1 + w)        (Gemma2RMSNorm: w stored zero-centred)
#   attention: RoPE rotate-half (rope_theta, head_dim), scores q.k * query_pre_attn_scalar^-0.5, then
#     attn_logit_softcapping C: C * tanh(s / C), then the causal mask; in the sliding layers (transformers:
#     layer_idx % 2 == 0, i.e. 0, 2, 4, ...; layer_types "sliding_attention") also the keys j <= i - W
#     hidden (torch.tril(ones, diagonal=-sliding_window)): each query sees its last W positions
#   logits = final_logit_softcapping F: F * tanh((norm(x) @ embed_tokens^T) / F)   (tied embeddings)
# Sizes: vocab 100, hidden 64, intermediate 96, 3 layers (sliding, full, sliding), 4 heads with 2
# key/value heads, head_dim 24 (not hidden / heads = 16), query_pre_attn_scalar 20 (neither),
# sliding_window 4 over 12 tokens, caps 4.0 (attention) and 2.5 (logits), small enough that each
# changes the logits far beyond the test's tolerance. The weights are random and far from an init (norm
# weights zero-centred with spread 0.3, the four per-layer norms different), stored in float32 so that
# the Gale -> HF round trip is bit-exact. The forward runs in float64 on those float32 values. Writes
# what save_pretrained would (config.json, model.safetensors, in the order Gale writes safetensors) and
# golden.safetensors in tools/reference/hf_fixture.py's layout: tokens [12] i64, logits [12, 100] f32,
# loss [1] f32 (mean causal-LM loss), greedy [5] i64 (argmax decoding appended to the tokens).
import json
import math
import os
import struct
import sys

import torch

GEMMA3 = "--gemma3" in sys.argv
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf",
                   "gemma3" if GEMMA3 else "gemma2")
V, H, F, L, NH, KV, HD = 100, 64, 96, 3, 4, 2, 24
EPS, THETA, SEQ = 1e-6, 10000.0, 12
SCALAR, WINDOW, ATTN_CAP, FINAL_CAP = 20, 4, 4.0, 2.5
PATTERN = 3  # Gemma-3's sliding_window_pattern
if GEMMA3:
    ATTN_CAP = FINAL_CAP = None
NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


def config():
    if GEMMA3:
        c = config2()
        c.update({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "sliding_window_pattern": PATTERN,
                  "rope_local_base_freq": THETA, "transformers_version": "4.50.0"})
        return c
    return config2()


def config2():
    return {
        "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "vocab_size": V, "hidden_size": H,
        "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH, "num_key_value_heads": KV,
        "head_dim": HD, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 64, "rms_norm_eps": EPS, "rope_theta": THETA, "attention_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": True, "initializer_range": 0.02,
        "query_pre_attn_scalar": SCALAR, "sliding_window": WINDOW, "attn_logit_softcapping": ATTN_CAP,
        "final_logit_softcapping": FINAL_CAP, "cache_implementation": "hybrid",
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "use_cache": True, "torch_dtype": "float32",
        "transformers_version": "4.44.2",
    }


def weights():
    g = torch.Generator().manual_seed(15 if GEMMA3 else 7)
    w = {}

    def rnd(name, shape, scale):
        w[name] = (scale * torch.randn(shape, generator=g)).float()

    rnd("model.embed_tokens.weight", (V, H), 0.15)
    for i in range(L):
        p = f"model.layers.{i}."
        for n in NORMS:
            rnd(p + n + ".weight", (H,), 0.3)
        for n in ("post_attention_layernorm", "post_feedforward_layernorm"):  # 1 + w about 2: the layers, not
            w[p + n + ".weight"] += 1.0  # the tied √H-scaled embedding, decide the next token
        rnd(p + "self_attn.q_proj.weight", (NH * HD, H), 0.2)
        rnd(p + "self_attn.k_proj.weight", (KV * HD, H), 0.2)
        rnd(p + "self_attn.v_proj.weight", (KV * HD, H), 0.15)
        rnd(p + "self_attn.o_proj.weight", (H, NH * HD), 0.15)
        if GEMMA3:
            rnd(p + "self_attn.q_norm.weight", (HD,), 0.3)
            rnd(p + "self_attn.k_norm.weight", (HD,), 0.3)
        rnd(p + "mlp.gate_proj.weight", (F, H), 0.15)
        rnd(p + "mlp.up_proj.weight", (F, H), 0.15)
        rnd(p + "mlp.down_proj.weight", (H, F), 0.15)
    rnd("model.norm.weight", (H,), 0.3)
    return w


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


# `variant` switches one Gemma-2 piece off or moves it, to show the golden depends on it.
def forward(w, ids, variant=""):
    d = {k: v.double() for k, v in w.items()}
    S = ids.numel()
    x = d["model.embed_tokens.weight"][ids] * torch.tensor(H ** 0.5, dtype=torch.float32).double()
    inv_freq = 1.0 / (THETA ** (torch.arange(0, HD, 2, dtype=torch.int64).double() / HD))
    freqs = torch.arange(S).double()[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
    causal = torch.full((S, S), float("-inf"), dtype=torch.float64).triu(1)
    far = torch.ones(S, S, dtype=torch.bool).tril(-WINDOW)
    sliding_parity = 1 if variant == "odd_sliding" else 0
    for i in range(L):
        p = f"model.layers.{i}."
        if GEMMA3:
            sliding = ((i + 1) % PATTERN != 0) != (variant == "odd_sliding")
        else:
            sliding = i % 2 == sliding_parity
        mask = causal.masked_fill(far, float("-inf")) if sliding else causal
        h = rms_norm(x, d[p + "input_layernorm.weight"])
        q = (h @ d[p + "self_attn.q_proj.weight"].T).view(S, NH, HD)
        k = (h @ d[p + "self_attn.k_proj.weight"].T).view(S, KV, HD)
        v = (h @ d[p + "self_attn.v_proj.weight"].T).view(S, KV, HD)
        if GEMMA3 and variant != "no_qk_norm":
            q = rms_norm(q, d[p + "self_attn.q_norm.weight"])
            k = rms_norm(k, d[p + "self_attn.k_norm.weight"])
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(NH // KV, dim=1)
        v = v.repeat_interleave(NH // KV, dim=1)
        scale = HD ** -0.5 if variant == "head_dim_scale" else SCALAR ** -0.5
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if ATTN_CAP is not None and variant != "no_attn_cap":
            scores = ATTN_CAP * torch.tanh(scores / ATTN_CAP)
        o = torch.einsum("hqk,khd->qhd", (scores + mask).softmax(-1), v).reshape(S, NH * HD)
        a = o @ d[p + "self_attn.o_proj.weight"].T
        post_attn, pre_mlp = "post_attention_layernorm", "pre_feedforward_layernorm"
        if variant == "swap_norms":
            post_attn, pre_mlp = pre_mlp, post_attn
        x = x + rms_norm(a, d[p + post_attn + ".weight"])
        h = rms_norm(x, d[p + pre_mlp + ".weight"])
        m = (gelu_tanh(h @ d[p + "mlp.gate_proj.weight"].T) * (h @ d[p + "mlp.up_proj.weight"].T)) @ \
            d[p + "mlp.down_proj.weight"].T
        x = x + rms_norm(m, d[p + "post_feedforward_layernorm.weight"])
    logits = rms_norm(x, d["model.norm.weight"]) @ d["model.embed_tokens.weight"].T
    return logits if FINAL_CAP is None or variant == "no_final_cap" else FINAL_CAP * torch.tanh(logits / FINAL_CAP)


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
    ids = torch.randint(0, V, (SEQ,), generator=torch.Generator().manual_seed(3))
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
    print("tokens", ids.tolist(), "greedy", seq[SEQ:].tolist(), "loss", float(loss))
    # How far each Gemma-2 piece moves the logits (the test's damage checks rely on these).
    variants = ("odd_sliding", "head_dim_scale", "swap_norms", "no_qk_norm") if GEMMA3 else \
        ("odd_sliding", "head_dim_scale", "no_attn_cap", "swap_norms", "no_final_cap")
    for variant in variants:
        print(variant, float((forward(w, ids, variant) - logits).abs().max()))
    print("logit range", float(logits.min()), float(logits.max()))


if __name__ == "__main__":
    main()
