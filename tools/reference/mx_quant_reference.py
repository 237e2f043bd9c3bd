#!/usr/bin/env python3
"""Golden values of MX (OCP Microscaling) fake quantisation for tests/kernels/mx_quant_test.cc.

An independent restatement of the OCP MX v1.0 conversion (the rules in src/kernels/cpu/mx_quant.h),
written as a table look-up rather than bit arithmetic: every representable element value of FP8
E4M3 / FP4 E2M1 is enumerated from its code, and each scaled input picks the nearest table entry,
the even code on a tie, the largest entry beyond it (saturation). Scales are E8M0:
s = floor(log2(max|x| of the block)) - emax, clamped to [-127, 127]. Blocks run along each row; the
last one of a row may be shorter. Zeros and blocks holding Inf/NaN pass through unchanged.

All arithmetic is float64 on float32 inputs (exact here); the fixture stores float32 bit patterns.

    /usr/bin/python3 tools/reference/mx_quant_reference.py   # numpy only; rewrites the fixture
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "mx_quant", "golden.json")


def element_table(ebits, mbits, bias, max_code):
    """Values of the non-negative codes 0..max_code (sign bit clear) of a minifloat."""
    vals = []
    for code in range(max_code + 1):
        e, m = code >> mbits, code & ((1 << mbits) - 1)
        if e == 0:
            vals.append(m / (1 << mbits) * 2.0 ** (1 - bias))
        else:
            vals.append((1 + m / (1 << mbits)) * 2.0 ** (e - bias))
    return np.array(vals, dtype=np.float64)


FORMATS = {
    # E4M3 (OCP FP8): bias 7, code 0x7F is NaN, so 0x7E = 448 is the largest; emax 8.
    "fp8_e4m3": (element_table(4, 3, 7, 0x7E), 8),
    # E2M1 (OCP FP4): bias 1, codes 0..7 = 0, 0.5, 1, 1.5, 2, 3, 4, 6; emax 2.
    "fp4_e2m1": (element_table(2, 1, 1, 0x7), 2),
}


def nearest(table, a):
    """Nearest table entry to a >= 0, ties to the even code, saturating at the last entry."""
    if a >= table[-1]:
        return table[-1]
    hi = int(np.searchsorted(table, a, side="left"))
    if table[hi] == a:
        return table[hi]
    lo = hi - 1
    dlo, dhi = a - table[lo], table[hi] - a
    if dlo < dhi:
        return table[lo]
    if dhi < dlo:
        return table[hi]
    return table[lo] if lo % 2 == 0 else table[hi]


def fake_quant_block(x, fmt):
    table, emax = FORMATS[fmt]
    x64 = x.astype(np.float64)
    if not np.all(np.isfinite(x64)):
        return x.copy()
    amax = np.max(np.abs(x64))
    if amax == 0.0:
        return x.copy()
    _, e = np.frexp(amax)  # amax = m * 2**e, m in [0.5, 1)
    s = int(min(max(int(e) - 1 - emax, -127), 127))
    out = np.empty_like(x)
    for i, v in enumerate(x64):
        q = nearest(table, abs(v) / 2.0 ** s) * 2.0 ** s
        out[i] = np.float32(np.copysign(q, v))
        assert float(out[i]) == np.copysign(q, v), "result not exact in float32"
    return out


def fake_quant(x, block, fmt):
    out = np.empty_like(x)
    for r in range(x.shape[0]):
        for c in range(0, x.shape[1], block):
            out[r, c:c + block] = fake_quant_block(x[r, c:c + block], fmt)
    return out


def cases():
    rng = np.random.default_rng(20261202)
    f32 = np.float32
    out = []

    def add(name, x, block, fmts=("fp8_e4m3", "fp4_e2m1")):
        x = np.asarray(x, dtype=f32)
        if x.ndim == 1:
            x = x[None, :]
        for fmt in fmts:
            out.append((name, fmt, block, x))

    # Random weights with tails: 3 rows of 70 (blocks 32, 32, 6) and 2 rows of 300 with block 128.
    add("random_tail_b32", rng.normal(0, 0.02, (3, 70)), 32)
    add("random_tail_b128", rng.normal(0, 1.0, (2, 300)), 128)
    add("short_row_b32", rng.normal(0, 3.0, (2, 5)), 32)
    # Ties: amax 1.0 gives scale 2^-8 (fp8) / 2^-2 (fp4); midpoints between neighbours, both parities.
    t8 = [1.0] + [(k + 0.5) * 2.0 ** -9 * 2 ** -8 for k in range(0, 8)] \
        + [(8 + k + 0.5) * 2.0 ** -3 * 2.0 ** -8 * 2 ** 3 for k in range(0, 8)] \
        + [-(17.0 + 0.5) * 2 ** -4 * 2 ** -8, 1.0625 * 2 ** -8 * 128, 1.1875 * 2 ** -8 * 128]
    add("ties_fp8", t8, 32, ("fp8_e4m3",))
    t4 = [1.0, 0.25 * 0.25, 0.75 * 0.25, 1.25 * 0.25, 1.75 * 0.25, 2.5 * 0.25, 3.5 * 0.25, -5.0 * 0.25, -2.5 * 0.25]
    add("ties_fp4", t4, 32, ("fp4_e2m1",))
    # Saturation: amax just under the next power of two scales beyond the largest element.
    add("saturate", [1.99, -1.9, 1.8, 1.76, 1.74, 1.5, -1.99, 0.3], 32)
    add("saturate_big", [3.0e38, -2.9e38, 1.0e30, 5.0e37], 32)
    # Zeros: a block of zeros with signs, and zeros next to values.
    add("zeros", [0.0, -0.0, 0.0, 0.0, 1.0, -0.0, 0.0, 0.25, -1e-9, 0.0], 4)
    # Subnormal inputs: a block of f32 subnormals (scale clamps at 2^-127) and tiny values near 1.
    add("f32_subnormal", np.array([1e-45, -3e-42, 7e-39, 1.1e-38, -5e-40, 2e-41], dtype=f32), 32)
    add("element_subnormal", [1.0, 2.0 ** -7, 2.0 ** -8, 2.0 ** -9, 1.5 * 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11,
                              -2.0 ** -12, 0.3 * 2.0 ** -6, 0.9 * 2.0 ** -6], 32)
    add("small_scale", [1e-30, -3e-31, 7e-33, 2e-35, 1e-36], 32)
    # Inf and NaN pass through (their block only).
    add("nonfinite", [1.0, np.inf, 0.3, -0.7, 0.1, 0.2, np.nan, 0.5], 4)
    # Block sizes 1 and 2 (every element its own scale) and a row of exactly one block.
    add("block1", rng.normal(0, 1.0, (1, 9)), 1)
    add("exact_block", rng.uniform(-4, 4, (4, 32)), 32)
    return out


def bits(a):
    return [int(b) for b in np.asarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def main():
    result = []
    for name, fmt, block, x in cases():
        y = fake_quant(x, block, fmt)
        result.append({"name": name, "element": fmt, "block": block, "rows": int(x.shape[0]),
                       "cols": int(x.shape[1]), "x": bits(x), "y": bits(y)})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/reference/mx_quant_reference.py", "cases": result}, f, indent=0)
        f.write("\n")
    print(f"wrote {len(result)} cases to {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
