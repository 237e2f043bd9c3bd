#!/usr/bin/env python3
"""Independent float64 numpy reference of QAD's distillation loss (--qad-enable): writes
tests/data/golden/qad_kl/fixture.json.

MindSpeed's QAD (mindspeed/core/distill): per token t, with teacher logits z and student logits s
over the vocabulary and temperature tau (--kl-temperature),
    p = softmax(z / tau), q = softmax(s / tau),  kl_t = tau^2 * sum_v p_v (log p_v - log q_v)
(KL(teacher || student), with Hinton's tau^2 compensation); a micro-batch's term with loss mask m:
    mean: sum_t m_t kl_t / sum_t m_t,     sum: sum_t m_t kl_t
and the loss the student differentiates is weight * term (--kl-loss-weight). Stored per case:
the per-token kl, the reduced term, and d(weight * term)/d s computed by central differences of
this script's own float64 loss (h = 1e-6), so the fixture does not restate the C++ gradient
formula; the script asserts that the central differences agree with the analytic tau (q - p)
to 1e-7 before writing.

Logits are float32 values (rounded before use) so that Gale's float32 inputs are exactly these.
Usage: python3 tools/reference/qad_kl_reference.py   (numpy only; deterministic)
"""
import json
import os

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data", "golden", "qad_kl", "fixture.json"))
T, V = 6, 11
CASES = [
    dict(name="t1_mean", temperature=1.0, reduction="mean", weight=1.0),
    dict(name="t2_mean_w07", temperature=2.0, reduction="mean", weight=0.7),
    dict(name="t05_sum_w15", temperature=0.5, reduction="sum", weight=1.5),
    dict(name="t3_sum", temperature=3.0, reduction="sum", weight=1.0),
]


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def per_token_kl(s, z, tau):
    lp = log_softmax(z / tau)
    lq = log_softmax(s / tau)
    return tau * tau * (np.exp(lp) * (lp - lq)).sum(axis=-1)


def term(s, z, mask, tau, reduction):
    kl = per_token_kl(s, z, tau)
    if reduction == "sum":
        return float((mask * kl).sum())
    n = mask.sum()
    return float((mask * kl).sum() / n) if n > 0 else 0.0


def main():
    rng = np.random.RandomState(20261203)
    student = (rng.randn(T, V) * 2.0).astype(np.float32).astype(np.float64)
    teacher = (rng.randn(T, V) * 2.0 + 0.3 * student).astype(np.float32).astype(np.float64)
    mask = np.array([1, 1, 0, 1, 1, 0], dtype=np.float64)
    cases = []
    for c in CASES:
        tau, red, w = c["temperature"], c["reduction"], c["weight"]
        kl = per_token_kl(student, teacher, tau)
        value = term(student, teacher, mask, tau, red)
        h = 1e-6
        grad = np.zeros_like(student)
        for t in range(T):
            for v in range(V):
                up, dn = student.copy(), student.copy()
                up[t, v] += h
                dn[t, v] -= h
                grad[t, v] = w * (term(up, teacher, mask, tau, red) - term(dn, teacher, mask, tau, red)) / (2 * h)
        q = np.exp(log_softmax(student / tau))
        p = np.exp(log_softmax(teacher / tau))
        scale = mask / mask.sum() if red == "mean" else mask
        analytic = w * tau * (q - p) * scale[:, None]
        assert np.abs(grad - analytic).max() < 1e-7, np.abs(grad - analytic).max()
        cases.append(dict(c, kl=kl.tolist(), value=value, grad=grad.reshape(-1).tolist()))
    fixture = dict(T=T, V=V, student=student.reshape(-1).tolist(), teacher=teacher.reshape(-1).tolist(),
                   mask=mask.tolist(), cases=cases)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f, indent=1)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
