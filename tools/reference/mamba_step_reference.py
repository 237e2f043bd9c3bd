#!/usr/bin/python3
"""Float64 golden values for Gale's Mamba decoding state (src/model/mamba_state.h), written in numpy
from the semantics of mamba_ssm's inference kernels as Megatron's MambaMixer.step calls them:

  causal_conv1d_update: conv_state [B, CD, K] holds the last K inputs; the new xBC shifts in
      (conv_state = roll(conv_state, -1); conv_state[..., -1] = xBC), then
      xBC = silu(sum(conv_state * w[:, 0, :], -1) + bias)
  selective_state_update: dt = softplus(dt + dt_bias), dA = exp(dt * A), A = -exp(A_log),
      state [B, NH, P, N] = state * dA + (dt * x) outer B_group;  y = state . C_group + D * x
  then the gated RMSNorm (norm_before_gate false: n = rmsnorm_grouped(y * silu(z)) * w, eps 1e-5)
  and out_proj.

Every position is one step from the zero state: the prompt of sample b (lengths PROMPTS) is fed
token by token, then DECODE more tokens each. Gale prefills each prompt in one pass from the zero
state and then decodes one token a step; both must give these outputs and final states.
Writes tests/data/reference/mamba/step_golden.json. Usage:
  /tmp/venv_hybridinfer/bin/python tools/reference/mamba_step_reference.py   (numpy only; deterministic)
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "mamba", "step_golden.json")

H, EXPAND, P, G, N, K = 8, 2, 4, 2, 3, 4
DI = EXPAND * H
NH = DI // P
CD = DI + 2 * G * N
R = 2 * DI + 2 * G * N + NH
PROMPTS = [5, 2]  # per sample: prompt lengths (2 < K - 1 + 1: the state still holds zeros from before position 0)
DECODE = 4


def silu(v):
    return v / (1.0 + np.exp(-v))


def softplus(v):
    return np.where(v > 20.0, v, np.log1p(np.exp(np.minimum(v, 20.0))))


def step(p, u, conv_state, ssm_state):
    """One token u [H] of one sample; updates the states in place, returns out [H]."""
    zx = p["w_in"] @ u
    z, xbc, dt = zx[:DI], zx[DI:DI + CD], zx[DI + CD:]
    conv_state[:] = np.roll(conv_state, -1, axis=-1)
    conv_state[:, -1] = xbc
    xbc = silu(np.sum(conv_state * p["conv_w"][:, 0, :], axis=-1) + p["conv_b"])
    x, Bm, Cm = xbc[:DI], xbc[DI:DI + G * N], xbc[DI + G * N:]
    A = -np.exp(p["a_log"])
    dt = softplus(dt + p["dt_bias"])
    y = np.zeros(DI)
    for h in range(NH):
        g = h // (NH // G)
        xs = x[h * P:(h + 1) * P]
        bs = Bm[g * N:(g + 1) * N]
        cs = Cm[g * N:(g + 1) * N]
        ssm_state[h] = ssm_state[h] * np.exp(dt[h] * A[h]) + dt[h] * np.outer(xs, bs)
        y[h * P:(h + 1) * P] = ssm_state[h] @ cs + p["d"][h] * xs
    gte = (y * silu(z)).reshape(G, DI // G)
    n = gte / np.sqrt(np.mean(gte * gte, axis=-1, keepdims=True) + 1e-5)
    n = n.reshape(DI) * p["norm_w"]
    return p["w_out"] @ n


def main():
    rng = np.random.default_rng(20261203)
    rnd = lambda *shape, scale=1.0: (rng.random(shape) * 2 - 1) * scale
    p = dict(
        w_in=rnd(R, H, scale=0.5),
        conv_w=rnd(CD, 1, K, scale=0.5),
        conv_b=rnd(CD, scale=0.5),
        a_log=np.log(1 + 3 * rng.random(NH)),
        d=1 + rnd(NH, scale=0.3),
        dt_bias=rnd(NH, scale=1.0),
        norm_w=1 + rnd(DI, scale=0.3),
        w_out=rnd(H, DI, scale=0.5),
    )
    samples = []
    for b, prompt in enumerate(PROMPTS):
        u = rnd(prompt + DECODE, H)
        conv_state = np.zeros((CD, K))
        ssm_state = np.zeros((NH, P, N))
        out = np.stack([step(p, u[s], conv_state, ssm_state) for s in range(prompt + DECODE)])
        samples.append(dict(prompt=prompt, u=u.flatten().tolist(), out=out.flatten().tolist(),
                            # Gale's conv state [K-1, CD]: the last K-1 inputs, oldest first
                            conv_state=conv_state[:, 1:].T.flatten().tolist(),
                            ssm_state=ssm_state.flatten().tolist()))
    golden = dict(dims=dict(H=H, expand=EXPAND, headdim=P, ngroups=G, d_state=N, d_conv=K, decode=DECODE),
                  inputs={k: v.flatten().tolist() for k, v in p.items()}, samples=samples)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(golden, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
