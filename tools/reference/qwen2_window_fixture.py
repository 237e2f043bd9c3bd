# Golden logits of a tiny Qwen2 with a sliding window in only some layers (tests/data/hf/qwen2_swa/),
# from an independent plain-torch Qwen2 forward with an explicit [S, S] mask per layer.
#
#   /tmp/hfgaps_venv/bin/python tools/reference/qwen2_window_fixture.py          # writes tests/data/hf/qwen2_swa/
#   /tmp/hfgaps_venv/bin/python tools/reference/qwen2_window_fixture.py --check  # only checks the reference
#
# (any Python with torch and safetensors). The fixture reuses tests/data/hf/qwen2's weights
# (hf_fixture.py's tiny random Qwen2: 2 layers, hidden 64, 4 heads, 2 KV heads, q/k/v biases, tied,
# bf16) with "use_sliding_window": true, "sliding_window": 4, "max_window_layers": 1: transformers
# >= 4.53's Qwen2Config makes that layer_types ["full_attention", "sliding_attention"] (layer i is
# windowed when i >= max_window_layers), and its sliding layers' mask is causal AND kv_idx > q_idx - W
# (masking_utils' sliding_window_overlay). The reference is first checked against transformers' own
# logits of tests/data/hf/qwen2 (no window) so that the forward is HF's; then the per-layer windows
# are applied. golden.safetensors as hf_fixture.py's (tokens, logits, loss, greedy) plus
# logits_first_sliding [S, V]: the same weights with layer_types ["sliding_attention", "full_attention"].
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "hf")
WINDOW = 4


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta):  # x [H, S, D], rotate-half
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = pos.double()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def qwen2_logits(w, cfg, tokens, windowed):
    """Logits of the Qwen2 `w` on `tokens`; windowed[l]: layer l sees only the WINDOW latest keys."""
    S = len(tokens)
    H, NH, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = H // NH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    pos = torch.arange(S)
    i, j = pos[:, None], pos[None, :]
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        visible = (j <= i) & ((i - j < WINDOW) if windowed[layer] else True)
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        proj = {n: h @ w[p + f"self_attn.{n}_proj.weight"].T + w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"}
        q = proj["q"].view(S, NH, D).transpose(0, 1)
        k = proj["k"].view(S, KV, D).transpose(0, 1)
        v = proj["v"].view(S, KV, D).transpose(0, 1)
        q, k = rope(q, pos, theta), rope(k, pos, theta)
        k = k.repeat_interleave(NH // KV, 0)
        v = v.repeat_interleave(NH // KV, 0)
        scores = (q @ k.transpose(1, 2)) / (D ** 0.5)
        scores = scores.masked_fill(~visible, float("-inf"))
        ctx = (scores.softmax(-1) @ v).transpose(0, 1).reshape(S, NH * D)
        x = x + ctx @ w[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, w["model.norm.weight"], eps)
    return x @ w["model.embed_tokens.weight"].T  # tied


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    src = os.path.join(DATA, "qwen2")
    w = {k: v.float() for k, v in load_file(os.path.join(src, "model.safetensors")).items()}
    cfg = json.load(open(os.path.join(src, "config.json")))
    assert cfg["tie_word_embeddings"] and cfg["num_hidden_layers"] == 2
    golden = load_file(os.path.join(src, "golden.safetensors"))
    tokens = golden["tokens"]
    full = qwen2_logits(w, cfg, tokens, [False, False])
    diff = (full - golden["logits"]).abs().max().item()
    print(f"no window vs transformers' logits: max |diff| {diff:.2e}")
    assert diff < 2e-5, diff
    logits = qwen2_logits(w, cfg, tokens, [False, True])  # max_window_layers 1
    first = qwen2_logits(w, cfg, tokens, [True, False])
    every = qwen2_logits(w, cfg, tokens, [True, True])
    print(f"window {WINDOW} in layer 1: max |logits - no-window| {(logits - full).abs().max().item():.3f}, "
          f"- layer 0 windowed {(logits - first).abs().max().item():.3f}, "
          f"- both windowed {(logits - every).abs().max().item():.3f}")
    if args.check:
        return
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:]).reshape(1)
    seq = tokens.clone()
    for _ in range(5):
        nxt = qwen2_logits(w, cfg, seq, [False, True])[-1].argmax().reshape(1)
        seq = torch.cat([seq, nxt])
    out = os.path.join(DATA, "qwen2_swa")
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(src, "model.safetensors"), os.path.join(out, "model.safetensors"))
    cfg.update({"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1})
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    save_file({"tokens": tokens, "logits": logits.float().contiguous(), "loss": loss.float(),
               "greedy": seq[len(tokens):].contiguous(), "logits_first_sliding": first.float().contiguous()},
              os.path.join(out, "golden.safetensors"), metadata={"format": "pt"})
    print("wrote", out, "greedy", seq[len(tokens):].tolist(), "loss", loss.item())


if __name__ == "__main__":
    main()
