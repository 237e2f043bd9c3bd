#!/usr/bin/env python3
"""Golden values for the precision-aware optimizer's scaled moments (src/kernels/cpu/scaled_states.h),
computed with numpy alone.

An independent restatement of Transformer Engine's FusedAdam scaling of an fp16 or fp8 (uint8,
E4M3) optimizer state (its _apply_scale / get_unscaled_state): amax = max |x|, scale = amax / R
(R = 65504 / 2 for fp16, 448 for fp8; float32 division); fp16: codes = float16(x * r) with
r = 1 / scale (0 when scale is 0), dequantised as float32(code) * scale; fp8: codes = e4m3(x * q)
with q = 1 / scale (Gale: codes 0 when scale is 0), dequantised as e4m3value(code) * (1 / q).
Every operation is numpy float32 arithmetic (one rounding each), numpy's float32 -> float16
conversion (round to nearest even) and the E4M3 rounding of quant_states_reference.py (written from
the format's definition). Writes tests/data/reference/scaled_states/golden.json (float32 and float16
values as bit patterns), used by tests/kernels/scaled_states_test.cc. Run with /usr/bin/python3
(numpy 1.24.2):

    /usr/bin/python3 tools/reference/scaled_states_reference.py
"""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from quant_states_reference import decode, encode  # noqa: E402  (the E4M3 rounding, one definition)

F32 = np.float32
RANGE = {"fp16": F32(65504.0 / 2.0), "fp8": F32(448.0)}


def bits32(a):
    return [int(v) for v in np.asarray(a, dtype=np.float32).view(np.uint32)]


def quantise(x, dtype):
    x = np.asarray(x, dtype=np.float32)
    amax = F32(np.abs(x).max()) if x.size else F32(0)
    scale = F32(amax / RANGE[dtype])
    if dtype == "fp16":
        r = F32(F32(1.0) / scale) if scale > 0 else F32(0.0)
        codes = (x * r).astype(np.float32).astype(np.float16)
        back = (codes.astype(np.float32) * scale).astype(np.float32)
        return scale, [int(c) for c in codes.view(np.uint16)], back
    if scale > 0:
        q = F32(F32(1.0) / scale)
        inv = F32(F32(1.0) / q)
        codes = [encode(F32(v * q), "e4m3") for v in x]
    else:
        inv = F32(0.0)
        codes = [0] * x.size
    back = np.array([F32(decode(c, "e4m3") * inv) for c in codes], dtype=np.float32)
    return scale, codes, back


def main():
    rng = np.random.default_rng(20261203)
    inputs = {
        "normal_1e-3": rng.normal(0, 1e-3, 257),
        "squares_wide": (rng.normal(0, 1, 200) * 10.0 ** rng.uniform(-6, 0, 200)) ** 2,
        "wide_range": rng.normal(0, 1, 128) * 10.0 ** rng.uniform(-12, 2, 128),
        "one_element": np.array([-3.25e-4]),
        "all_zero": np.zeros(16),
        "ties": np.array([1.0, 1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 448.0 / 32752.0, -17.0, 0.0]),
        "large": rng.normal(0, 1e6, 64),
    }
    cases = []
    for name, x in inputs.items():
        x = np.asarray(x, dtype=np.float32)
        for dtype in ("fp16", "fp8"):
            scale, codes, back = quantise(x, dtype)
            cases.append({"name": name, "dtype": dtype, "x": bits32(x), "scale": bits32([scale])[0], "codes": codes,
                          "dequantised": bits32(back)})
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "scaled_states")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "golden.json"), "w") as f:
        json.dump({"cases": cases}, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
