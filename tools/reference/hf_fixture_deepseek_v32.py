#!/usr/bin/python3
"""The tiny DeepseekV32ForCausalLM fixture of `gale convert` (tests/data/hf/deepseek_v32), torch 1.13 only.

    /usr/bin/python3 tools/reference/hf_fixture_deepseek_v32.py                  # writes the fixture
    /usr/bin/python3 tools/reference/hf_fixture_deepseek_v32.py --check-export DIR  # DIR from
        `gale convert --save-model-type hf`: this model's logits of DIR vs the fixture's (exit 1 above 1e-4)

No transformers here: an independent float64 restatement of transformers' DeepseekV32 (DeepSeek-V3's
dense layers + the DSA lightning indexer), written from its published math:
  MLA       q = q_b_proj(RMSNorm(q_a_proj(x))) per head [nope | rope], latent = kv_a_proj_with_mqa(x) =
            [c | k_rope], kv_b_proj(RMSNorm(c)) per head [k_nope | v]; RoPE on q_rope / k_rope in
            DeepSeek's interleaved layout (pairs (2i, 2i+1)), softmax scale (nope + rope)^-1/2
  indexer   q_I = wq_b(qr) (qr = the normed query latent), k_I = LayerNorm_eps1e-6(wk(x)), each head's
            first qk_rope_head_dim dims rotated in the rotate-half (NOT interleaved) layout;
            I[i, j] = sum_h weights_proj(x)[i, h] * NI^-1/2 * DI^-1/2 * relu(q_I[i, h] . k_I[j]) over j <= i;
            each query attends to its index_topk best keys only (DeepSeek's Hadamard rotation leaves
            q.k unchanged; its fp8 rounding is left out, as transformers does)
  MLP       down(silu(gate(x)) * up(x)); RMSNorm eps rms_norm_eps; untied lm_head.
Writes config.json, model.safetensors and golden.safetensors (tokens [12] i64, logits [12, V] f32,
loss [1] f32, greedy [5] i64: the tokens greedy decoding appends, each step rerunning the sequence),
with a plain-Python safetensors writer. ReLU makes exact ties of index scores common (keys no head
scores above 0); transformers' torch.topk breaks them arbitrarily, Gale (and this script) by the
earlier key, so the script takes the first weight seed whose runs have no top-k boundary within 1e-3. The script checks that the top-k selection changes the logits
(a dense model gives others), so a converter that lost the indexer would miss them. The MLA part,
run without the indexer on tests/data/hf/deepseek_v3_dense (transformers 4.51.3's DeepseekV3), gives
that fixture's logits within 1e-5 (checked when writing).
"""
import argparse
import json
import os
import struct
import sys

import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf", "deepseek_v32")
SEQ = 12
CONFIG = {
    "architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": 100,
    "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 12, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 6, "first_k_dense_replace": 2, "hidden_act": "silu",
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": None,
    "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
    "num_nextn_predict_layers": 0, "index_n_heads": 4, "index_head_dim": 8, "index_topk": 5,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
}


def shapes(c):
    H, NH, Cq, Ckv = c["hidden_size"], c["num_attention_heads"], c["q_lora_rank"], c["kv_lora_rank"]
    Dn, R, Dv, F = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["intermediate_size"]
    NI, DI, V = c["index_n_heads"], c["index_head_dim"], c["vocab_size"]
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_a_proj.weight": (Cq, H), p + "self_attn.q_a_layernorm.weight": (Cq,),
            p + "self_attn.q_b_proj.weight": (NH * (Dn + R), Cq),
            p + "self_attn.kv_a_proj_with_mqa.weight": (Ckv + R, H), p + "self_attn.kv_a_layernorm.weight": (Ckv,),
            p + "self_attn.kv_b_proj.weight": (NH * (Dn + Dv), Ckv), p + "self_attn.o_proj.weight": (H, NH * Dv),
            p + "self_attn.indexer.wq_b.weight": (NI * DI, Cq), p + "self_attn.indexer.wk.weight": (DI, H),
            p + "self_attn.indexer.k_norm.weight": (DI,), p + "self_attn.indexer.k_norm.bias": (DI,),
            p + "self_attn.indexer.weights_proj.weight": (NI, H),
            p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H), p + "mlp.down_proj.weight": (H, F),
        })
    return out


def random_weights(c, seed=32):
    g = torch.Generator().manual_seed(seed)
    w = {}
    for name, shape in sorted(shapes(c).items()):
        noise = torch.randn(shape, generator=g, dtype=torch.float64)
        if name.endswith("bias"):
            w[name] = 0.2 * noise
        elif len(shape) == 1:
            w[name] = 1.0 + 0.2 * noise
        else:
            w[name] = 0.15 * noise
    return w


def rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(c, S):
    R = c["qk_rope_head_dim"]
    inv = 1.0 / (c["rope_theta"] ** (torch.arange(0, R, 2, dtype=torch.float64) / R))
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv[None, :]  # [S, R/2]
    return torch.cos(ang), torch.sin(ang)


def rope_interleaved(x, cos, sin):  # x [..., S, R]: pairs (2i, 2i+1) rotated by angle i
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def rope_half(x, cos, sin):  # x [..., S, R]: dims (i, i + R/2) rotated by angle i
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


MIN_GAP = float("inf")  # the smallest gap at a top-k boundary seen by indexer_mask


def indexer_mask(c, w, p, x, qr, cos, sin, sparse):
    S = x.shape[0]
    causal = torch.tril(torch.ones(S, S, dtype=torch.bool))
    if not sparse:
        return causal
    NI, DI, R, K = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"], c["index_topk"]
    q = (qr @ w[p + "indexer.wq_b.weight"].T).view(S, NI, DI).transpose(0, 1)  # [NI, S, DI]
    k = torch.nn.functional.layer_norm(x @ w[p + "indexer.wk.weight"].T, (DI,), w[p + "indexer.k_norm.weight"],
                                       w[p + "indexer.k_norm.bias"], 1e-6)  # [S, DI]
    q = torch.cat([rope_half(q[..., :R], cos, sin), q[..., R:]], dim=-1)
    k = torch.cat([rope_half(k[..., :R], cos, sin), k[..., R:]], dim=-1)
    weights = (x @ w[p + "indexer.weights_proj.weight"].T) * NI ** -0.5 * DI ** -0.5  # [S, NI]
    scores = torch.relu(torch.einsum("hid,jd->hij", q, k))  # [NI, S, S]
    index = torch.einsum("ih,hij->ij", weights, scores).masked_fill(~causal, float("-inf"))
    chosen = torch.zeros(S, S, dtype=torch.bool)
    global MIN_GAP
    for i in range(S):
        row = index[i, : i + 1].tolist()
        order = sorted(range(i + 1), key=lambda j: (-row[j], j))  # ties: the earlier key (as Gale)
        chosen[i, order[:K]] = True
        if i + 1 > K:  # how close the K-th best is to the next: torch.topk breaks ties arbitrarily
            MIN_GAP = min(MIN_GAP, row[order[K - 1]] - row[order[K]])
    return chosen & causal


def forward(c, w, tokens, sparse=True):
    S = tokens.numel()
    H, NH, Ckv = c["hidden_size"], c["num_attention_heads"], c["kv_lora_rank"]
    Dn, R, Dv, eps = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["rms_norm_eps"]
    cos, sin = rope_tables(c, S)
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.self_attn."
        x = rms(h, w[f"model.layers.{i}.input_layernorm.weight"], eps)
        qr = rms(x @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], eps)
        q = (qr @ w[p + "q_b_proj.weight"].T).view(S, NH, Dn + R).transpose(0, 1)  # [NH, S, Dn + R]
        kv = x @ w[p + "kv_a_proj_with_mqa.weight"].T
        latent, k_rope = kv[:, :Ckv], kv[:, Ckv:]
        kvu = (rms(latent, w[p + "kv_a_layernorm.weight"], eps) @ w[p + "kv_b_proj.weight"].T).view(S, NH, Dn + Dv)
        k_nope, v = kvu[..., :Dn].transpose(0, 1), kvu[..., Dn:].transpose(0, 1)
        q_rope = rope_interleaved(q[..., Dn:], cos, sin)
        k_rope = rope_interleaved(k_rope, cos, sin).unsqueeze(0).expand(NH, S, R)
        qq = torch.cat([q[..., :Dn], q_rope], dim=-1)
        kk = torch.cat([k_nope, k_rope], dim=-1)
        mask = indexer_mask(c, w, p, x, qr, cos, sin, sparse)
        logits = (qq @ kk.transpose(1, 2)) * (Dn + R) ** -0.5
        att = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1) @ v  # [NH, S, Dv]
        h = h + att.transpose(0, 1).reshape(S, NH * Dv) @ w[p + "o_proj.weight"].T
        m = f"model.layers.{i}.mlp."
        y = rms(h, w[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        act = torch.nn.functional.silu(y @ w[m + "gate_proj.weight"].T) * (y @ w[m + "up_proj.weight"].T)
        h = h + act @ w[m + "down_proj.weight"].T
    return rms(h, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


DTYPES = {torch.float32: ("F32", "f"), torch.int64: ("I64", "q")}


def save_safetensors(tensors, path):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        code, fmt = DTYPES[t.dtype]
        data = struct.pack(f"<{t.numel()}{fmt}", *t.contiguous().view(-1).tolist())
        header[name] = {"dtype": code, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        b, e = meta["data_offsets"]
        fmt = {"F32": "f", "I64": "q", "BF16": None}[meta["dtype"]]
        if fmt is None:  # bf16: the high halves of fp32
            raw = struct.unpack(f"<{(e - b) // 2}H", body[b:e])
            vals = [struct.unpack("<f", struct.pack("<I", r << 16))[0] for r in raw]
        else:
            vals = struct.unpack(f"<{(e - b) // struct.calcsize(fmt)}{fmt}", body[b:e])
        out[name] = torch.tensor(vals, dtype=torch.float64).view(meta["shape"])
    return out


def golden(c, w, tokens):
    logits = forward(c, w, tokens)
    loss = torch.nn.functional.cross_entropy(logits[:-1], tokens[1:])
    ids = tokens.clone()
    for _ in range(5):
        ids = torch.cat([ids, forward(c, w, ids)[-1].argmax().reshape(1)])
    return logits, loss, ids[tokens.numel():]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check-export", help="a directory written by `gale convert --save-model-type hf`")
    a = ap.parse_args()
    tokens = torch.randint(0, CONFIG["vocab_size"], (SEQ,), generator=torch.Generator().manual_seed(7))
    if a.check_export:
        c = json.load(open(os.path.join(a.check_export, "config.json")))
        w = load_safetensors(os.path.join(a.check_export, "model.safetensors"))
        g = load_safetensors(os.path.join(OUT, "golden.safetensors"))
        diff = (forward(c, w, tokens) - g["logits"]).abs().max().item()
        print(f"max |logits - golden| = {diff:.3g}")
        sys.exit(0 if diff <= 1e-4 else 1)
    dense_dir = os.path.join(OUT, "..", "deepseek_v3_dense")
    v3 = load_safetensors(os.path.join(dense_dir, "golden.safetensors"))
    v3_logits = forward(json.load(open(os.path.join(dense_dir, "config.json"))),
                        load_safetensors(os.path.join(dense_dir, "model.safetensors")), v3["tokens"].long(), sparse=False)
    assert (v3_logits - v3["logits"]).abs().max() < 1e-5, "MLA disagrees with transformers' DeepseekV3"
    c = CONFIG
    global MIN_GAP
    for seed in range(32, 132):  # the first weights without a near-tie at any top-k boundary
        MIN_GAP = float("inf")
        w = {k: v.float().double() for k, v in random_weights(c, seed).items()}  # the stored fp32 values
        logits, loss, greedy = golden(c, w, tokens)
        if MIN_GAP > 1e-3:
            break
    assert MIN_GAP > 1e-3, "no seed without top-k near-ties"
    dense = forward(c, w, tokens, sparse=False)
    assert (dense - logits).abs().max() > 1e-2, "the top-k selection must change the logits"
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
        f.write("\n")
    save_safetensors({k: v.float() for k, v in w.items()}, os.path.join(OUT, "model.safetensors"))
    save_safetensors({"tokens": tokens.to(torch.int64), "logits": logits.float(), "loss": loss.float().reshape(1),
                      "greedy": greedy.to(torch.int64)}, os.path.join(OUT, "golden.safetensors"))
    print(f"deepseek_v32: seed {seed}, smallest top-k gap {MIN_GAP:.4f}, loss {loss.item():.6f}, |dense - sparse| {(dense - logits).abs().max().item():.3f}, "
          f"greedy {greedy.tolist()}")


if __name__ == "__main__":
    main()
