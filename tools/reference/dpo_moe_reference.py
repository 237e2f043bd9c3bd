#!/usr/bin/env python3
"""Independent float64 numpy reference of offline DPO on an MoE model: writes tests/data/golden/dpo_mixtral/.

The policy is the committed "mixtral" golden model (tests/data/golden/mixtral/weights.safetensors:
2 layers, 4 experts, top-2, RMSNorm, RoPE, GQA, SwiGLU, untied output layer); the frozen reference
model is the same weights plus small seeded noise, rounded to bfloat16 (stored as float32, which
holds those values exactly). The model's forward pass is written here again in numpy from
docs/model.md (not shared with gpt_reference.py, which is torch), and checked first against the
mixtral golden's own forward (its first micro-batch's loss and auxiliary losses, computed by torch).

One micro-batch holds 2 preference pairs: rows 0-1 the chosen sequences, rows 2-3 the rejected ones
(MindSpeed-LLM's pairwise collator order), tokens / next-token labels / a loss mask that is 1 only
on response labels / positions 0..S-1, right padding with id 0 and mask 0. DPO as MindSpeed-LLM's
DPOTrainer: sequence log-probabilities are sums of log_softmax(logits)[label] over the masked labels
(ipo: divided by the label count); x = (pc - pr) - (rc - rr); sigmoid: -(1-e) logsigmoid(b x) -
e logsigmoid(-b x); hinge: relu(1 - b x); ipo: (x - 1/(2b))^2; plus pref_ftx * (-pc / nc); the
micro-batch loss is the mean over the pairs; rewards b (pc - rc), b (pr - rr); accuracy: the share
of pairs whose chosen reward is larger. The policy's MoE auxiliary losses of this micro-batch (its
2n rows together: Megatron's router sees the policy's chosen and rejected tokens at once) are
written too; the reference model runs in evaluation mode and has none.

Written:
  reference_weights.safetensors  the reference model (bf16 values as float32)
  inputs.safetensors             tokens, labels, position_ids (int64), loss_mask (f32) [4, S]
  fixture.json                   per configuration: options, loss, accuracy, rewards, log-probs; the
                                 policy's load-balancing and z-losses per layer (no coefficients);
                                 the smallest top-k routing margin of either model

Usage: /tmp/venv_dpo/bin/python tools/reference/dpo_moe_reference.py   (numpy 2.4.6, safetensors 0.8.0; PyPI)
Deterministic: rerunning reproduces the committed files.
"""
import json
import math
import os

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data", "golden"))
OUT = os.path.join(GOLDEN, "dpo_mixtral")
PAIRS = [(4, 5, 8), (6, 7, 3)]  # (prompt, chosen response, rejected response) lengths in tokens
CONFIGS = [
    dict(name="sigmoid_smoothed_ftx", loss_type="sigmoid", beta=0.5, label_smoothing=0.1, pref_ftx=0.2),
    dict(name="sigmoid", loss_type="sigmoid", beta=0.1, label_smoothing=0.0, pref_ftx=0.0),
    dict(name="hinge", loss_type="hinge", beta=0.5, label_smoothing=0.0, pref_ftx=0.0),
    dict(name="ipo_ftx", loss_type="ipo", beta=0.5, label_smoothing=0.0, pref_ftx=0.3),
]


def load_file(path):
    """A safetensors file as float64 / int64 numpy arrays (bfloat16 widened exactly; numpy has no bf16)."""
    raw = open(path, "rb").read()
    size = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + size])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        begin, end = e["data_offsets"]
        data = raw[8 + size + begin:8 + size + end]
        if e["dtype"] == "BF16":
            a = (np.frombuffer(data, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = np.frombuffer(data, dtype={"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32}[e["dtype"]])
        out[name] = a.reshape(e["shape"]).astype(np.int64 if e["dtype"].startswith("I") else np.float64)
    return out


def bf16(a):
    """Round float64 values to the nearest bfloat16 (ties to even), returned as float64."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def logsumexp(x):
    m = x.max(-1, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0]


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rotate(x, positions, base):
    """Rotate-half RoPE on every head dimension. x: [B, S, heads, HD], positions [B, S]."""
    HD = x.shape[-1]
    inv = base ** (-2.0 * np.arange(HD // 2) / HD)
    ang = positions[..., None].astype(np.float64) * inv  # [B, S, HD/2]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, :, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, :, None, :]
    half = np.concatenate([-x[..., HD // 2:], x[..., : HD // 2]], -1)
    return x * cos + half * sin


def swiglu_mlp(x, w1, w2):
    u = x @ w1.T
    f = u.shape[-1] // 2
    a, b = u[..., :f], u[..., f:]
    return (a / (1.0 + np.exp(-a)) * b) @ w2.T


def forward(p, m, tokens, positions, aux):
    """[B, S] ids -> logits [B, S, V]; appends each MoE layer's (load balancing, z) and routing margin to aux."""
    B, S = tokens.shape
    NH, KV, HD, E, k = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"], m["num_experts"], m["moe_router_topk"]
    g = NH // KV
    eps = m["norm_epsilon"]
    x = p["embedding.word_embeddings.weight"][tokens]
    causal = np.tril(np.ones((S, S), dtype=bool))
    for i in range(m["num_layers"]):
        pre = f"decoder.layers.{i}."
        a = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        qkv = (a @ p[pre + "self_attention.linear_qkv.weight"].T).reshape(B, S, KV, g + 2, HD)
        q = rotate(qkv[:, :, :, :g, :].reshape(B, S, NH, HD), positions, m["rotary_base"])
        kk = np.repeat(rotate(qkv[:, :, :, g, :], positions, m["rotary_base"]), g, axis=2)
        v = np.repeat(qkv[:, :, :, g + 1, :], g, axis=2)
        s = np.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(HD)
        s = np.where(causal[None, None], s, -np.inf)
        ctx = np.einsum("bhqk,bkhd->bqhd", softmax(s), v).reshape(B, S, NH * HD)
        x = x + ctx @ p[pre + "self_attention.linear_proj.weight"].T
        h = rms_norm(x, p[pre + "pre_mlp_layernorm.weight"], eps).reshape(B * S, -1)
        T = h.shape[0]
        logits = h @ p[pre + "mlp.router.weight"].T  # [T, E]
        order = np.argsort(-logits, axis=-1, kind="stable")
        top = order[:, :k]
        top_logits = np.take_along_axis(logits, top, -1)
        ranked = np.take_along_axis(logits, order, -1)
        aux.setdefault("margin", []).append(float((ranked[:, k - 1] - ranked[:, k]).min()))
        gates = np.zeros((T, E))
        np.put_along_axis(gates, top, softmax(top_logits), -1)
        y = np.zeros_like(h)
        for e in range(E):
            q_ = pre + f"mlp.experts.local_experts.{e}."
            y += gates[:, e:e + 1] * swiglu_mlp(h, p[q_ + "linear_fc1.weight"], p[q_ + "linear_fc2.weight"])
        routed = np.zeros((T, E))
        np.put_along_axis(routed, top, 1.0, -1)
        aux.setdefault("load_balancing", []).append(
            float(E / (T * T * k) * (softmax(logits).sum(0) * routed.sum(0)).sum()))
        aux.setdefault("z", []).append(float((logsumexp(logits) ** 2).mean()))
        x = x + y.reshape(B, S, -1)
    x = rms_norm(x, p["decoder.final_layernorm.weight"], eps)
    return x @ p["output_layer.weight"].T


def token_losses(logits, labels):
    return logsumexp(logits) - np.take_along_axis(logits, labels[..., None], -1)[..., 0]


def check_against_the_mixtral_golden(p, m):
    """This forward reproduces the torch reference's first micro-batch of the mixtral golden."""
    fixture = json.load(open(os.path.join(GOLDEN, "mixtral", "fixture.json")))
    inputs = load_file(os.path.join(GOLDEN, "mixtral", "inputs.safetensors"))
    f = fixture["forward"]
    it, mb = f["iteration"], f["micro_batch"]
    tok = inputs["tokens"][it, mb].astype(np.int64)
    lab = inputs["labels"][it, mb].astype(np.int64)
    mask = inputs["loss_mask"][it, mb].astype(np.float64)
    aux = {}
    losses = token_losses(forward(p, m, tok, inputs["position_ids"][it, mb].astype(np.int64), aux), lab)
    loss = (losses * mask).sum() / mask.sum()
    assert abs(loss - f["loss"]) < 1e-9 * abs(f["loss"]), (loss, f["loss"])
    np.testing.assert_allclose(aux["load_balancing"], f["load_balancing_loss"], rtol=1e-9)
    np.testing.assert_allclose(aux["z"], f["z_loss"], rtol=1e-9)


def make_batch(m):
    rng = np.random.RandomState(11)
    S, vocab, n = m["seq_length"], m["tokenizer_vocab_size"], len(PAIRS)
    tokens = np.zeros((2 * n, S), dtype=np.int64)
    labels = np.zeros((2 * n, S), dtype=np.int64)
    mask = np.zeros((2 * n, S), dtype=np.float32)
    for i, (pl, c, r) in enumerate(PAIRS):
        prompt = rng.randint(1, vocab, size=pl)
        for row, resp in ((i, c), (n + i, r)):
            ids = np.concatenate([prompt, rng.randint(1, vocab, size=resp)])
            assert len(ids) <= S
            tokens[row, :len(ids)] = ids
            for s in range(len(ids) - 1):  # position s predicts ids[s + 1]; response labels count
                labels[row, s] = ids[s + 1]
                mask[row, s] = 1.0 if s + 1 >= pl else 0.0
    positions = np.broadcast_to(np.arange(S, dtype=np.int64), tokens.shape).copy()
    return dict(tokens=tokens, labels=labels, loss_mask=mask, position_ids=positions)


def log_sigmoid(z):
    return -np.logaddexp(0.0, -z)


def main():
    os.makedirs(OUT, exist_ok=True)
    m = json.load(open(os.path.join(GOLDEN, "mixtral", "fixture.json")))["model"]
    policy = {k: v.astype(np.float64) for k, v in load_file(os.path.join(GOLDEN, "mixtral", "weights.safetensors")).items()}
    check_against_the_mixtral_golden(policy, m)
    rng = np.random.RandomState(99)
    reference = {k: bf16(v + rng.normal(0.0, 0.01, size=v.shape)) for k, v in sorted(policy.items())}
    batch = make_batch(m)
    n = len(PAIRS)
    mask = batch["loss_mask"].astype(np.float64)
    policy_aux, reference_aux = {}, {}
    pl = -(token_losses(forward(policy, m, batch["tokens"], batch["position_ids"], policy_aux), batch["labels"]) * mask).sum(-1)
    rl = -(token_losses(forward(reference, m, batch["tokens"], batch["position_ids"], reference_aux), batch["labels"]) * mask).sum(-1)
    counts = mask.sum(-1)
    results = []
    for c in CONFIGS:
        p_, r_ = (pl / np.maximum(counts, 1), rl / np.maximum(counts, 1)) if c["loss_type"] == "ipo" else (pl, rl)
        pc, pr, rc, rr = p_[:n], p_[n:], r_[:n], r_[n:]
        x = (pc - pr) - (rc - rr)
        b, e = c["beta"], c["label_smoothing"]
        if c["loss_type"] == "sigmoid":
            losses = -log_sigmoid(b * x) * (1 - e) - log_sigmoid(-b * x) * e
        elif c["loss_type"] == "hinge":
            losses = np.maximum(0.0, 1 - b * x)
        else:
            losses = (x - 1 / (2 * b)) ** 2
        if c["pref_ftx"] > 1e-6:
            losses = losses + c["pref_ftx"] * (-pc / counts[:n])
        cr, rj = b * (pc - rc), b * (pr - rr)
        results.append(dict(c, loss=float(losses.mean()), accuracy=float((cr > rj).mean()),
                            chosen_rewards=cr.tolist(), rejected_rewards=rj.tolist()))
    save_file({k: v.astype(np.float32) for k, v in reference.items()}, os.path.join(OUT, "reference_weights.safetensors"))
    save_file({k: np.ascontiguousarray(v) for k, v in batch.items()}, os.path.join(OUT, "inputs.safetensors"))
    doc = dict(policy="mixtral", pairs=PAIRS, configs=results, policy_log_probs=pl.tolist(),
               reference_log_probs=rl.tolist(), load_balancing_loss=policy_aux["load_balancing"],
               z_loss=policy_aux["z"], min_topk_margin=min(policy_aux["margin"] + reference_aux["margin"]))
    with open(os.path.join(OUT, "fixture.json"), "w") as f:
        f.write(json.dumps(doc, indent=1) + "\n")
    print(json.dumps([(r["name"], r["loss"], r["accuracy"]) for r in results]))
    print("min top-k margin", doc["min_topk_margin"])


if __name__ == "__main__":
    main()
