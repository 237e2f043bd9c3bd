"""Golden values of Megatron's gated MLP activation with the gpt-oss options (--quick-geglu,
--glu-linear-offset, --activation-func-clamp-value) for tests/kernels/glu_reference_test.cc.

Megatron main applies, in MLP.forward / TEGroupedMLP's glu() (transformer/mlp.py, moe/experts.py):
    x_glu, x_linear = chunk(x, 2, -1)
    x_glu = x_glu.clamp(max=clamp); x_linear = x_linear.clamp(-clamp, clamp)   (when clamp is set)
    y = activation_func(x_glu) * (x_linear + glu_linear_offset)
with activation_func = quick_gelu(a) = a * sigmoid(1.702 * a) for --quick-geglu and F.silu for --swiglu.
This script writes that formula again with torch in float64 and takes the input gradient by autograd
(torch.clamp passes the gradient where min <= x <= max), then checks it against Megatron's hand-written
quick_geglu_back formula. Inputs are float32 values (including values past the clamp and on it).

Run: /usr/bin/python3 tools/reference/quick_geglu_reference.py  (torch, numpy)
Writes tests/data/reference/quick_geglu.json.
"""
import json
import os

import numpy as np
import torch

ROWS, F = 3, 8
CASES = [  # name, alpha (1.702 quick GeLU, 1.0 SiLU), linear offset, clamp (None: none)
    ("gpt_oss", 1.702, 1.0, 7.0),
    ("quick_geglu", 1.702, 0.0, None),
    ("quick_geglu_offset", 1.702, 0.5, None),
    ("swiglu_clamp", 1.0, 0.0, 7.0),
    ("swiglu_offset", 1.0, 1.0, None),
]


def glu(x, alpha, offset, clamp):
    a, b = torch.chunk(x, 2, -1)
    if clamp is not None:
        a = a.clamp(min=None, max=clamp)
        b = b.clamp(min=-clamp, max=clamp)
    return a * torch.sigmoid(alpha * a) * (b + offset)


def inputs(seed):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ROWS, 2 * F)) * 5.0).astype(np.float32)
    # past the clamp above and below, and on it, in both halves
    x[0, :4] = [9.5, 7.0, -12.0, 6.999]
    x[0, F:F + 4] = [8.25, -7.0, -9.0, 7.0]
    dy = rng.standard_normal((ROWS, F)).astype(np.float32)
    return x, dy


def main():
    out = {"rows": ROWS, "F": F, "cases": []}
    for i, (name, alpha, offset, clamp) in enumerate(CASES):
        x, dy = inputs(100 + i)
        xt = torch.tensor(x, dtype=torch.float64, requires_grad=True)
        y = glu(xt, alpha, offset, clamp)
        y.backward(torch.tensor(dy, dtype=torch.float64))
        dx = xt.grad.numpy()
        if clamp is None and alpha == 1.702:  # Megatron's quick_geglu_back, written out
            a, b = np.split(x.astype(np.float64), 2, axis=-1)
            s = 1.0 / (1.0 + np.exp(-1.702 * a))
            g = dy.astype(np.float64)
            hand = np.concatenate([g * s * (1 + 1.702 * a * (1 - s)) * (b + offset), g * a * s], -1)
            assert np.abs(hand - dx).max() < 1e-12, np.abs(hand - dx).max()
        out["cases"].append({
            "name": name, "alpha": alpha, "linear_offset": offset, "clamp": clamp,
            "x": x.reshape(-1).tolist(), "dy": dy.reshape(-1).tolist(),
            "y": y.detach().numpy().reshape(-1).tolist(), "dx": dx.reshape(-1).tolist(),
        })
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "quick_geglu.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
