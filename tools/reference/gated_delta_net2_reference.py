#!/usr/bin/python3
"""Float64 golden values for Gale's Gated DeltaNet-2 mixer (src/model/gated_delta_net.h, GdnDims::gdn2),
written independently from Megatron-Core's GatedDeltaNet2 semantics
(megatron/core/ssm/gated_delta_net/gdn2.py, --experimental-attention-variant gdn2): in_proj split
q|k|v|z|f|b|w (f, b: NK*DK; w: NV*DV), causal conv1d + SiLU over q|k|v, FLA's l2norm of q and k,
repeat_interleave of the key heads (q, k, g, b) over the value heads,
    g = -exp(A_log[key head]) * softplus(f + dt_bias)   (per key channel; A_log [NK], dt_bias [NK*DK])
    b = sigmoid(b), w = sigmoid(w),
the recurrence of GatedDeltaNet2's docstring, state [DK, DV]:
    S_t = (I - k_t (b_t * k_t)^T) Diag(exp(g_t)) S_{t-1} + k_t (w_t * v_t)^T,   o_t = S_t^T q_t / sqrt(DK)
then the gated RMSNorm over each value head times silu(z), and out_proj.
The same outputs are also computed with the chunkwise WY form of Megatron's torch_chunk_gdn2
(deterministic-mode kernel; chunk 4 here, so several chunks and padding) and checked to agree.
Gradients come from torch autograd in float64 of L = sum(R * out), independent of Gale's hand-written
backward. Rows are t = s*B + b. Writes tests/data/reference/gdn2/golden.json.
Usage: /usr/bin/python3 tools/reference/gated_delta_net2_reference.py (torch; deterministic).
"""
import json
import os

import torch
import torch.nn.functional as F

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "gdn2", "golden.json")

S, B, H, NK, NV, DK, DV, K = 7, 2, 5, 2, 4, 3, 5, 3
EPS_NORM = 1e-5   # the layer's --norm-epsilon (out_norm)
EPS_L2 = 1e-6     # FLA's l2norm
QK, VD = NK * DK, NV * DV
CD = 2 * QK + VD
R = 4 * QK + 3 * VD
RF = NV // NK


def recurrent(q, k, v, g, b, w):
    """[Bt, T, NV, D] inputs: the docstring's matrix recurrence, state [DK, DV]."""
    Bt, T = q.shape[0], q.shape[1]
    o = []
    for bi in range(Bt):
        rows = []
        for h in range(NV):
            St = torch.zeros(DK, DV, dtype=torch.float64)
            outs = []
            for t in range(T):
                kt = k[bi, t, h][:, None]
                erase = torch.eye(DK, dtype=torch.float64) - kt @ (b[bi, t, h] * k[bi, t, h])[None, :]
                St = erase @ torch.diag(torch.exp(g[bi, t, h])) @ St + kt @ (w[bi, t, h] * v[bi, t, h])[None, :]
                outs.append(St.T @ q[bi, t, h] / DK ** 0.5)
            rows.append(torch.stack(outs))
        o.append(torch.stack(rows, 1))
    return torch.stack(o)  # [Bt, T, NV, DV]


def chunked(q, k, v, g, b, w, C=4):
    """The chunkwise WY form (Megatron's torch_chunk_gdn2 algorithm), no centering (float64)."""
    q, k, v, g, b, w = [x.transpose(1, 2) for x in (q, k, v, g, b, w)]  # [Bt, NV, T, D]
    T = q.shape[2]
    pad = (C - T % C) % C
    q, k, v, g, b, w = [F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g, b, w)]
    n = (T + pad) // C
    q = q / DK ** 0.5
    q, k, v, g, b, w = [x.reshape(x.shape[0], x.shape[1], n, C, x.shape[-1]) for x in (q, k, v, g, b, w)]
    G = g.cumsum(-2)
    E = G.exp() * b * k                   # exp(G_r) b_r k_r
    Kh = k * (-G).exp()                   # exp(-G_j) k_j
    A = (E @ Kh.transpose(-1, -2)).tril(-1)
    Tm = torch.linalg.inv(torch.eye(C, dtype=torch.float64) + A)
    U0 = Tm @ (w * v)
    W0 = Tm @ E
    St = torch.zeros(q.shape[0], q.shape[1], DK, DV, dtype=torch.float64)
    out = []
    for i in range(n):
        Ui = U0[:, :, i] - W0[:, :, i] @ St
        intra = ((q[:, :, i] * G[:, :, i].exp()) @ Kh[:, :, i].transpose(-1, -2)).tril(0)
        out.append((q[:, :, i] * G[:, :, i].exp()) @ St + intra @ Ui)
        Gc = G[:, :, i, -1:]
        St = St * Gc.squeeze(-2).unsqueeze(-1).exp() + (k[:, :, i] * (Gc - G[:, :, i]).exp()).transpose(-1, -2) @ Ui
    o = torch.cat(out, 2)[:, :, :T]
    return o.transpose(1, 2)


def mixer(p, rule=recurrent):
    T = S * B
    zx = p["u"] @ p["w_in"].T                          # [T, R]
    qkv_in = zx[:, :CD]
    z = zx[:, CD:CD + VD]
    f = zx[:, CD + VD:CD + VD + QK]
    bl = zx[:, CD + VD + QK:CD + VD + 2 * QK]
    wl = zx[:, CD + VD + 2 * QK:]
    # causal depthwise conv along s of each sample, no bias: rows t = s*B + b -> [B, CD, S]
    x = qkv_in.reshape(S, B, CD).permute(1, 2, 0)
    conv = F.conv1d(x, p["conv_w"][:, None, :], padding=K - 1, groups=CD)[..., :S]
    qkv = F.silu(conv).permute(0, 2, 1)               # [B, S, CD]
    q = qkv[..., :QK].reshape(B, S, NK, DK)
    k = qkv[..., QK:2 * QK].reshape(B, S, NK, DK)
    v = qkv[..., 2 * QK:].reshape(B, S, NV, DV)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + EPS_L2)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + EPS_L2)
    bs = lambda a: a.reshape(S, B, *a.shape[1:]).transpose(0, 1)  # rows -> [B, S, ...]
    g = -torch.exp(p["a_log"]).repeat_interleave(DK) * F.softplus(bs(f) + p["dt_bias"])
    g = g.reshape(B, S, NK, DK)
    b = torch.sigmoid(bs(bl)).reshape(B, S, NK, DK)
    w = torch.sigmoid(bs(wl)).reshape(B, S, NV, DV)
    q, k, g, b = [a.repeat_interleave(RF, dim=2) for a in (q, k, g, b)]
    o = rule(q, k, v, g, b, w)                         # [B, S, NV, DV]
    rms = torch.sqrt((o * o).mean(-1, keepdim=True) + EPS_NORM)
    y = o / rms * p["norm_w"] * F.silu(bs(z).reshape(B, S, NV, DV))
    y = y.transpose(0, 1).reshape(T, VD)               # back to rows s*B + b
    return y @ p["w_out"].T


def main():
    torch.manual_seed(20261205)
    T = S * B
    d = dict(dtype=torch.float64)
    p = {
        "w_in": torch.randn(R, H, **d) * 0.4,
        "conv_w": (torch.rand(CD, K, **d) * 2 - 1) * 0.8,
        "dt_bias": torch.rand(QK, **d) - 0.5,
        "a_log": torch.rand(NK, **d) * 1.2 - 1.2,
        "norm_w": torch.rand(DV, **d) + 0.5,
        "w_out": torch.randn(H, VD, **d) * 0.4,
        "u": torch.randn(T, H, **d),
    }
    r = torch.randn(T, H, **d)
    for a in p.values():
        a.requires_grad_(True)
    out = mixer(p)
    with torch.no_grad():
        out_chunked = mixer(p, chunked)
    err = (out - out_chunked).abs().max().item()
    assert err < 1e-12, f"recurrent and chunkwise forms differ by {err}"
    (out * r).sum().backward()
    data = {
        "dims": {"S": S, "B": B, "H": H, "NK": NK, "NV": NV, "DK": DK, "DV": DV, "K": K, "norm_eps": EPS_NORM},
        "inputs": {n: a.detach().reshape(-1).tolist() for n, a in p.items()},
        "r": r.reshape(-1).tolist(),
        "out": out.detach().reshape(-1).tolist(),
        "grads": {n: a.grad.reshape(-1).tolist() for n, a in p.items()},
    }
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        json.dump(data, fh, separators=(",", ":"))
    print("wrote", OUT, "max |out|", out.abs().max().item(), "recurrent vs chunkwise", err)


if __name__ == "__main__":
    main()
