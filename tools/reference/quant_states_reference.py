#!/usr/bin/env python3
"""Golden values for --quant-states (src/kernels/cpu/quant_states.h), computed with numpy alone.

An independent restatement of MindSpeed's quant_adamw.py ScaleMeta (fp8: per-block linear scale
fmax/amax, exp_avg E4M3, exp_avg_sq E5M2; mxfp8: k-scaling y = sign(x)*x^2 cast to bf16, an OCP MX
shared exponent floor(log2(amax)) - emax per 32 elements, dequantised with a signed square root).
The FP8 rounding is written here from the formats' definitions (round to nearest even, subnormals,
saturation at the largest finite value), in double precision where it is exact, not from float bits
as the C++ does. Writes tests/data/reference/quant_states/golden.json, used by
tests/kernels/quant_states_test.cc. Run with /usr/bin/python3 (numpy 1.24.2):

    /usr/bin/python3 tools/reference/quant_states_reference.py
"""
import json
import math
import os

import numpy as np

FORMATS = {"e4m3": dict(mant=3, bias=7, max=448.0, emax=8), "e5m2": dict(mant=2, bias=15, max=57344.0, emax=15)}


def encode(a, fmt):
    f = FORMATS[fmt]
    a = np.float32(a)
    sign = 0x80 if np.signbit(a) else 0
    x = abs(float(a))
    if math.isnan(x):
        return 0
    x = min(x, f["max"])  # saturate
    min_normal = 2.0 ** (1 - f["bias"])
    if x < min_normal:
        q = int(np.round(x / 2.0 ** (1 - f["bias"] - f["mant"])))  # numpy rounds half to even
        return sign | q  # q == 2^mant is the smallest normal's code
    m, e = math.frexp(x)  # x = m * 2^e, m in [0.5, 1)
    exponent = e - 1
    q = int(np.round(x / 2.0 ** (exponent - f["mant"])))
    if q == 2 ** (f["mant"] + 1):
        exponent, q = exponent + 1, 2 ** f["mant"]
    value = q * 2.0 ** (exponent - f["mant"])
    if value > f["max"]:
        return encode(f["max"], fmt) | sign
    return sign | ((exponent + f["bias"]) << f["mant"]) | (q - 2 ** f["mant"])


def decode(code, fmt):
    f = FORMATS[fmt]
    e = (code >> f["mant"]) & ((1 << (7 - f["mant"])) - 1)
    m = code & ((1 << f["mant"]) - 1)
    v = m * 2.0 ** (1 - f["bias"] - f["mant"]) if e == 0 else (1 + m / 2.0 ** f["mant"]) * 2.0 ** (e - f["bias"])
    return np.float32(-v if code & 0x80 else v)


def to_bf16(y):
    y = float(y)
    if y == 0.0:
        return np.float32(y)
    m, e = math.frexp(y)
    return np.float32(np.round(m * 256.0) / 256.0 * 2.0 ** e)  # 8 significant bits, ties to even


def blocks(n, block, first):
    out, lo = [], 0
    while lo < n:
        hi = min(n, first if lo == 0 else lo + block)
        out.append((lo, hi))
        lo = hi
    return out


def quantise(x, mode, fmt, block, first):
    f = FORMATS[fmt]
    codes, scales, deq = [], [], []
    for lo, hi in blocks(len(x), block, first):
        xb = x[lo:hi]
        if mode == "linear":
            amax = np.max(np.abs(xb)).astype(np.float32)
            scale = np.float32(1.0)
            if amax > 0 and np.isfinite(amax):
                scale = np.float32(f["max"]) / amax
                if np.isinf(scale):
                    scale = np.finfo(np.float32).max
            c = [encode(v * scale, fmt) for v in xb]
            inv = np.float32(1.0) / scale
            deq += [decode(k, fmt) * inv for k in c]
            scales.append(int(np.array([scale], np.float32).view(np.uint32)[0]))
        else:
            y = [to_bf16(v * v if v >= 0 else -(v * v)) for v in xb]
            amax = max(abs(float(v)) for v in y)
            exponent = math.frexp(amax)[1] - 1 - f["emax"] if amax > 0 else -127
            exponent = max(-127, min(127, exponent))
            c = [encode(float(v) * 2.0 ** (-exponent), fmt) for v in y]
            for k in c:
                yy = np.float32(float(decode(k, fmt)) * 2.0 ** exponent)
                deq.append(np.sqrt(yy) if yy >= 0 else -np.sqrt(-yy))
            scales.append(exponent + 127)
        codes += c
    bits = lambda v: [int(b) for b in np.array(v, np.float32).view(np.uint32)]
    return dict(mode=mode, format=fmt, block=block, first=first, x=bits(x), codes=codes, scales=scales,
                dequantised=bits(deq))


def main():
    rng = np.random.RandomState(20261202)
    special = [0.0, -0.0, 1.0, 1.0625, 1.1875, -1.1875, 448.0, 460.0, 464.0, 470.0, 500.0, 1e30, -1e30, 57344.0,
               60000.0, 61440.0, 1e-3, 2.0 ** -10, 3 * 2.0 ** -10, 2.0 ** -6, 2.0 ** -7 * 1.0625, 2.0 ** -16,
               2.0 ** -17, 3 * 2.0 ** -17, 2.0 ** -14, 0.3, -0.7, 3.14159, 1e-8, 240.0, 232.0, 248.0]
    rand = (rng.standard_normal(200) * 10.0 ** rng.uniform(-9, 5, 200)).astype(np.float32)
    values = np.concatenate([np.array(special, np.float32), rand])
    enc = {fmt: dict(x=[int(b) for b in values.view(np.uint32)], codes=[encode(v, fmt) for v in values])
           for fmt in FORMATS}

    def data(n, lo, hi):
        return (rng.standard_normal(n) * 10.0 ** rng.uniform(lo, hi, n)).astype(np.float32)

    zeros_then = np.concatenate([np.zeros(40, np.float32), data(60, -5, -1)])
    cases = [
        quantise(data(300, -4, -1), "linear", "e4m3", 128, 128),
        quantise(data(150, -10, -6), "linear", "e5m2", 64, 20),
        quantise(data(50, -3, 0), "linear", "e4m3", 50, 50),  # one scale for the whole piece
        quantise(zeros_then, "linear", "e4m3", 32, 32),
        quantise(data(100, -4, -1), "mx", "e4m3", 32, 32),
        quantise(data(70, -10, -6), "mx", "e5m2", 32, 7),
        quantise(zeros_then, "mx", "e5m2", 32, 32),
    ]
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "quant_states",
                       "golden.json")
    with open(out, "w") as fh:
        json.dump(dict(encode=enc, cases=cases), fh, separators=(",", ":"))
        fh.write("\n")
    print("wrote", os.path.normpath(out))


if __name__ == "__main__":
    main()
