#!/usr/bin/env python3
"""Independent float64 numpy reference of Lion: writes tests/data/reference/lion/lion.json for
tests/optim/lion_test.cc.

Megatron-LM main builds --optimizer lion (and --muon-scalar-optimizer lion) from NVIDIA's
emerging_optimizers Lion (v0.3.0, decoupled weight decay, one state tensor "exp_avg"). Written from
its documented update rule, not from its code, per element with gradient g (clipped first, as
Megatron clips the main gradients in place before the step):

  p <- p - lr * wd * p
  c  = beta1 * m + (1 - beta1) * g
  m <- beta2 * m + (1 - beta2) * g
  p <- p - lr * sign(c)

Global-norm clipping: g <- g * clip / (||g|| + 1e-6) when that factor is below 1.
Each case: several steps with their learning rates, weight decay, betas, clipping; the gradients
are drawn so that no |c| is within 1e-4 of zero (the f32 run then takes the same signs).
Usage: python3 tools/reference/lion_reference.py   (numpy only)
"""
import json
import os

import numpy as np


def lion_steps(p, grads, lrs, wd, beta1, beta2, clip):
    p = p.astype(np.float64).copy()
    m = np.zeros_like(p)
    out_p, out_m = [], []
    for g, lr in zip(grads, lrs):
        g = g.astype(np.float64)
        norm = np.sqrt(np.sum(g * g))
        if clip > 0 and clip / (norm + 1e-6) < 1.0:
            g = g * (clip / (norm + 1e-6))
        p = p - lr * wd * p
        c = beta1 * m + (1.0 - beta1) * g
        m = beta2 * m + (1.0 - beta2) * g
        p = p - lr * np.sign(c)
        out_p.append(p.copy())
        out_m.append(m.copy())
    return out_p, out_m


def make_case(name, shape, lrs, wd, beta1, beta2, clip, grad_scale, seed):
    rng = np.random.default_rng(seed)
    while True:
        p0 = rng.standard_normal(shape).astype(np.float32)
        grads = [(rng.standard_normal(shape) * grad_scale).astype(np.float32) for _ in lrs]
        # The interpolations c of every step away from zero (relative to the gradient's size).
        m = np.zeros(shape)
        ok = True
        for g in grads:
            g64 = g.astype(np.float64)
            n = np.sqrt(np.sum(g64 * g64))
            if clip > 0 and clip / (n + 1e-6) < 1.0:
                g64 = g64 * (clip / (n + 1e-6))
            c = beta1 * m + (1 - beta1) * g64
            if np.min(np.abs(c)) < 1e-4 * np.max(np.abs(c)):
                ok = False
            m = beta2 * m + (1 - beta2) * g64
        if ok:
            break
    ps, ms = lion_steps(p0, grads, lrs, wd, beta1, beta2, clip)
    flat = lambda a: [float(x) for x in np.asarray(a).reshape(-1)]
    return {
        "name": name, "shape": list(shape), "lrs": lrs, "wd": wd, "beta1": beta1, "beta2": beta2,
        "clip": clip, "param": flat(p0), "grads": [flat(g) for g in grads],
        "params_after": [flat(x) for x in ps], "exp_avg_after": [flat(x) for x in ms],
    }


def main():
    cases = [
        # --optimizer lion's own Lion: betas (--adam-beta1, --adam-beta2) = Megatron's defaults.
        make_case("matrix_adam_betas", (5, 7), [1e-2, 8e-3, 5e-3, 2e-3], 0.1, 0.9, 0.999, 0.0, 1.0, 1),
        # As Muon's scalar optimizer: --lion-beta1/2 defaults, a clipped norm.
        make_case("vector_lion_betas_clipped", (13,), [3e-3, 3e-3, 1e-3], 0.05, 0.95, 0.98, 1.0, 2.0, 2),
        # No weight decay, other betas.
        make_case("no_decay", (4, 3), [1e-3, 1e-3, 1e-3], 0.0, 0.5, 0.75, 0.0, 0.1, 3),
    ]
    here = os.path.dirname(os.path.abspath(__file__))
    out = os.path.join(here, "..", "..", "tests", "data", "reference", "lion")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "lion.json"), "w") as f:
        json.dump({"cases": cases}, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
