#!/usr/bin/env python3
"""Independent numpy reference of Muon on a tiny MoE expert set: writes
tests/data/reference/muon/muon_experts.json for tests/optim/muon_test.cc.

Megatron-LM's Muon (emerging_optimizers' OrthogonalizedOptimizer) sees each expert's weight of a
TEGroupedMLP as a parameter of its own (weight0, weight1, ...), so every expert's fc1 [2F, H]
(SwiGLU's gate and up rows stacked, one matrix) and fc2 [H, F] is orthogonalised on its own, not
the experts stacked into one matrix; the router weight [E, H] is a Muon matrix like any other.
Written from those semantics, not from their code:

  Newton-Schulz in float32 ("high" precision): X = G (G^T when G has more rows than columns);
    X /= max(||X||_F, 1e-15); per quintic step (a, b, c): A = X X^T; B = b A + c A A; X = a X + B X
  Muon step: p -= lr * wd * p; buf = lerp(buf, g, 1 - momentum); u = lerp(g, buf, momentum)
    (Nesterov); p -= lr * NS(u) * sqrt(max(out, in))   (spectral scale)

Two steps (the second with the momentum of the first). Also written: the first step's update of
every expert orthogonalised with the experts stacked, which the test checks is different.
Usage: python3 tools/reference/muon_experts_reference.py   (numpy only)
"""
import json
import os

import numpy as np

QUINTIC = [(4.0848, -6.8946, 2.9270), (3.9505, -6.3029, 2.6377), (3.7418, -5.5913, 2.3037),
           (2.8769, -3.1427, 1.2046), (2.8366, -3.0525, 1.2012)]
E, H, F = 3, 6, 4
MOMENTUM, LR, WD = 0.9, 0.02, 0.1


def f32(x):
    return np.asarray(x, dtype=np.float32)


def newton_schulz(g, steps=5):
    x = f32(g)
    transpose = x.shape[0] > x.shape[1]
    if transpose:
        x = x.T.copy()
    x = f32(x / max(np.float32(np.sqrt(np.sum(x.astype(np.float64) ** 2))), np.float32(1e-15)))
    for i in range(steps):
        a, b, c = (np.float32(v) for v in QUINTIC[i % len(QUINTIC)])
        A = f32(x @ x.T)
        B = f32(b * A + c * (A @ A))
        x = f32(a * x + B @ x)
    return x.T.copy() if transpose else x


def lerp(start, end, weight):
    return f32(start + np.float32(weight) * (end - start))


def main():
    rng = np.random.default_rng(11)
    names, shapes = [], []
    for e in range(E):
        names += [f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight",
                  f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc2.weight"]
        shapes += [(2 * F, H), (H, F)]
    names.append("decoder.layers.0.mlp.router.weight")
    shapes.append((E, H))
    params = [f32(rng.normal(0, 0.05, s)) for s in shapes]
    grads = [[f32(rng.normal(0, 1.0, s)) for s in shapes] for _ in range(2)]
    bufs = [np.zeros(s, np.float32) for s in shapes]
    after = []
    p = [x.copy() for x in params]
    for step in range(2):
        for i, s in enumerate(shapes):
            g = grads[step][i]
            p[i] = f32(p[i] - np.float32(LR * WD) * p[i])
            bufs[i] = lerp(bufs[i], g, 1 - MOMENTUM)
            u = lerp(g, bufs[i], MOMENTUM)
            p[i] = f32(p[i] - np.float32(LR) * newton_schulz(u) * np.float32(np.sqrt(max(s))))
        after.append([x.copy() for x in p])
    # The experts' fc1 stacked [E * 2F, H] and orthogonalised as one matrix: a different update.
    u1 = [lerp(grads[0][2 * e], f32((1 - MOMENTUM) * grads[0][2 * e]), MOMENTUM) for e in range(E)]
    stacked = newton_schulz(np.concatenate(u1, axis=0)) * np.float32(np.sqrt(E * 2 * F))
    out = {
        "momentum": MOMENTUM, "lr": LR, "wd": WD,
        "tensors": [{"name": n, "shape": list(s), "param": params[i].ravel().tolist(),
                     "grads": [grads[k][i].ravel().tolist() for k in range(2)],
                     "params_after": [after[k][i].ravel().tolist() for k in range(2)]}
                    for i, (n, s) in enumerate(zip(names, shapes))],
        "stacked_fc1_update": stacked.ravel().tolist(),
    }
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "muon",
                        "muon_experts.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
