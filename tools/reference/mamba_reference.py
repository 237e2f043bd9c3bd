#!/usr/bin/python3
"""Float64 golden values for Gale's Mamba-2 mixer (src/model/mamba_mixer.h), written independently
from the Mamba-2 paper (Dao & Gu 2024): the selective state-space model in its quadratic ("SSD
attention") form
    y_s = sum_{j<=s} (C_s . B_j) * exp(A * sum_{k=j+1..s} dt_k) * dt_j * x_j + D * x_s
(the dual of the recurrence Gale's scan runs), with PyTorch autograd for the gradients.

Mixer: [z | xBC | dt] = u W_in^T; xBC = silu(causal depthwise conv1d(xBC) + bias); dt = softplus(dt +
dt_bias); A = -exp(A_log); y = SSD(x, dt, A, B, C) + D x; g = y * silu(z); n = grouped RMSNorm(g) * w
(eps 1e-5, groups of d_inner / ngroups); out = n W_out^T. Rows are t = s*B + b.
Writes tests/data/reference/mamba/golden.json: inputs, out, and the gradients of sum(R * out) for u
and every parameter. Usage:  /tmp/megvenv/bin/python tools/reference/mamba_reference.py
Needs only torch (1.13 used for the committed file) and is deterministic.
"""
import json
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "mamba", "golden.json")

S, B, H, EXPAND, P, G, N, K = 6, 2, 8, 2, 4, 2, 3, 4
DI = EXPAND * H
NH = DI // P
CD = DI + 2 * G * N
R = 2 * DI + 2 * G * N + NH


def mixer(u, w_in, conv_w, conv_b, a_log, d, dt_bias, norm_w, w_out):
    T = S * B
    zx = u @ w_in.T
    z, xbc, dt = zx[:, :DI], zx[:, DI:DI + CD], zx[:, DI + CD:]
    seq = xbc.reshape(S, B, CD).permute(1, 2, 0)  # [B, CD, S]
    conv = F.conv1d(seq, conv_w, conv_b, padding=K - 1, groups=CD)[..., :S]
    xbc = F.silu(conv).permute(2, 0, 1).reshape(T, CD)
    x, Bm, Cm = xbc[:, :DI], xbc[:, DI:DI + G * N], xbc[:, DI + G * N:]
    delta = F.softplus(dt + dt_bias)  # [T, NH]
    A = -torch.exp(a_log)
    parts = {}
    for b in range(B):
        rows = [s * B + b for s in range(S)]
        for h in range(NH):
            g = h // (NH // G)
            xs = x[rows, h * P:(h + 1) * P]           # [S, P]
            bs = Bm[rows, g * N:(g + 1) * N]           # [S, N]
            cs = Cm[rows, g * N:(g + 1) * N]
            dl = delta[rows, h]                        # [S]
            cum = torch.cumsum(dl, 0)
            seg = cum[:, None] - cum[None, :]          # sum_{k=j+1..s} dt_k
            mask = torch.tril(torch.ones(S, S, dtype=torch.bool))
            L = torch.where(mask, torch.exp(A[h] * seg), torch.zeros(S, S))
            M = (cs @ bs.T) * L * dl[None, :]
            parts[(b, h)] = M @ xs + d[h] * xs         # [S, P]
    out_rows = []
    for t in range(T):
        s, b = divmod(t, B)
        out_rows.append(torch.cat([parts[(b, h)][s] for h in range(NH)]))
    y = torch.stack(out_rows)
    gte = y * F.silu(z)
    gs = DI // G
    gg = gte.reshape(T, G, gs)
    n = gg * torch.rsqrt(gg.pow(2).mean(-1, keepdim=True) + 1e-5)
    n = n.reshape(T, DI) * norm_w
    return n @ w_out.T


def main():
    gen = torch.Generator().manual_seed(20261203)
    rnd = lambda *shape, scale=1.0: (torch.rand(*shape, generator=gen) * 2 - 1) * scale
    inputs = dict(
        u=rnd(S * B, H),
        w_in=rnd(R, H, scale=0.5),
        conv_w=rnd(CD, 1, K, scale=0.5),
        conv_b=rnd(CD, scale=0.5),
        a_log=torch.log(1 + 3 * torch.rand(NH, generator=gen)),
        d=1 + rnd(NH, scale=0.3),
        dt_bias=rnd(NH, scale=1.0),
        norm_w=1 + rnd(DI, scale=0.3),
        w_out=rnd(H, DI, scale=0.5),
    )
    r = rnd(S * B, H)
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    out = mixer(**leaves)
    (out * r).sum().backward()
    golden = dict(dims=dict(S=S, B=B, H=H, expand=EXPAND, headdim=P, ngroups=G, d_state=N, d_conv=K),
                  inputs={k: v.flatten().tolist() for k, v in inputs.items()}, r=r.flatten().tolist(),
                  out=out.detach().flatten().tolist(),
                  grads={k: v.grad.flatten().tolist() for k, v in leaves.items()})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
