# YaRN rotary tables as Megatron-Core's YarnRotaryEmbedding builds them, for Gale's --position-embedding-type yarn test.
#
#   python3 tools/reference/yarn_rope_reference.py   # numpy only
#
# Writes tests/data/reference/rope/yarn_tables.json: for a few (rotary width R, base, scaling factor s,
# original context, beta_fast, beta_slow, mscale, mscale_all_dim, round_to_int) cases, cos and sin at
# some positions, computed in float64 from the formulas of Megatron's yarn_rotary_pos_embedding.py
# (read there, written here independently of Gale's C++): the correction range
#   d(n) = R ln(original / (2 pi n)) / (2 ln base), low = d(beta_fast), high = d(beta_slow)
# (floor / ceil when round_to_int), clamped to [0, R - 1]; the ramp over i < R/2 (high += 0.001 when
# low == high); inv = inv_inter (1 - mask) + inv_extra mask with mask = 1 - ramp; cos/sin times
# m(s, mscale) / m(s, mscale_all_dim), m(s, x) = 0.1 x ln s + 1 (1 for s <= 1).
import json
import math
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference", "rope",
                   "yarn_tables.json")


def get_mscale(scale, mscale):
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn(R, base, s, original, beta_fast, beta_slow, mscale, mscale_all_dim, round_to_int, positions):
    exps = np.arange(0, R, 2, dtype=np.float64) / R
    inv_extra = 1.0 / base ** exps
    inv_inter = 1.0 / (s * base ** exps)

    def dim(rot):
        return R * math.log(original / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim(beta_fast), dim(beta_slow)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, R - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(R // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    mask = 1.0 - ramp
    inv = inv_inter * (1 - mask) + inv_extra * mask
    factor = get_mscale(s, mscale) / get_mscale(s, mscale_all_dim)
    angles = np.outer(np.array(positions, dtype=np.float64), inv)
    return {"R": R, "base": base, "scaling_factor": s, "original_max_positions": original, "beta_fast": beta_fast,
            "beta_slow": beta_slow, "mscale": mscale, "mscale_all_dim": mscale_all_dim, "round_to_int": round_to_int,
            "positions": positions, "concentration": factor, "low": low, "high": high,
            "cos": (np.cos(angles) * factor).tolist(), "sin": (np.sin(angles) * factor).tolist()}


positions = [0, 1, 7, 100, 1000, 4095, 16383]
cases = [
    yarn(64, 10000.0, 4.0, 4096, 32.0, 1.0, 1.0, 0.0, True, positions),      # Megatron's defaults, s = 4
    yarn(128, 1000000.0, 4.0, 32768, 32.0, 1.0, 1.0, 0.0, True, positions),  # a Qwen-style long-context model
    yarn(16, 10000.0, 8.0, 256, 16.0, 2.0, 0.707, 0.3, False, positions),  # fractional range, mscale pair
    yarn(8, 500.0, 2.0, 64, 32.0, 1.0, 1.0, 0.5, True, positions),           # the range clamps to [0, R - 1]
]
os.makedirs(os.path.dirname(OUT), exist_ok=True)
with open(OUT, "w") as f:
    json.dump({"about": "tools/reference/yarn_rope_reference.py (numpy, float64)", "cases": cases}, f)
    f.write("\n")
print(OUT, [(c["low"], c["high"], round(c["concentration"], 4)) for c in cases])
