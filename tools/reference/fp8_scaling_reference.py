#!/usr/bin/env python3
"""Golden values of Transformer Engine's per-tensor FP8 scaling for tests/kernels/fp8_scaling_test.cc.

Independent of Gale's codec: the FP8 casts are ml_dtypes' float8_e4m3fn / float8_e5m2 (round to
nearest even, subnormals), with TE's saturating behaviour (CUDA's __NV_SATFINITE cast) stated here:
values beyond the largest finite one and +-Inf are clipped to +-max before the cast, NaN stays NaN.

  quantise-dequantise: out = f32(e(f32(x * scale))) * f32(1 / scale)
  current scale (Float8CurrentScaling): fp8_max / amax in f32; FLT_MAX on overflow; 1 for 0 or non-finite
  delayed scaling (TE's DelayedScaling amax/scale update, as its PyTorch reference):
      amax = history[0] (most_recent) or max(history) (max)
      scale = (fp8_max / amax) / 2**margin where amax is finite and > 0, else unchanged; FLT_MAX if inf
      history = roll(history, -1); history[0] = 0

    python3 -m venv /tmp/v && /tmp/v/bin/pip install numpy ml_dtypes
    /tmp/v/bin/python tools/reference/fp8_scaling_reference.py   # rewrites the fixture
"""
import json
import os

import ml_dtypes
import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "fp8_scaling", "golden.json")
F32 = np.float32
FORMATS = {"e4m3": (ml_dtypes.float8_e4m3fn, F32(448.0)), "e5m2": (ml_dtypes.float8_e5m2, F32(57344.0))}
FLT_MAX = np.finfo(np.float32).max


def bits(a):
    return [int(b) for b in np.asarray(a, dtype=np.float32).view(np.uint32)]


def fake_quant(x, scale, fmt):
    dtype, fmax = FORMATS[fmt]
    with np.errstate(over="ignore", invalid="ignore"):
        v = (x * F32(scale)).astype(np.float32)
        nan = np.isnan(v)
        v = np.clip(np.where(nan, F32(0), v), -fmax, fmax).astype(np.float32)
        q = v.astype(dtype).astype(np.float32)
        out = (q * (F32(1) / F32(scale))).astype(np.float32)
    out[nan] = np.nan
    return out


def current_scale(amax, fmt):
    fmax = FORMATS[fmt][1]
    amax = F32(amax)
    if not np.isfinite(amax) or amax == 0:
        return F32(1)
    with np.errstate(over="ignore"):
        s = F32(fmax / amax)
    return F32(FLT_MAX) if np.isinf(s) else s


def delayed_trace(amaxes, length, algo, margin, fmt):
    fmax = FORMATS[fmt][1]
    history = np.zeros(length, dtype=np.float32)
    scale = F32(1)
    steps = []
    for a in amaxes:
        history[0] = max(history[0], F32(a))  # the step's quantisations max-accumulate into row 0
        amax = history[0] if algo == "most_recent" else history.max()
        if np.isfinite(amax) and amax > 0:
            with np.errstate(over="ignore"):
                s = F32(F32(fmax / amax) / F32(2.0 ** margin))
            scale = F32(FLT_MAX) if np.isinf(s) else s
        history = np.roll(history, -1)
        history[0] = 0
        steps.append({"amax": bits([a])[0], "scale": bits([scale])[0], "history": bits(history)})
    return steps


def main():
    rng = np.random.default_rng(7)
    cases = []
    for fmt, (dtype, fmax) in FORMATS.items():
        tiny = float(ml_dtypes.finfo(dtype).smallest_subnormal)
        special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, float(fmax), float(fmax) * 1.03,
                            float(fmax) * 2, -float(fmax) * 100, 1e30, tiny, tiny / 2, tiny * 0.51, tiny * 1.5,
                            tiny * 2.5, float(ml_dtypes.finfo(dtype).smallest_normal) * 0.99, 3.4e38], dtype=np.float32)
        # ties between neighbouring codes (odd multiples of half a step) in a normal binade
        mant = 3 if fmt == "e4m3" else 2
        ties = np.array([(1 + (2 * k + 1) / 2 ** (mant + 1)) for k in range(2 ** mant)], dtype=np.float32)
        randn = (rng.standard_normal(200) * rng.choice([1e-3, 1.0, 30.0], 200)).astype(np.float32)
        x = np.concatenate([special, ties, -ties * 4, randn]).astype(np.float32)
        for scale in [1.0, 0.25, 3.7, 448.0 / 2.9, 1e-3]:
            cases.append({"format": fmt, "scale": bits([scale])[0], "x": bits(x), "y": bits(fake_quant(x, F32(scale), fmt))})
    current = []
    for fmt in FORMATS:
        for a in [0.0, 1.0, 2.9, 1e-30, 1e-45, np.inf, np.nan, 3e38]:
            current.append({"format": fmt, "amax": bits([a])[0], "scale": bits([current_scale(a, fmt)])[0]})
    traces = []
    amaxes = [0.0, 2.0, 0.5, 7.0, 0.0, 1.0, np.inf, 3.0, 1e-40, 0.25]
    for fmt in FORMATS:
        for length in [1, 3]:
            for algo in ["most_recent", "max"]:
                for margin in [0, 2]:
                    traces.append({"format": fmt, "len": length, "algo": algo, "margin": margin,
                                   "steps": delayed_trace(amaxes, length, algo, margin, fmt)})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"cases": cases, "current": current, "delayed": traces}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
