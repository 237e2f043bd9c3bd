"""Float64 reference of Megatron-Core's QK-clip (MuonClip, --qk-clip) for tests/model/qk_clip_test.cc.

Written from Megatron-Core's formulas (TransformerConfig.qk_clip*, Attention.clip_qk,
MLASelfAttention.clip_qk, Transformer Engine's return_max_logit), not from its code:

  max_logit[h] = max over (b, i, visible j) of scale * q_i . k_j         (causal, document mask)
  standard attention: per query group g, m_g = max of its heads' max_logit; if some m_g > tau:
      eta_g = min(tau / m_g, 1); linear_qkv rows [g][(NH/KV + 2) * HD, H] (Megatron's packed order:
      the group's query heads, its key head, its value head): query rows *= eta_g ** alpha,
      key rows *= eta_g ** (1 - alpha), value rows unchanged
  MLA: per head h, eta_h = min(tau / max_logit[h], 1) if some head > tau:
      q rows [h][Dn + R, C]: the Dn rows *= eta_h ** alpha, the R rotary rows *= eta_h
      kv_up rows [h][Dn + Dv, Ckv]: the Dn key rows *= eta_h ** (1 - alpha), value rows unchanged

Writes tests/data/reference/qk_clip/golden.json (run from the repository root):
    python3 tools/reference/qk_clip_reference.py
"""
import json
import math

import numpy as np

rng = np.random.default_rng(20261204)


def f32(a):
    """Values exactly representable in float32 (what the C++ side reads)."""
    return np.asarray(a, dtype=np.float32).astype(np.float64)


def standard_case():
    B, S, H, NH, KV, HD = 2, 5, 6, 4, 2, 3
    scale = 1.0 / math.sqrt(HD)
    x = f32(rng.normal(size=(S * B, H)) * 2.0)  # rows t = s*B + b
    w = f32(rng.normal(size=((NH + 2 * KV) * HD, H)) * 1.5)
    doc = np.array([[0, 0, 0, 1, 1], [0, 0, 0, 0, 0]])  # [B, S] document ids (reset attention mask)
    qkv = x @ w.T  # [T, (NH + 2KV) * HD]
    per_group = NH // KV
    width = (per_group + 2) * HD
    max_logit = np.full(NH, -np.inf)
    for h in range(NH):
        g = h // per_group
        qo = g * width + (h % per_group) * HD
        ko = g * width + per_group * HD
        for b in range(B):
            for i in range(S):
                for j in range(i + 1):
                    if doc[b, i] != doc[b, j]:
                        continue
                    s = scale * qkv[i * B + b, qo:qo + HD] @ qkv[j * B + b, ko:ko + HD]
                    max_logit[h] = max(max_logit[h], s)
    group_max = max_logit.reshape(KV, per_group).max(axis=1)
    tau = float(np.float32((group_max.min() + group_max.max()) / 2.0))  # one group above, one below
    alpha = 0.3
    clipped = w.copy().reshape(KV, width, H)
    for g in range(KV):
        if group_max[g] > tau:
            eta = min(tau / group_max[g], 1.0)
            clipped[g, :per_group * HD] *= eta ** alpha
            clipped[g, per_group * HD:(per_group + 1) * HD] *= eta ** (1 - alpha)
    return {
        "B": B, "S": S, "H": H, "NH": NH, "KV": KV, "HD": HD, "scale": scale,
        "doc_ids": doc.reshape(-1).tolist(), "x": x.reshape(-1).tolist(), "w_qkv": w.reshape(-1).tolist(),
        "max_logit": max_logit.tolist(), "threshold": tau, "alpha": alpha,
        "w_qkv_clipped": clipped.reshape(-1).tolist(),
    }


def mla_case():
    NH, Dn, R, Dv, C, Ckv = 3, 4, 2, 3, 5, 4
    wq = f32(rng.normal(size=(NH * (Dn + R), C)))
    wkv = f32(rng.normal(size=(NH * (Dn + Dv), Ckv)))
    max_logit = f32([150.0, 40.0, 320.0])
    tau, alpha = 100.0, 0.5
    q = wq.copy().reshape(NH, Dn + R, C)
    kv = wkv.copy().reshape(NH, Dn + Dv, Ckv)
    for h in range(NH):
        eta = min(tau / max_logit[h], 1.0)
        q[h, :Dn] *= eta ** alpha
        q[h, Dn:] *= eta
        kv[h, :Dn] *= eta ** (1 - alpha)
    return {
        "NH": NH, "Dn": Dn, "R": R, "Dv": Dv, "C": C, "Ckv": Ckv, "max_logit": max_logit.tolist(),
        "threshold": tau, "alpha": alpha, "w_q": wq.reshape(-1).tolist(), "w_kv_up": wkv.reshape(-1).tolist(),
        "w_q_clipped": q.reshape(-1).tolist(), "w_kv_up_clipped": kv.reshape(-1).tolist(),
    }


out = {"standard": standard_case(), "mla": mla_case()}
with open("tests/data/reference/qk_clip/golden.json", "w") as f:
    json.dump(out, f, indent=1)
print("max_logit", out["standard"]["max_logit"], "threshold", out["standard"]["threshold"])
