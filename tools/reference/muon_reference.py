#!/usr/bin/env python3
"""Independent PyTorch reference of the Muon optimizer (Megatron-LM's --optimizer muon): writes
tests/data/reference/muon/muon.json for tests/optim/muon_test.cc.

Written from the semantics of Megatron-LM's TensorParallelMuon and NVIDIA emerging_optimizers'
OrthogonalizedOptimizer / newton_schulz (docs/model.md "Muon"), not from their code:

  Newton-Schulz: X = G (or G^T when G has more rows than columns); X /= max(||X||_F, 1e-15);
    "medium" precision: X in bfloat16 from here on (every product stored in bf16), "high": float32;
    per step (a, b, c): A = X X^T; B = b A + c A A; X = a X + B X  (c == 0: X = a X + b A X)
  Muon step of a 2-D parameter p with gradient g:
    p -= lr * wd * p;  buf = lerp(buf, g, 1 - momentum);  u = lerp(g, buf, momentum) if nesterov else buf
    p -= lr * NS(u) * scale(out, in) * extra_scale_factor
    a fused QKV weight [groups * (q + k + v), in] is orthogonalised as three matrices (the q, k and
    v rows of every group stacked), each with its own scale.

The cases are small float32 matrices; the values are written as float32-exact decimals.
Usage: /tmp/tv/bin/python tools/reference/muon_reference.py   (torch 2.5.1, CPU)
"""
import json
import math
import os

import numpy as np
import torch

F32 = lambda v: float(np.float32(v))  # noqa: E731  (the coefficients as Gale's floats)

COEFFICIENTS = {
    "simple": ([(3.4445, -4.7750, 2.0315)], "cycle"),
    "quintic": ([(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
                 (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)], "cycle"),
    "polar_express": ([(8.2051, -22.9019, 16.4607), (4.0664, -2.8612, 0.5184), (3.9096, -2.8234, 0.5250),
                       (3.2856, -2.4153, 0.4853), (2.2779, -1.6198, 0.3985), (1.8726, -1.2307, 0.3585),
                       (1.8564, -1.2132, 0.3568), (1.8750, -1.2500, 0.3750)], "repeat_last"),
    "aol": ([(4.0098, -7.0585, 2.4635), (3.4585, -5.5479, 2.5959), (2.7573, -3.2939, 1.4254),
             (2.7215, -3.0494, 1.3169)], "cycle"),
    "cubic5": ([(3.3656576, -3.3420992, 0.0), (2.5744352, -1.4957376, 0.0), (2.5368962, -1.4312570, 0.0),
                (2.4418906, -1.2764040, 0.0), (2.2230472, -0.9630650, 0.0)], "cycle"),
}


def coefficient(kind, i):
    sets, mode = COEFFICIENTS[kind]
    k = min(i, len(sets) - 1) if mode == "repeat_last" else i % len(sets)
    return tuple(F32(v) for v in sets[k])


def newton_schulz(g, steps, kind="quintic", bf16=False):
    """Orthogonalise 2-D g (float32 or float64; bf16 iterates in bfloat16)."""
    x = g.T if g.shape[0] > g.shape[1] else g
    norm = torch.linalg.vector_norm(x.to(torch.float64)).to(x.dtype)
    x = x / torch.clamp(norm, min=1e-15)
    if bf16:
        x = x.to(torch.bfloat16)
    for i in range(steps):
        a, b, c = coefficient(kind, i)
        A = x @ x.T
        if c != 0.0:
            B = torch.addmm(A, A, A, beta=b, alpha=c)
            x = torch.addmm(x, B, x, beta=a, alpha=1.0)
        else:
            x = torch.addmm(x, A, x, beta=a, alpha=b)
    x = x.to(g.dtype)
    return x.T if g.shape[0] > g.shape[1] else x


def scale_factor(out, inp, mode):
    if mode == "spectral":
        return math.sqrt(max(out, inp))
    if mode == "unit_rms_norm":
        return math.sqrt(out / inp)
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, out / inp))
    raise ValueError(mode)


def orthogonalised_update(u, cfg):
    """NS(u) times its scale (per Q/K/V block with a qkv_split)."""
    split, bf16 = cfg.get("qkv_split"), cfg.get("bf16", False)
    extra = cfg.get("extra_scale_factor", 1.0)

    def one(m):
        return newton_schulz(m, cfg["steps"], cfg["kind"], bf16) * scale_factor(m.shape[0], m.shape[1], cfg["scale_mode"]) * extra

    if not split:
        return one(u)
    per, cols = sum(split), u.shape[1]
    groups = u.shape[0] // per
    blocks = torch.split(u.reshape(groups, per, cols), split, dim=1)
    done = [one(b.reshape(-1, cols)).reshape(groups, -1, cols) for b in blocks]
    return torch.cat(done, dim=1).reshape(u.shape)


def muon_steps(p, grads, lrs, cfg):
    """The parameter after each step (buf starts at zero)."""
    p = p.clone()
    buf = torch.zeros_like(p)
    out = []
    for g, lr in zip(grads, lrs):
        p.add_(p, alpha=-cfg["wd"] * lr)
        buf.lerp_(g, 1 - cfg["momentum"])
        u = g.lerp(buf, cfg["momentum"]) if cfg["nesterov"] else buf
        p.add_(orthogonalised_update(u, cfg), alpha=-lr)
        out.append(p.clone())
    return out


def flat(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def main():
    gen = torch.Generator().manual_seed(20261202)
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32)  # noqa: E731
    ns_cases = []
    for rows, cols, kind, steps, bf16 in [(6, 10, "quintic", 5, False), (12, 5, "quintic", 5, False),
                                          (8, 8, "simple", 3, False), (7, 9, "polar_express", 10, False),
                                          (9, 4, "aol", 6, False), (5, 11, "cubic5", 5, False),
                                          (6, 10, "quintic", 5, True), (16, 24, "quintic", 5, True),
                                          (20, 12, "polar_express", 8, True)]:
        g = rand(rows, cols)
        ns_cases.append({"rows": rows, "cols": cols, "kind": kind, "steps": steps, "bf16": bf16, "input": flat(g),
                         "output": flat(newton_schulz(g, steps, kind, bf16))})
    step_cases = []
    for cfg in [dict(rows=8, cols=12, momentum=0.9, nesterov=False, wd=0.1, scale_mode="spectral", steps=5,
                     kind="quintic"),
                dict(rows=12, cols=6, momentum=0.95, nesterov=True, wd=0.01, scale_mode="unit_rms_norm", steps=5,
                     kind="quintic", extra_scale_factor=0.2),
                dict(rows=2 * (4 + 2 + 2), cols=10, momentum=0.9, nesterov=True, wd=0.0, scale_mode="shape_scaling",
                     steps=5, kind="quintic", qkv_split=[4, 2, 2]),
                dict(rows=10, cols=16, momentum=0.9, nesterov=False, wd=0.05, scale_mode="spectral", steps=5,
                     kind="quintic", bf16=True)]:
        p0 = rand(cfg["rows"], cfg["cols"]) * 0.1
        grads = [rand(cfg["rows"], cfg["cols"]) for _ in range(3)]
        lrs = [0.02, 0.015, 0.01]
        after = muon_steps(p0, grads, lrs, cfg)
        step_cases.append(dict(cfg, qkv_split=cfg.get("qkv_split", []), bf16=cfg.get("bf16", False),
                               extra_scale_factor=cfg.get("extra_scale_factor", 1.0), lrs=lrs, param=flat(p0),
                               grads=[flat(g) for g in grads], params_after=[flat(p) for p in after]))
    out = {"generator": "tools/reference/muon_reference.py", "torch": torch.__version__,
           "newton_schulz": ns_cases, "muon_steps": step_cases}
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/reference/muon/muon.json")
    with open(path, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}: {len(ns_cases)} Newton-Schulz cases, {len(step_cases)} Muon step cases")


if __name__ == "__main__":
    main()
