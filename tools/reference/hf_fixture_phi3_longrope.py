# A tiny random Phi-3.5-style Phi3ForCausalLM with rope_scaling longrope, and golden logits from a float64
# plain-torch restatement of transformers' Phi-3 LongRoPE (_compute_longrope_parameters + the dynamic
# longrope update: the factors are picked on every forward from max(position_ids) + 1; no transformers).
#
#   /usr/bin/python3 tools/reference/hf_fixture_phi3_longrope.py     # writes tests/data/hf/phi3_longrope/
#
# The phi3 fixture's shapes and layout (hf_fixture_internlm2_phi3.py: 2 layers, hidden 64, 4 heads of 16,
# 2 key/value heads, SwiGLU 96, vocabulary 100) without a sliding window, max_position_embeddings 64 and
# original_max_position_embeddings 8: 8 rotary pairs, short_factor / long_factor of 8 numbers each, the
# attention factor sqrt(1 + ln(64 / 8) / ln 8) = sqrt(2) on cos and sin.
# golden.safetensors:
#   tokens [12] i64, logits [12, 100] f32, loss [1] f32: the 12-token sequence (12 > 8: long factors);
#   logits_short [8, 100] f32: its first 8 tokens alone (8 <= 8: short factors);
#   greedy [5] i64: greedy decoding recomputing the whole sequence each step (long factors throughout);
#   cached_logits [6, 100] f32, cached_greedy [6] i64: greedy decoding with a KV cache from the 5-token
#     prompt tokens[:5] as transformers runs it: the prompt and the steps at total length <= 8 use the short
#     factors, the later ones the long factors, and the cached keys keep the rotation they were stored with.
import math
import os

import torch

import hf_fixture_internlm2_phi3 as base

H, NH, KV, D, F, V, L = base.H, base.NH, base.KV, base.D, base.F, base.V, base.L
ORIGINAL, MAX_POS = 8, 64
SHORT = [1.0, 1.0199999809265137, 1.1, 1.25, 1.5, 2.0, 2.75, 3.5]
LONG = [1.0800000429153442, 1.15, 1.4, 2.0, 3.0, 5.5, 9.0, 14.0]

CONFIG = dict(base.PHI3_CONFIG, max_position_embeddings=MAX_POS, original_max_position_embeddings=ORIGINAL,
              sliding_window=None,
              rope_scaling={"long_factor": LONG, "short_factor": SHORT, "type": "longrope"})


def attention_factor(cfg):
    scale = cfg["max_position_embeddings"] / cfg["original_max_position_embeddings"]
    if scale <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale) / math.log(cfg["original_max_position_embeddings"]))


def longrope(x, pos, cfg, seq_len):  # x [heads, n, D]; factors by seq_len = max(position_ids) + 1
    rs = cfg["rope_scaling"]
    ext = torch.tensor(rs["long_factor"] if seq_len > cfg["original_max_position_embeddings"] else rs["short_factor"],
                       dtype=torch.float64)
    inv = 1.0 / (ext * cfg["rope_theta"] ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = pos[:, None] * inv[None, :]
    m = attention_factor(cfg)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1) * m, torch.cat([ang.sin(), ang.sin()], -1) * m
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def layer_qkv(w, p, x, pos, cfg, seq_len):
    n = x.shape[0]
    h = base.rms_norm(x, w[p + "input_layernorm.weight"])
    qkv = h @ w[p + "self_attn.qkv_proj.weight"].T
    q = qkv[:, : NH * D].view(n, NH, D).transpose(0, 1)
    k = qkv[:, NH * D: (NH + KV) * D].view(n, KV, D).transpose(0, 1)
    v = qkv[:, (NH + KV) * D:].view(n, KV, D).transpose(0, 1)
    return longrope(q, pos, cfg, seq_len), longrope(k, pos, cfg, seq_len), v


def attend(q, k, v, first):  # queries at positions first.., keys 0..; causal
    n, m = q.shape[1], k.shape[1]
    i, j = torch.arange(first, first + n)[:, None], torch.arange(m)[None, :]
    k, v = k.repeat_interleave(NH // KV, 0), v.repeat_interleave(NH // KV, 0)
    scores = ((q @ k.transpose(1, 2)) / (D ** 0.5)).masked_fill(~(j <= i), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, NH * D)


def mlp(w, p, x):
    h = base.rms_norm(x, w[p + "post_attention_layernorm.weight"])
    gate, up = (h @ w[p + "mlp.gate_up_proj.weight"].T).chunk(2, dim=-1)
    return (up * torch.nn.functional.silu(gate)) @ w[p + "mlp.down_proj.weight"].T


def forward(w, cfg, tokens, cache=None):
    """Logits of `tokens` following the cache's positions; the cache (a list of per-layer [k, v]) grows."""
    first = 0 if cache is None or not cache else cache[0][0].shape[1]
    n = len(tokens)
    pos = torch.arange(first, first + n, dtype=torch.float64)
    seq_len = first + n  # max(position_ids) + 1
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(L):
        p = f"model.layers.{layer}."
        q, k, v = layer_qkv(w, p, x, pos, cfg, seq_len)
        if cache is not None:
            if len(cache) <= layer:
                cache.append([k, v])
            else:
                cache[layer] = [torch.cat([cache[layer][0], k], 1), torch.cat([cache[layer][1], v], 1)]
            k, v = cache[layer]
        x = x + attend(q, k, v, first) @ w[p + "self_attn.o_proj.weight"].T
        x = x + mlp(w, p, x)
    return base.rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def main():
    g = torch.Generator().manual_seed(20240611)
    tokens = torch.randint(0, V, (base.S,), generator=g)
    base.internlm2_weights(g)  # the same draws as the phi3 fixture: its weights
    weights = base.phi3_weights(g)
    w64, logits = base.write_fixture("phi3_longrope", CONFIG, weights, lambda w, c, t: forward(w, c, t), tokens)
    logits_short = forward(w64, CONFIG, tokens[:ORIGINAL])
    # Self-checks: the 12 tokens use the long factors, the first 8 the short ones (they differ from the
    # 12-token run's first 8 rows), and plain RoPE (factors 1, no attention factor) is something else.
    assert (logits_short - logits[:ORIGINAL]).abs().max() > 1e-2
    swapped = dict(CONFIG, rope_scaling=dict(CONFIG["rope_scaling"], long_factor=SHORT))
    assert (forward(w64, swapped, tokens)[:ORIGINAL] - logits_short).abs().max() < 1e-12
    plain = dict(CONFIG, max_position_embeddings=ORIGINAL,
                 rope_scaling=dict(CONFIG["rope_scaling"], long_factor=[1.0] * 8, short_factor=[1.0] * 8))
    assert (forward(w64, plain, tokens) - base.phi3_logits(w64, dict(base.PHI3_CONFIG, sliding_window=None),
                                                          tokens)).abs().max() < 1e-12
    # KV-cache greedy decoding across the original context (the prompt: tokens[:5]).
    cache, step_logits, out = [], [], []
    nxt = forward(w64, CONFIG, tokens[:5], cache)[-1]
    for _ in range(6):
        step_logits.append(nxt)
        out.append(int(nxt.argmax()))
        nxt = forward(w64, CONFIG, torch.tensor([out[-1]]), cache)[-1]
    recomputed = tokens[:5].clone()  # the same steps recomputing the whole sequence: past 8 tokens they differ
    rec_logits = []
    for t in out:
        rec_logits.append(forward(w64, CONFIG, recomputed)[-1])
        recomputed = torch.cat([recomputed, torch.tensor([t])])
    assert max((a - b).abs().max() for a, b in zip(step_logits[:4], rec_logits[:4])) < 1e-10
    assert (step_logits[5] - rec_logits[5]).abs().max() > 1e-3
    golden = os.path.join(base.DATA, "phi3_longrope", "golden.safetensors")
    seq = tokens.clone()
    for _ in range(5):
        seq = torch.cat([seq, forward(w64, CONFIG, seq)[-1].argmax().reshape(1)])
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:]).reshape(1)
    base.write_safetensors(golden, {"tokens": tokens, "logits": logits.float(), "loss": loss.float(),
                                    "greedy": seq[len(tokens):], "logits_short": logits_short.float(),
                                    "cached_logits": torch.stack(step_logits).float(),
                                    "cached_greedy": torch.tensor(out, dtype=torch.int64)})
    print("cached greedy", out, "attention factor", attention_factor(CONFIG))


if __name__ == "__main__":
    main()
