#!/usr/bin/env python3
"""Golden draws of numpy's legacy RandomState.binomial / randint(size=2) / random_sample.

Megatron's FIM dataset draws np_rng.binomial(1, rate) and np_rng.randint(low=0, high=L + 1, size=2)
(data/fim.h); this records, per case, the values numpy itself returns and then one
random_sample(), which shows how many raw draws the calls consumed.
Run: /tmp/fim_venv/bin/python tools/reference/numpy_binomial_reference.py (numpy 1.26; Debian's
numpy 1.24 gives the same values). Writes tests/data/reference/numpy_binomial.json.
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference",
                   "numpy_binomial.json")


def main():
    cases = []
    for seed, n, p in [(1, 1, 0.5), (2, 1, 0.3), (3, 1, 0.7), (4, 1, 1.0), (5, 1, 0.999), (6, 5, 0.25),
                       (7, 20, 0.6), (8, 30, 0.9), (9, 1, 1e-9), (10, 60, 0.5)]:
        rs = np.random.RandomState(seed)
        values = [int(rs.binomial(n, p)) for _ in range(64)]
        cases.append({"seed": seed, "n": n, "p": p, "values": values, "next_random_sample": rs.random_sample()})
    randint = []
    for seed, high in [(11, 1), (12, 2), (13, 50), (14, 1000), (15, 70000)]:
        rs = np.random.RandomState(seed)
        pairs = [[int(v) for v in rs.randint(low=0, high=high, size=2)] for _ in range(16)]
        randint.append({"seed": seed, "high": high, "pairs": pairs, "next_random_sample": rs.random_sample()})
    with open(OUT, "w") as f:
        json.dump({"numpy": np.__version__, "binomial": cases, "randint": randint}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
