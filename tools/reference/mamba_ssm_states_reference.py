#!/usr/bin/python3
"""Float64 golden values for Gale's Mamba-2 mixer with --mamba-training-ssm-states-dtype bf16
(src/model/mamba_mixer.h), written independently of Gale's sequential scan: the chunked SSD
algorithm of the Mamba-2 paper (Dao & Gu 2024, its "minimal SSD" form, as mamba_ssm's training
kernel runs it), chunks of Q positions:
    within chunk c (positions c0 .. c1-1), for s in it:
      y_s = sum_{c0<=j<=s} (C_s . B_j) * exp(A * sum_{k=j+1..s} dt_k) * dt_j * x_j      (intra-chunk)
          + exp(A * sum_{k=c0..s} dt_k) * (stored(h_c) C_s)                             (entering state)
          + D x_s
      h_{c+1} = exp(A * sum_{k=c0..c1-1} dt_k) h_c + sum_{j} exp(A * sum_{k=j+1..c1-1} dt_k) dt_j x_j B_j^T
    h_0 = 0; the chunk-to-chunk recurrence runs in float64 on the unrounded h_c, and only the copy the
    outputs read is stored(h_c) = h_c rounded to bfloat16 (torch's cast, nearest even). Its gradient
    passes straight through (autograd of a cast): stored(h) = h + (bf16(h) - h).detach().
The rest of the mixer is mamba_reference.py's. Writes tests/data/reference/mamba/ssm_states_bf16.json:
inputs, the chunk size, out, and the gradients of sum(R * out) for u and every parameter. Usage:
/usr/bin/python3 tools/reference/mamba_ssm_states_reference.py (torch 1.13; deterministic).
"""
import json
import os

import torch
import torch.nn.functional as F

torch.set_default_dtype(torch.float64)
OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "mamba",
                   "ssm_states_bf16.json")

S, B, H, EXPAND, P, G, N, K, Q = 11, 2, 8, 2, 4, 2, 3, 4, 4
DI = EXPAND * H
NH = DI // P
CD = DI + 2 * G * N
R = 2 * DI + 2 * G * N + NH


def stored(h):
    return h + (h.to(torch.bfloat16).to(torch.float64) - h).detach()


def ssd_chunked(xs, bs, cs, dl, a):
    """One (sample, head): xs [S, P], bs and cs [S, N], dl [S]; returns y without D x."""
    h = torch.zeros(P, N)
    ys = []
    for c0 in range(0, S, Q):
        c1 = min(c0 + Q, S)
        x, b, c, d = xs[c0:c1], bs[c0:c1], cs[c0:c1], dl[c0:c1]
        L = c1 - c0
        cum = torch.cumsum(d, 0)  # sum_{k=c0..s} dt_k
        seg = cum[:, None] - cum[None, :]
        mask = torch.tril(torch.ones(L, L, dtype=torch.bool))
        decay = torch.where(mask, torch.exp(a * seg), torch.zeros(L, L))
        y = ((c @ b.T) * decay * d[None, :]) @ x
        y = y + torch.exp(a * cum)[:, None] * (c @ stored(h).T)
        ys.append(y)
        to_end = torch.exp(a * (cum[-1] - cum))  # exp(A * sum_{k=j+1..c1-1} dt_k)
        h = torch.exp(a * cum[-1]) * h + ((to_end * d)[:, None] * x).T @ b
    return torch.cat(ys)


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
            xs = x[rows, h * P:(h + 1) * P]
            parts[(b, h)] = ssd_chunked(xs, Bm[rows, g * N:(g + 1) * N], Cm[rows, g * N:(g + 1) * N],
                                        delta[rows, h], A[h]) + d[h] * xs
    y = torch.stack([torch.cat([parts[(t % B, h)][t // B] for h in range(NH)]) for t in range(T)])
    gte = y * F.silu(z)
    gg = gte.reshape(T, G, DI // G)
    n = gg * torch.rsqrt(gg.pow(2).mean(-1, keepdim=True) + 1e-5)
    return (n.reshape(T, DI) * norm_w) @ w_out.T


def main():
    gen = torch.Generator().manual_seed(20261205)
    rnd = lambda *shape, scale=1.0: (torch.rand(*shape, generator=gen) * 2 - 1) * scale
    inputs = dict(
        u=rnd(S * B, H, scale=2.0),
        w_in=rnd(R, H, scale=0.6),
        conv_w=rnd(CD, 1, K, scale=0.6),
        conv_b=rnd(CD, scale=0.5),
        # A in [-0.5, -0.1]: the state carries over chunk boundaries, where its rounding shows.
        a_log=torch.log(0.1 + 0.4 * torch.rand(NH, generator=gen)),
        d=1 + rnd(NH, scale=0.3),
        dt_bias=rnd(NH, scale=1.0),
        norm_w=1 + rnd(DI, scale=0.3),
        w_out=rnd(H, DI, scale=0.5),
    )
    r = rnd(S * B, H)
    leaves = {k: v.clone().requires_grad_(True) for k, v in inputs.items()}
    out = mixer(**leaves)
    (out * r).sum().backward()
    golden = dict(dims=dict(S=S, B=B, H=H, expand=EXPAND, headdim=P, ngroups=G, d_state=N, d_conv=K, chunk=Q),
                  inputs={k: v.flatten().tolist() for k, v in inputs.items()}, r=r.flatten().tolist(),
                  out=out.detach().flatten().tolist(),
                  grads={k: v.grad.flatten().tolist() for k, v in leaves.items()})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
