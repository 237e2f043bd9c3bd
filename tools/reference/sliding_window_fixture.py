# Golden logits of a tiny Mistral with sliding-window attention (tests/data/hf/mistral_swa/), from
# an independent plain-torch Mistral forward with an explicit [S, S] mask (no transformers needed).
#
#   /tmp/tv/bin/python tools/reference/sliding_window_fixture.py          # writes tests/data/hf/mistral_swa/
#   /tmp/tv/bin/python tools/reference/sliding_window_fixture.py --check  # only checks the reference
#
# The fixture reuses tests/data/hf/mistral's weights (hf_fixture.py's tiny random Mistral: 2 layers,
# hidden 64, 4 heads, 1 KV head, SwiGLU 96, f16 weights) with "sliding_window": 4 in config.json.
# The mask is Hugging Face Mistral's (transformers' masking_utils: causal AND
# sliding_window_overlay, kv_idx > q_idx - W): query i sees keys j with j <= i and i - j < W.
# The reference is first checked against transformers' own logits of tests/data/hf/mistral
# (sliding_window null) so that the forward itself is HF's; then the window is applied.
# golden.safetensors as hf_fixture.py's: tokens [S] i64, logits [S, V] f32, loss [1] f32, greedy
# [5] i64 (greedy decoding with the window, recomputing the whole sequence each step).
import argparse
import json
import os
import shutil
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "hf")
WINDOW = 4

_DT = {"F16": np.float16, "F32": np.float32, "I64": np.int64, "BF16": None}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=_DT[e["dtype"]]).reshape(e["shape"]).copy())
    return out


def write_safetensors(path, tensors):
    names = sorted(tensors)
    header, blobs, off = {}, [], 0
    for name in names:
        a = tensors[name].contiguous().numpy()
        dtype = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64"}[a.dtype]
        raw = a.tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


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


def mistral_logits(w, cfg, tokens, window):
    S = len(tokens)
    H, NH, KV = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    D = cfg.get("head_dim") or H // NH
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    pos = torch.arange(S)
    i, j = pos[:, None], pos[None, :]
    visible = j <= i
    if window is not None:
        visible = visible & (i - j < window)
    x = w["model.embed_tokens.weight"][tokens]
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(S, NH, D).transpose(0, 1)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(S, KV, D).transpose(0, 1)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(S, KV, D).transpose(0, 1)
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
    return x @ w["lm_head.weight"].T


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    src = os.path.join(DATA, "mistral")
    w = {k: v.float() for k, v in read_safetensors(os.path.join(src, "model.safetensors")).items()}
    cfg = json.load(open(os.path.join(src, "config.json")))
    golden = read_safetensors(os.path.join(src, "golden.safetensors"))
    tokens = golden["tokens"]
    # The reference is HF's forward: transformers' logits of the same model without a window.
    diff = (mistral_logits(w, cfg, tokens, None) - golden["logits"]).abs().max().item()
    print(f"no window vs transformers' logits: max |diff| {diff:.2e}")
    assert diff < 2e-5, diff
    logits = mistral_logits(w, cfg, tokens, WINDOW)
    full = mistral_logits(w, cfg, tokens, None)
    print(f"window {WINDOW}: max |logits - no-window logits| {(logits - full).abs().max().item():.3f}")
    # A window of at least S is no window.
    assert (mistral_logits(w, cfg, tokens, len(tokens)) - full).abs().max().item() == 0.0
    if args.check:
        return
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:]).reshape(1)
    seq = tokens.clone()
    for _ in range(5):
        nxt = mistral_logits(w, cfg, seq, WINDOW)[-1].argmax().reshape(1)
        seq = torch.cat([seq, nxt])
    out = os.path.join(DATA, "mistral_swa")
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(src, "model.safetensors"), os.path.join(out, "model.safetensors"))
    cfg["sliding_window"] = WINDOW
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    write_safetensors(os.path.join(out, "golden.safetensors"),
                      {"tokens": tokens, "logits": logits.float(), "loss": loss.float(), "greedy": seq[len(tokens):]})
    print("wrote", out, "greedy", seq[len(tokens):].tolist(), "loss", loss.item())


if __name__ == "__main__":
    main()
