#!/usr/bin/env python3
"""Golden values for --quant-grads (src/kernels/cpu/quant_grads.h), computed with numpy alone.

An independent restatement of MindSpeed's ScaleMeta "fp16" (low_precision/quant_adamw.py) as its
gradient hooks use it (param_and_grad_buffer.py, quant_distributed_hooks.py): one float32 scale per
tensor, initially 1; accumulating a gradient g: x = float32(q) * scale_inv + g, amax = max|x|,
scale = 65503 / amax when amax > 0 and finite (else kept; an overflow to inf becomes FLT_MAX),
scale_inv = 1 / scale, q = float16(x * scale). Aligning: q = float16(float32(q) * (new / old)).
Every operation is numpy float32 arithmetic (one rounding each) and numpy's own float32 -> float16
conversion (round to nearest even, overflow to inf), not the C++ bit manipulation. Writes
tests/data/reference/quant_grads/golden.json (float32 and float16 values as their bit patterns),
used by tests/kernels/quant_grads_test.cc. Run with /usr/bin/python3 (numpy 1.24.2):

    /usr/bin/python3 tools/reference/quant_grads_reference.py
"""
import json
import os

import numpy as np

F32 = np.float32
TARGET = F32(65503.0)
FLT_MAX = np.finfo(np.float32).max


def bits32(a):
    return [int(v) for v in np.asarray(a, dtype=np.float32).view(np.uint32)]


def bits16(a):
    return [int(v) for v in np.asarray(a, dtype=np.float16).view(np.uint16)]


def update_scale(amax, old):
    amax = F32(amax)
    if not (amax > 0) or not np.isfinite(amax):
        return F32(old)
    with np.errstate(over="ignore", divide="ignore"):
        s = F32(TARGET / amax)
    return F32(FLT_MAX) if np.isinf(s) else s


def scale_inv(scale):
    return F32(F32(1.0) / (F32(1.0) if scale == 0 else F32(scale)))


def amax_of(x):
    x = np.asarray(x, dtype=np.float32)
    return F32(np.nan) if np.isnan(x).any() else (F32(np.abs(x).max()) if x.size else F32(0))


def accumulate(q, scale, g):
    with np.errstate(over="ignore", invalid="ignore"):
        x = (q.astype(np.float32) * scale_inv(scale)).astype(np.float32)
        x = (x + g.astype(np.float32)).astype(np.float32)
        scale = update_scale(amax_of(x), scale)
        q = (x * F32(scale)).astype(np.float32).astype(np.float16)
    return q, scale


def rescale(q, old, new):
    if old == new:
        return q
    if old == 0:
        return np.zeros_like(q)
    ratio = F32(F32(new) / F32(old))
    with np.errstate(over="ignore"):
        return (q.astype(np.float32) * ratio).astype(np.float32).astype(np.float16)


def main():
    rng = np.random.default_rng(20261203)
    cases = []
    # name, numel, micro-batch gradient generators
    specs = [
        ("normal_1e-3", 257, [lambda n: rng.normal(0, 1e-3, n) for _ in range(4)]),
        ("growing", 64, [lambda n, k=k: rng.normal(0, 10.0 ** (k - 3), n) for k in range(4)]),
        ("shrinking", 64, [lambda n, k=k: rng.normal(0, 10.0 ** (-k), n) for k in range(4)]),
        ("cancelling", 33, None),  # g then -g: exact zero, the scale is kept
        ("wide_range", 128, [lambda n: rng.normal(0, 1, n) * 10.0 ** rng.uniform(-12, 2, n) for _ in range(3)]),
        ("zeros", 16, [lambda n: np.zeros(n) for _ in range(2)]),
        ("tiny", 8, [lambda n: rng.normal(0, 1e-36, n) for _ in range(2)]),  # 65503 / amax overflows: FLT_MAX
        ("one_element", 1, [lambda n: rng.normal(0, 1, n) for _ in range(5)]),
        ("with_inf", 8, [lambda n: rng.normal(0, 1, n), lambda n: np.array([np.inf] + [0.0] * (n - 1))]),
        ("with_nan", 8, [lambda n: rng.normal(0, 1, n), lambda n: np.array([np.nan] + [0.0] * (n - 1))]),
    ]
    for name, n, gens in specs:
        if gens is None:
            g0 = rng.normal(0, 1e-2, n).astype(np.float32)
            grads = [g0, -g0]
        else:
            grads = [np.asarray(f(n), dtype=np.float64).astype(np.float32) for f in gens]
        q = np.zeros(n, dtype=np.float16)
        scale = F32(1.0)
        steps = []
        for g in grads:
            q, scale = accumulate(q, scale, g)
            with np.errstate(invalid="ignore", over="ignore"):
                deq = (q.astype(np.float32) * scale_inv(scale)).astype(np.float32)
            steps.append({"g": bits32(g), "codes": bits16(q), "scale": bits32([scale])[0], "dequantised": bits32(deq)})
        cases.append({"name": name, "numel": n, "steps": steps})
    rescales = []
    for old, new in [(1000.0, 250.0), (65503.0 / 3e-4, 65503.0 / 7e-4), (3.0, 3.0), (0.0, 5.0), (1.5e6, 1.1e6)]:
        q = np.clip(rng.normal(0, 20000, 40), -65504, 65504).astype(np.float16)
        q[0] = np.float16(65504.0)
        q[1] = np.float16(6e-8)  # a subnormal code
        rescales.append({"codes": bits16(q), "old": bits32([old])[0], "new": bits32([new])[0],
                         "out": bits16(rescale(q, F32(old), F32(new)))})
    scale_rule = []
    for amax, old in [(1.0, 1.0), (0.0, 7.0), (np.inf, 7.0), (np.nan, 7.0), (1e-36, 1.0), (3.3e-4, 2.0),
                      (65503.0, 1.0), (1e30, 1.0)]:
        scale_rule.append({"amax": bits32([amax])[0], "old": bits32([old])[0],
                           "scale": bits32([update_scale(F32(amax), F32(old))])[0]})
    out = {"accumulate": cases, "rescale": rescales, "scale_rule": scale_rule}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "tests", "data", "reference", "quant_grads", "golden.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
