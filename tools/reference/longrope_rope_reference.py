# LongRoPE cos/sin tables in float64 with numpy, restated from transformers' _compute_longrope_parameters
# (inv_freq = 1 / (factor * base^(arange(0, R, 2) / R)), cos/sin times the attention factor
# sqrt(1 + ln(max / original) / ln(original)), 1 when max <= original) and MindSpeed-LLM's explicit
# --short-mscale / --long-mscale.
#
#   /usr/bin/python3 tools/reference/longrope_rope_reference.py   # writes tests/data/reference/rope/longrope_tables.json
import json
import math
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference", "rope",
                   "longrope_tables.json")


def table(R, base, factors, mscale, positions):
    inv = 1.0 / (np.array(factors, dtype=np.float64) * base ** (np.arange(0, R, 2, dtype=np.float64) / R))
    ang = np.array(positions, dtype=np.float64)[:, None] * inv[None, :]
    return (np.cos(ang) * mscale).tolist(), (np.sin(ang) * mscale).tolist()


def attention_factor(max_pos, original):
    s = max_pos / original
    return 1.0 if s <= 1.0 else math.sqrt(1 + math.log(s) / math.log(original))


def main():
    rng = np.random.default_rng(7)
    cases = []
    # Phi-3.5-mini's shape (96-wide heads, 4096 -> 131072), a tiny one, and explicit mscales (Phi-3.5-MoE's).
    for R, base, original, max_pos, mscales in [(96, 10000.0, 4096, 131072, None), (16, 10000.0, 8, 64, None),
                                                (16, 500000.0, 8, 8, None), (32, 10000.0, 16, 64, (1.1, 1.243))]:
        short = [float(x) for x in np.round(1.0 + rng.random(R // 2) * 2.0, 6)]
        long = [float(x) for x in np.round(1.0 + rng.random(R // 2) * 30.0, 6)]
        default = attention_factor(max_pos, original)
        ms, ml = mscales if mscales else (default, default)
        positions = [0, 1, 7, original, max_pos - 1]
        sc, ss = table(R, base, short, ms, positions)
        lc, ls = table(R, base, long, ml, positions)
        cases.append({"R": R, "base": base, "original": original, "max_positions": max_pos,
                      "short_factor": short, "long_factor": long,
                      "mscales_given": mscales is not None, "short_mscale": ms, "long_mscale": ml,
                      "default_mscale": default, "positions": positions,
                      "short_cos": sc, "short_sin": ss, "long_cos": lc, "long_sin": ls})
    with open(OUT, "w") as f:
        json.dump({"cases": cases}, f)
        f.write("\n")
    print("wrote", OUT, [c["default_mscale"] for c in cases])


if __name__ == "__main__":
    main()
