#!/usr/bin/python3
"""Golden values for Gale's DeepSeek sparse attention kernels (numpy, float64).

An independent, dense-matrix restatement of DeepSeek-V3.2's DSA (Megatron-Core's
compute_dsa_indexer_loss / unfused_dsa_fn semantics) on a tiny random problem with a causal mask:
  index scores  I[b,i,j] = sum_h w[i,h] * relu(qI[i,h] . kI[j])         (visible j <= i)
  top-k         the K best visible keys per query (ties: the earlier key), -1 padded
  sparse attn   out = softmax over the selected keys of scale * q.k, times v; lse
  indexer loss  sum over rows of KL(target || softmax(I)), target = head-mean of softmax(scale*q.k)
                over every visible key (dense) or the selected ones (sparse)
and the gradients: of sum(out * dout) w.r.t. q, k, v (sparse attention) and of the KL sums w.r.t.
qI, kI, w (the indexer), checked here against float64 central differences before writing.
Rows are token rows t = s*B + b, as in Gale. Writes tests/data/golden/dsa_kernels/fixture.json, read by
tests/kernels/dsa_kernels_test.cc.

    /usr/bin/python3 tools/reference/dsa_reference.py     # numpy only, < 1 s
"""
import json
import os

import numpy as np

B, S, NI, DI, K, NH, HD = 2, 7, 2, 4, 3, 2, 5
SCALE = 1.0 / np.sqrt(HD)
EPS = 1e-10
rng = np.random.default_rng(20261203)
T = S * B


def rows(x):  # [T, ...] token rows t = s*B + b  ->  [B, S, ...]
    return x.reshape(S, B, *x.shape[1:]).swapaxes(0, 1)


qI = rng.standard_normal((T, NI, DI))
kI = rng.standard_normal((T, DI))
wI = rng.standard_normal((T, NI)) * 0.5
q = rng.standard_normal((T, NH, HD))
k = rng.standard_normal((T, NH, HD))
v = rng.standard_normal((T, NH, HD))
dout = rng.standard_normal((T, NH, HD))
causal = np.tril(np.ones((S, S), dtype=bool))


def index_scores(qI, kI, wI):
    qb, kb, wb = rows(qI), rows(kI), rows(wI)          # [B,S,NI,DI], [B,S,DI], [B,S,NI]
    s = np.einsum("bihd,bjd->bihj", qb, kb)
    return np.einsum("bih,bihj->bij", wb, np.maximum(s, 0.0))  # [B,S,S]


def topk(I):
    idx = -np.ones((B, S, K), dtype=np.int64)
    for b in range(B):
        for i in range(S):
            js = np.arange(i + 1)
            order = np.lexsort((js, -I[b, i, js]))  # score descending, then the earlier key
            chosen = np.sort(js[order[:K]])
            idx[b, i, :len(chosen)] = chosen
    return idx


def selected_mask(idx):
    m = np.zeros((B, S, S), dtype=bool)
    for b in range(B):
        for i in range(S):
            for j in idx[b, i]:
                if j >= 0:
                    m[b, i, j] = True
    return m


def softmax_masked(x, mask):
    x = np.where(mask, x, -np.inf)
    mx = x.max(axis=-1, keepdims=True)
    e = np.where(mask, np.exp(x - mx), 0.0)
    return e / e.sum(axis=-1, keepdims=True), (mx + np.log(e.sum(axis=-1, keepdims=True)))[..., 0]


def sparse_attention(q, k, v, sel):
    qb, kb, vb = rows(q), rows(k), rows(v)              # [B,S,NH,HD]
    a = SCALE * np.einsum("bihd,bjhd->bhij", qb, kb)
    p, lse = softmax_masked(a, sel[:, None])
    out = np.einsum("bhij,bjhd->bihd", p, vb)           # [B,S,NH,HD]
    return out.swapaxes(0, 1).reshape(T, NH, HD), lse   # lse [B,NH,S]


def kl_sum(qI, kI, wI, q, k, mask):
    I = index_scores(qI, kI, wI)
    pi, _ = softmax_masked(I, mask)
    a = SCALE * np.einsum("bihd,bjhd->bhij", rows(q), rows(k))
    P, _ = softmax_masked(a, mask[:, None])
    target = P.sum(axis=1)
    target = target / target.sum(axis=-1, keepdims=True)
    return float(np.sum(np.where(mask, target * (np.log(target + EPS) - np.log(pi + EPS)), 0.0)))


def kl_grads(qI, kI, wI, q, k, mask):
    """Analytic d(kl_sum)/d(qI, kI, wI), dense-matrix form."""
    qb, kb, wb = rows(qI), rows(kI), rows(wI)
    s = np.einsum("bihd,bjd->bihj", qb, kb)
    r = np.maximum(s, 0.0)
    I = np.einsum("bih,bihj->bij", wb, r)
    pi, _ = softmax_masked(I, mask)
    a = SCALE * np.einsum("bihd,bjhd->bhij", rows(q), rows(k))
    P, _ = softmax_masked(a, mask[:, None])
    target = P.sum(axis=1)
    target = target / target.sum(axis=-1, keepdims=True)
    dpi = np.where(mask, -target / (pi + EPS), 0.0)
    dI = pi * (dpi - (pi * dpi).sum(axis=-1, keepdims=True))
    dw = np.einsum("bij,bihj->bih", dI, r)
    ds = dI[:, :, None, :] * wb[..., None] * (s > 0)
    dq = np.einsum("bihj,bjd->bihd", ds, kb)
    dk = np.einsum("bihj,bihd->bjd", ds, qb)
    back = lambda x: x.swapaxes(0, 1).reshape(T, *x.shape[2:])
    return back(dq), back(dk), back(dw)


def attention_grads(q, k, v, sel):
    qb, kb, vb, db = rows(q), rows(k), rows(v), rows(dout)
    a = SCALE * np.einsum("bihd,bjhd->bhij", qb, kb)
    p, _ = softmax_masked(a, sel[:, None])
    dv = np.einsum("bhij,bihd->bjhd", p, db)
    dp = np.einsum("bihd,bjhd->bhij", db, vb)
    da = p * (dp - (p * dp).sum(axis=-1, keepdims=True))
    dq = SCALE * np.einsum("bhij,bjhd->bihd", da, kb)
    dk = SCALE * np.einsum("bhij,bihd->bjhd", da, qb)
    back = lambda x: x.swapaxes(0, 1).reshape(T, NH, HD)
    return back(dq), back(dk), back(dv)


def check_fd(f, x, g, name):
    """Central differences of f at x along a few random directions against the analytic g."""
    for trial in range(3):
        d = rng.standard_normal(x.shape)
        h = 1e-6
        xp, xm = x + h * d, x - h * d
        num = (f(xp) - f(xm)) / (2 * h)
        ana = float(np.sum(g * d))
        assert abs(num - ana) <= 1e-6 * max(1.0, abs(ana)), (name, num, ana)


I = index_scores(qI, kI, wI)
idx = topk(I)
sel = selected_mask(idx)
dense = np.broadcast_to(causal, (B, S, S))
out, lse = sparse_attention(q, k, v, sel)
aq, ak, av = attention_grads(q, k, v, sel)
loss = lambda q_, k_, v_: float(np.sum(sparse_attention(q_, k_, v_, sel)[0] * dout))
check_fd(lambda x: loss(x, k, v), q, aq, "attention dq")
check_fd(lambda x: loss(q, x, v), k, ak, "attention dk")
check_fd(lambda x: loss(q, k, x), v, av, "attention dv")

fixture = {
    "B": B, "S": S, "NI": NI, "DI": DI, "K": K, "NH": NH, "HD": HD, "scale": SCALE,
    "qI": qI.ravel().tolist(), "kI": kI.ravel().tolist(), "w": wI.ravel().tolist(),
    "q": q.ravel().tolist(), "k": k.ravel().tolist(), "v": v.ravel().tolist(), "dout": dout.ravel().tolist(),
    "idx": idx.swapaxes(0, 1).reshape(T, K).ravel().tolist(),
    "out": out.ravel().tolist(), "lse": lse.ravel().tolist(),
    "attention_dq": aq.ravel().tolist(), "attention_dk": ak.ravel().tolist(), "attention_dv": av.ravel().tolist(),
}
for name, mask in (("dense", dense), ("sparse", sel & dense)):
    kq, kk, kw = kl_grads(qI, kI, wI, q, k, mask)
    check_fd(lambda x: kl_sum(x, kI, wI, q, k, mask), qI, kq, name + " dqI")
    check_fd(lambda x: kl_sum(qI, x, wI, q, k, mask), kI, kk, name + " dkI")
    check_fd(lambda x: kl_sum(qI, kI, x, q, k, mask), wI, kw, name + " dw")
    fixture["kl_" + name] = kl_sum(qI, kI, wI, q, k, mask)
    fixture["kl_" + name + "_dq"] = kq.ravel().tolist()
    fixture["kl_" + name + "_dk"] = kk.ravel().tolist()
    fixture["kl_" + name + "_dw"] = kw.ravel().tolist()

out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "golden", "dsa_kernels")
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, "fixture.json"), "w") as f:
    json.dump(fixture, f)
print("wrote", os.path.normpath(os.path.join(out_dir, "fixture.json")))
