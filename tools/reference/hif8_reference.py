#!/usr/bin/env python3
"""Golden values for --quant-states hif8 (HiFloat8 in src/kernels/cpu/quant_states.h), numpy alone.

An independent restatement: the 256 codes are decoded from HiFloat8's field table (arXiv 2409.16626:
sign, prefix-coded dot field giving the exponent width D, a sign-magnitude exponent with an implicit
leading 1, a tapered mantissa of 3/2/1 bits, denormals 2^(m-23), 0x00 zero, 0x80 NaN, 0x6F/0xEF
+-Inf), and a value is encoded as the nearest finite code value, ties away from zero (HiF8's
rounding), saturating at +-32768 (Gale's choice for finite inputs; the optimizer's scaled moments
stay near 1). This searches the sorted table of values instead of manipulating float bits as the
C++ does. Blocks follow MindSpeed's quant_adamw.py ScaleMeta for "hif8_15" / "hif8_224": scale =
f32(f32(T / amax) / T) (T / amax -> FLT_MAX when it overflows, 1 for an all-zero block), codes of
x * scale, dequantised as decode(code) * (1 / scale), all in float32.

Writes tests/data/reference/quant_states/hif8_golden.json, used by tests/kernels/quant_states_test.cc.
Run with /usr/bin/python3 (numpy 1.24.2):

    /usr/bin/python3 tools/reference/hif8_reference.py
"""
import bisect
import json
import math
import os

import numpy as np


def decode(code):
    """The value of a code, from the field table (float('nan'), +-inf or a float)."""
    if code == 0x80:
        return float("nan")
    sign = -1.0 if code & 0x80 else 1.0
    v = code & 0x7F
    field = format(v, "07b")  # the 7 bits after the sign
    if field.startswith("11") or field.startswith("10") or field.startswith("01"):
        d = {"01": 2, "10": 3, "11": 4}[field[:2]]
        rest = field[2:]  # D exponent bits then 5 - D mantissa bits
    elif field.startswith("001"):
        d, rest = 1, field[3:]
    elif field.startswith("0001"):
        d, rest = 0, field[4:]
    else:  # dot 0000: denormal (or zero)
        m = int(field[4:], 2)
        return 0.0 if m == 0 else sign * 2.0 ** (m - 23)
    if d == 0:
        exponent, mant = 0, rest
    else:
        exp_bits, mant = rest[:d], rest[d:]
        magnitude = (1 << (d - 1)) + (int(exp_bits[1:], 2) if d > 1 else 0)
        exponent = -magnitude if exp_bits[0] == "1" else magnitude
    if d == 4 and exponent == 15 and mant == "1":
        return sign * float("inf")
    fraction = int(mant, 2) / 2.0 ** len(mant)
    return sign * (1.0 + fraction) * 2.0 ** exponent


VALUES = {}  # finite nonnegative value -> code
for c in range(128):
    val = decode(c)
    if math.isfinite(val):
        assert val not in VALUES, (c, val)
        VALUES[val] = c
GRID = sorted(VALUES)
assert len(GRID) == 127 and GRID[0] == 0.0 and GRID[-1] == 32768.0


def encode(x):
    x = float(np.float32(x))
    if math.isnan(x):
        return 0x80
    sign = 0x80 if x < 0 else 0
    a = abs(x)
    if math.isinf(a):
        return sign | 0x6F
    if a >= GRID[-1]:
        code = VALUES[GRID[-1]]
    else:
        i = bisect.bisect_right(GRID, a) - 1  # GRID[i] <= a < GRID[i + 1]
        lo, hi = GRID[i], GRID[i + 1]
        code = VALUES[hi] if a >= (lo + hi) / 2.0 else VALUES[lo]  # ties away from zero
    return 0 if code == 0 else sign | code


def bits(v):
    return [int(b) for b in np.array(v, np.float32).view(np.uint32)]


def quantise(x, target, block, first):
    codes, scales, deq = [], [], []
    lo = 0
    t = np.float32(target)
    while lo < len(x):
        hi = min(len(x), first if lo == 0 else lo + block)
        xb = x[lo:hi]
        amax = np.max(np.abs(xb)).astype(np.float32)
        s = np.float32(1.0)
        if amax > 0 and np.isfinite(amax):
            with np.errstate(over="ignore"):
                s = np.float32(t / amax)
            if np.isinf(s):
                s = np.finfo(np.float32).max
        s = np.float32(s / t)
        c = [encode(np.float32(v * s)) for v in xb]
        inv = np.float32(np.float32(1.0) / s)
        deq += [np.float32(np.float32(decode(k)) * inv) for k in c]
        scales.append(bits([s])[0])
        codes += c
        lo = hi
    return dict(target=target, block=block, first=first, x=bits(x), codes=codes, scales=scales,
                dequantised=bits(deq))


def main():
    # Every boundary: each pair of neighbouring values, the tie between them and the float32 numbers
    # just either side of the tie, both signs (this crosses every mantissa-width change).
    boundary = []
    for lo, hi in zip(GRID[:-1], GRID[1:]):
        mid = np.float32((lo + hi) / 2.0)
        assert float(mid) == (lo + hi) / 2.0
        boundary += [lo, hi, mid, np.nextafter(mid, np.float32(0)), np.nextafter(mid, np.float32(np.inf))]
    special = [0.0, -0.0, 2.0 ** -23, np.nextafter(np.float32(2.0 ** -23), np.float32(0)), 2.0 ** -24, 1e-45,
               -1e-45, 1e-39, 3 * 2.0 ** -23, 32768.0, 36863.0, 36864.0, 40959.996, 40960.0, 49152.0, 65504.0, 1e30,
               3.4028235e38, float("inf"), float("-inf"), float("nan"), 1.0, 15.0, 224.0, 0.1, -0.3]
    rng = np.random.RandomState(20261203)
    rand = (rng.standard_normal(300) * 2.0 ** rng.uniform(-26, 17, 300)).astype(np.float32)
    values = np.concatenate([np.array(boundary, np.float32), -np.array(boundary, np.float32),
                             np.array(special, np.float32), rand])
    enc = dict(x=bits(values), codes=[encode(v) for v in values])
    dec = [None if math.isnan(decode(c)) else bits([decode(c)])[0] for c in range(256)]

    def data(n, lo, hi):
        return (rng.standard_normal(n) * 10.0 ** rng.uniform(lo, hi, n)).astype(np.float32)

    zeros_then = np.concatenate([np.zeros(40, np.float32), data(60, -5, -1)])
    wide = data(128, -12, 0)  # 12 decades in one block: codes down to the denormals and zero
    cases = [
        quantise(data(300, -4, -1), 15.0, 128, 128),
        quantise(data(300, -9, -6) ** 2, 224.0, 128, 128),
        quantise(data(150, -10, -6), 15.0, 64, 20),
        quantise(data(50, -3, 0), 224.0, 50, 50),  # one scale for the whole piece
        quantise(zeros_then, 15.0, 32, 32),
        quantise(zeros_then, 224.0, 32, 32),
        quantise(wide, 224.0, 128, 128),
        quantise(np.array([1e-40, -3e-41, 2e-39, 0.0], np.float32), 15.0, 4, 4),  # FLT_MAX scale
    ]
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "quant_states",
                       "hif8_golden.json")
    with open(out, "w") as fh:
        json.dump(dict(decode=dec, encode=enc, cases=cases), fh, separators=(",", ":"))
        fh.write("\n")
    print("wrote", os.path.normpath(out), len(values), "encoded values")


if __name__ == "__main__":
    main()
