#!/usr/bin/python3
"""Float64 golden values for Gale's quantile balancing (src/model/moe_router.h: moe_qb_dual_update,
update_qb_beta; src/train/grad_sync.cc: the step-end update), written independently from Megatron-LM
main's description of qb_dual_update (moe_utils.py) and _update_router_qb_beta
(finalize_model_grads.py) with numpy.

qb_dual_update(scores [m, E], k, beta [E]):
  v = scores - beta; per token the k largest v (best first) are the chosen experts and
  alpha_t = the (k+1)-th largest v; in training also, per expert e, the (m*k/E + 1)-th largest of
  scores[:, e] - alpha over the m tokens (the column quantile).
The step update, per layer: avg = mean over the step's micro-batches of the quantile, averaged over
the data-parallel ranks; beta = ema * beta + (1 - ema) * avg; beta -= mean(beta).

Cases: single dual updates (several shapes, a non-zero beta), and a few steps of a 2-rank x
2-micro-batch run with ema 0 and ema 0.5. The logits are float32 values (what the C++ reads), the
arithmetic float64. Writes tests/data/reference/quantile_balancing/golden.json. Usage:

    /usr/bin/python3 tools/reference/quantile_balancing_reference.py

Needs only numpy; deterministic.
"""
import json
import os

import numpy as np

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "quantile_balancing",
                   "golden.json")


def kth_largest_desc_order(row):
    # experts by decreasing value, ties: the lower expert first
    return sorted(range(len(row)), key=lambda e: (-row[e], e))


def dual_update(scores, k, beta, update):
    m, E = scores.shape
    v = scores - beta[None, :]
    indices = np.zeros((m, k), dtype=np.int64)
    alpha = np.zeros(m)
    for t in range(m):
        order = kth_largest_desc_order(v[t])
        indices[t] = order[:k]
        alpha[t] = v[t, order[k]]
    if not update:
        return indices, None
    assert (m * k) % E == 0
    target = m * k // E
    cols = scores - alpha[:, None]
    quantile = np.array([np.sort(cols[:, e])[::-1][target] for e in range(E)])
    return indices, quantile


def margin(scores, k, beta):
    # the smallest gap between a token's k-th and (k+1)-th v: the choice is robust to f32 rounding
    v = np.sort(scores - beta[None, :], axis=1)[:, ::-1]
    return float(np.min(v[:, k - 1] - v[:, k]))


def logits(rng, m, E):
    return rng.standard_normal((m, E)).astype(np.float32).astype(np.float64)


def main():
    rng = np.random.default_rng(20261204)
    out = {"dual_update": [], "steps": []}
    for name, m, E, k, with_beta in [("m16_e8_k2", 16, 8, 2, False), ("m24_e6_k1", 24, 6, 1, True),
                                     ("m12_e4_k3", 12, 4, 3, True), ("m32_e16_k4", 32, 16, 4, True)]:
        s = logits(rng, m, E)
        beta = (0.3 * rng.standard_normal(E)).astype(np.float32).astype(np.float64) if with_beta else np.zeros(E)
        indices, quantile = dual_update(s, k, beta, True)
        assert margin(s, k, beta) > 1e-5, name
        out["dual_update"].append(dict(name=name, m=m, E=E, k=k, scores=s.ravel().tolist(), beta=beta.tolist(),
                                       indices=indices.ravel().tolist(), quantile=quantile.tolist()))
    for ema in (0.0, 0.5):
        ranks, micro, m, E, k, steps = 2, 2, 8, 4, 2, 3
        beta = np.zeros(E)
        batches, betas = [], []
        for step in range(steps):
            per_rank = []
            step_logits = []
            for r in range(ranks):
                acc = np.zeros(E)
                for j in range(micro):
                    s = logits(rng, m, E)
                    step_logits.append(s.ravel().tolist())
                    _, q = dual_update(s, k, beta, True)
                    acc += q
                per_rank.append(acc / micro)
            avg = np.mean(per_rank, axis=0)
            beta = ema * beta + (1.0 - ema) * avg
            beta = beta - beta.mean()
            batches.append(step_logits)
            betas.append(beta.tolist())
        out["steps"].append(dict(ema=ema, ranks=ranks, micro_batches=micro, m=m, E=E, k=k, logits=batches,
                                 betas=betas))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
