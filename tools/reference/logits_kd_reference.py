#!/usr/bin/env python3
"""Independent float64 reference of Megatron-LM's offline-distillation loss (--logits-load-dir):
writes tests/data/golden/logits_kd/fixture.json.

Megatron (megatron/training/distillation/cached_logits_loss.py, topk_kl_div with the ghost token,
the way CachedLogitsKDLoss calls it), restated here in float64 torch on one rank:
    ls = log_softmax(student)                     (no temperature)
    mask_k = (lp_k != -1000)                      (top-P sentinel entries count for nothing)
    S  = sum_k mask_k exp(ls[i_k]),  sr = log(clamp(1 - S, min=1e-8))
    tr = log(clamp(1 - sum_k exp(lp_k), min=1e-8))
    kl = sum_k mask_k exp(lp_k) (lp_k - ls[i_k]) + exp(tr) (tr - sr)
The loss differentiated per micro-batch is sum_t loss_mask_t kl_t; the gradient stored is
torch.autograd's of that float64 expression (not a hand-derived formula). The teacher's top-K are
computed as Megatron's saver does (top-K of the raw logits, log-softmax over the whole vocabulary,
rounded to fp16 as --logits-save-dtype fp16 stores them), and case "topp" masks entries the way
_apply_topp_truncation does (keep while the mass before the entry is < p, at least min_k).
Usage: python3 tools/reference/logits_kd_reference.py   (numpy + torch 1.13; deterministic)
"""
import json
import os

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data", "golden", "logits_kd", "fixture.json"))
T, V = 6, 13
SENTINEL = -1e3


def teacher_topk(z, k, p=None, min_k=1):
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    vals, idx = torch.topk(z, k, dim=-1)
    lp = (vals - lse).to(torch.float16).to(torch.float64)
    if p is not None:
        probs = lp.exp()
        keep = (probs.cumsum(-1) - probs) < p
        keep = keep | (torch.arange(k) < min(min_k, k))
        kmax = int(keep.sum(-1).max())
        lp, idx, keep = lp[:, :kmax], idx[:, :kmax], keep[:, :kmax]
        lp = torch.where(keep, lp, torch.full_like(lp, SENTINEL))
        idx = torch.where(keep, idx, torch.full_like(idx, 131071))  # the packed index sentinel
    return lp, idx


def kd_per_token(s, lp, idx):
    ls = torch.log_softmax(s, dim=-1)
    V = s.shape[-1]
    mask = (idx >= 0) & (idx < V) & (lp != SENTINEL)
    g = torch.gather(ls, -1, idx.clamp(0, V - 1))
    S = (g.exp() * mask).sum(-1, keepdim=True)
    sr = torch.log((1.0 - S).clamp(min=1e-8))
    tr = torch.log((1.0 - lp.exp().sum(-1, keepdim=True)).clamp(min=1e-8))
    g = torch.cat([g, sr], -1)
    t = torch.cat([lp, tr], -1)
    m = torch.cat([mask, torch.ones_like(mask[:, :1])], -1)
    return (m * t.exp() * (t - g)).sum(-1)


def main():
    rng = np.random.RandomState(20261204)
    student = (rng.randn(T, V) * 2.0).astype(np.float32).astype(np.float64)
    teacher = (rng.randn(T, V) * 2.5 + 0.4 * student).astype(np.float32).astype(np.float64)
    loss_mask = np.array([1, 1, 0, 1, 1, 1], dtype=np.float64)
    z = torch.tensor(teacher)
    cases = []
    for name, k, p, min_k in [("top4", 4, None, 1), ("topp", 8, 0.6, 2), ("full", V, None, 1)]:
        lp, idx = teacher_topk(z, k, p, min_k)
        s = torch.tensor(student, requires_grad=True)
        kl = kd_per_token(s, lp, idx)
        loss = (kl * torch.tensor(loss_mask)).sum()
        loss.backward()
        cases.append(dict(name=name, K=int(lp.shape[1]), logprobs=lp.flatten().tolist(),
                          indices=idx.flatten().tolist(), kl=kl.detach().tolist(), loss=float(loss),
                          grad=s.grad.flatten().tolist()))
    fixture = dict(T=T, V=V, student=student.flatten().tolist(), teacher=teacher.flatten().tolist(),
                   loss_mask=loss_mask.tolist(), cases=cases)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(fixture, f)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
