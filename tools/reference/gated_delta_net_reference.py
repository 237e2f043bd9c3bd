#!/usr/bin/python3
"""Float64 golden values for Gale's Gated DeltaNet mixer (src/model/gated_delta_net.h), written
independently from the Gated DeltaNet paper (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks:
Improving Mamba2 with Delta Rule") and Megatron-Core's GatedDeltaNet module semantics
(megatron/core/ssm/gated_delta_net/gdn.py: in_proj split q|k|v|z|beta|alpha, causal conv1d + SiLU
over q|k|v, FLA's l2norm of q and k, repeat_interleave of the key heads, g = -exp(A_log) *
softplus(alpha + dt_bias), beta = sigmoid, scale 1/sqrt(DK), gated RMSNorm over each value head
then * silu(z), out_proj).

The recurrence is the paper's matrix form with the state as [DV, DK]:
    S_t = S_{t-1} * (alpha_t * (I - beta_t k_t k_t^T)) + beta_t v_t k_t^T,   o_t = S_t (q_t / sqrt(DK))
with alpha_t = exp(g_t) (Gale runs the equivalent rank-one update on the transposed state).
Gradients are float64 central differences of L = sum(R * out) (step 1e-6), independent of any
hand-written backward. Rows are t = s*B + b.
Writes tests/data/reference/gdn/golden.json. Usage: /tmp/venv_gdn/bin/python
tools/reference/gated_delta_net_reference.py (numpy only; deterministic).
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "gdn", "golden.json")

S, B, H, NK, NV, DK, DV, K = 7, 2, 5, 2, 4, 3, 5, 3
EPS_NORM = 1e-5   # the layer's --norm-epsilon (out_norm)
EPS_L2 = 1e-6     # FLA's l2norm
QK, VD = NK * DK, NV * DV
CD = 2 * QK + VD
R = 2 * QK + 2 * VD + 2 * NV


def silu(x):
    return x / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def mixer(p):
    T = S * B
    zx = p["u"] @ p["w_in"].T                         # [T, R]
    qkv_in = zx[:, :CD]
    z = zx[:, CD:CD + VD]
    b_logit = zx[:, CD + VD:CD + VD + NV]
    a_in = zx[:, CD + VD + NV:]
    # causal depthwise conv along s of each sample, no bias
    conv = np.zeros((T, CD))
    for s in range(S):
        for b in range(B):
            for k in range(K):
                s2 = s - K + 1 + k
                if s2 >= 0:
                    conv[s * B + b] += p["conv_w"][:, k] * qkv_in[s2 * B + b]
    qkv = silu(conv)
    q = qkv[:, :QK].reshape(T, NK, DK)
    k = qkv[:, QK:2 * QK].reshape(T, NK, DK)
    v = qkv[:, 2 * QK:].reshape(T, NV, DV)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + EPS_L2)
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + EPS_L2)
    q = np.repeat(q, NV // NK, axis=1)                # repeat_interleave over heads
    k = np.repeat(k, NV // NK, axis=1)
    g = -np.exp(p["a_log"]) * softplus(a_in + p["dt_bias"])   # [T, NV]
    beta = 1.0 / (1.0 + np.exp(-b_logit))
    o = np.zeros((T, NV, DV))
    eye = np.eye(DK)
    for b in range(B):
        for h in range(NV):
            St = np.zeros((DV, DK))
            for s in range(S):
                t = s * B + b
                kt = k[t, h][:, None]
                St = St @ (np.exp(g[t, h]) * (eye - beta[t, h] * kt @ kt.T)) + beta[t, h] * v[t, h][:, None] @ kt.T
                o[t, h] = St @ (q[t, h] / np.sqrt(DK))
    rms = np.sqrt((o * o).mean(-1, keepdims=True) + EPS_NORM)
    y = o / rms * p["norm_w"] * silu(z.reshape(T, NV, DV))
    return y.reshape(T, VD) @ p["w_out"].T


def main():
    rng = np.random.default_rng(20261203)
    T = S * B
    p = {
        "w_in": rng.normal(0.0, 0.4, (R, H)),
        "conv_w": rng.uniform(-0.8, 0.8, (CD, K)),
        "dt_bias": rng.uniform(0.0, 1.0, NV),
        "a_log": rng.uniform(-1.2, 0.0, NV),
        "norm_w": rng.uniform(0.5, 1.5, DV),
        "w_out": rng.normal(0.0, 0.4, (H, VD)),
        "u": rng.normal(0.0, 1.0, (T, H)),
    }
    r = rng.normal(0.0, 1.0, (T, H))
    out = mixer(p)
    grads = {}
    h = 1e-6
    for name, arr in p.items():
        gr = np.zeros_like(arr)
        flat, gflat = arr.reshape(-1), gr.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            flat[i] = keep + h
            lp = (mixer(p) * r).sum()
            flat[i] = keep - h
            lm = (mixer(p) * r).sum()
            flat[i] = keep
            gflat[i] = (lp - lm) / (2 * h)
        grads[name] = gr
    data = {
        "dims": {"S": S, "B": B, "H": H, "NK": NK, "NV": NV, "DK": DK, "DV": DV, "K": K, "norm_eps": EPS_NORM},
        "inputs": {n: a.reshape(-1).tolist() for n, a in p.items()},
        "r": r.reshape(-1).tolist(),
        "out": out.reshape(-1).tolist(),
        "grads": {n: g.reshape(-1).tolist() for n, g in grads.items()},
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    print("wrote", OUT, "max |out|", np.abs(out).max())


if __name__ == "__main__":
    main()
