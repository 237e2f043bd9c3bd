#!/usr/bin/python3
"""Float64 golden values for Gale's MoE router (src/model/moe_router.h): Megatron-Core TopKRouter
semantics written independently with PyTorch autograd.

For each case: random x [T, H], router weight W [E, H], expert bias b [E] and a projection R [T, k];
the script routes (softmax or sigmoid scores, group-limited top-k on the routing values, weights
normalised and scaled, token dropping by capacity; or Megatron's sinkhorn routing in training: the
top-k of the Sinkhorn-balanced logits, weights the sigmoid (top-1) or softmax scores there), computes the auxiliary losses (aux_loss or
seq_aux_loss on the plain top-k of p, z-loss) and the gradients of
    J = sum over kept (token, slot) of R[t, j] * w[t, j] + aux_coeff * aux + z_coeff * z
with respect to x and W. Writes tests/data/reference/moe_router/golden.json. Usage:

    /usr/bin/python3 tools/reference/moe_router_reference.py

Needs only torch (1.13 used for the committed file) and is deterministic.
"""
import json
import math
import os
import sys

import torch

torch.set_default_dtype(torch.float64)

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "moe_router", "golden.json")

CASES = [
    dict(name="softmax_groups_scaled", T=12, B=3, H=6, E=8, k=2, score="softmax", pre_softmax=False, bias=False,
         groups=4, group_topk=2, scaling=2.5, lb="aux_loss", aux_coeff=0.3, z_coeff=0.05, capacity=None,
         policy="probs"),
    dict(name="sigmoid_bias_groups_seq_aux", T=12, B=3, H=6, E=8, k=3, score="sigmoid", pre_softmax=False, bias=True,
         groups=4, group_topk=3, scaling=1.5, lb="seq_aux_loss", aux_coeff=0.2, z_coeff=0.01, capacity=None,
         policy="probs"),
    dict(name="sigmoid_top1_bias_aux", T=10, B=2, H=5, E=6, k=1, score="sigmoid", pre_softmax=False, bias=True,
         groups=None, group_topk=None, scaling=None, lb="aux_loss", aux_coeff=0.4, z_coeff=0.0, capacity=None,
         policy="probs"),
    dict(name="sigmoid_drop_probs", T=16, B=2, H=6, E=4, k=2, score="sigmoid", pre_softmax=False, bias=True,
         groups=None, group_topk=None, scaling=None, lb="aux_loss", aux_coeff=0.1, z_coeff=0.02, capacity=0.5,
         policy="probs"),
    dict(name="softmax_pre_drop_position_seq_aux", T=12, B=4, H=6, E=4, k=2, score="softmax", pre_softmax=True,
         bias=False, groups=None, group_topk=None, scaling=None, lb="seq_aux_loss", aux_coeff=0.25, z_coeff=0.0,
         capacity=0.75, policy="position"),
    dict(name="sinkhorn_top2_z_drop", T=12, B=3, H=6, E=4, k=2, score="softmax", pre_softmax=False, bias=False,
         groups=None, group_topk=None, scaling=None, lb="sinkhorn", aux_coeff=0.0, z_coeff=0.03, capacity=1.0,
         policy="probs"),
    dict(name="sinkhorn_top1", T=10, B=2, H=5, E=4, k=1, score="softmax", pre_softmax=False, bias=False,
         groups=None, group_topk=None, scaling=None, lb="sinkhorn", aux_coeff=0.0, z_coeff=0.0, capacity=None,
         policy="probs"),
]


def sinkhorn(logits, tol=1e-4):
    """Sinkhorn balancing of exp(logits) [T, E]: alternately scale rows to 1/T and columns to 1/E."""
    cost = torch.exp(logits)
    T, E = cost.shape
    row_scale, col_scale = torch.ones(T), torch.ones(E)
    while True:
        row_scale = 1.0 / T / ((cost * col_scale).sum(1) + 1e-8)
        new_col = 1.0 / E / ((cost * row_scale[:, None]).sum(0) + 1e-8)
        change = (new_col - col_scale).abs().mean()
        col_scale = new_col
        if not change > tol:
            return cost * row_scale[:, None] * col_scale


def group_limited_topk(v, k, groups, group_topk):
    """Top-k of v [T, E] restricted to the best group_topk groups (score: sum of each group's top k/group_topk)."""
    T, E = v.shape
    if not group_topk:
        return torch.topk(v, k, dim=-1)[1]
    per = E // groups
    gscore = v.reshape(T, groups, per).topk(k // group_topk, dim=-1)[0].sum(-1)  # [T, G]
    chosen = gscore.topk(group_topk, dim=-1)[1]
    allowed = torch.zeros(T, groups, dtype=torch.bool)
    allowed[torch.arange(T).unsqueeze(1), chosen] = True
    allowed = allowed.repeat_interleave(per, dim=1)
    return torch.topk(v.masked_fill(~allowed, float("-inf")), k, dim=-1)[1]


def margin(v, idx, k):
    """Smallest gap between the k-th chosen routing value and the best unchosen one (a float32 safety check)."""
    T, E = v.shape
    gaps = []
    for t in range(T):
        chosen = set(idx[t].tolist())
        kth = min(v[t, e].item() for e in chosen)
        rest = [v[t, e].item() for e in range(E) if e not in chosen]
        if rest:
            gaps.append(kth - max(rest))
    return min(gaps) if gaps else 1.0


def route(case, x, W, b, R):
    T, E, k, B = case["T"], case["E"], case["k"], case["B"]
    logits = x @ W.T  # [T, E]
    if case["lb"] == "sinkhorn":  # training: the choice on the balanced logits, the weights on the scores
        s_all = torch.sigmoid(logits) if k == 1 else torch.softmax(logits, dim=-1)
        v = sinkhorn(logits.detach())
        idx = torch.topk(v, k, dim=-1)[1]
        w = s_all.gather(1, idx)
        p = s_all
    elif case["score"] == "softmax":
        s_all = torch.softmax(logits, dim=-1)
        v = s_all if case["pre_softmax"] else logits
        idx = group_limited_topk(v.detach(), k, case["groups"], case["group_topk"])
        if case["pre_softmax"]:
            w = s_all.gather(1, idx)
        else:
            w = torch.softmax(logits.gather(1, idx), dim=-1)
        p = s_all
    else:
        sig = torch.sigmoid(logits)
        v = sig + b if case["bias"] else sig
        idx = group_limited_topk(v.detach(), k, case["groups"], case["group_topk"])
        w = sig.gather(1, idx)
        if k > 1:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        p = sig / (sig.sum(-1, keepdim=True) + 1e-20)
    if case["scaling"]:
        w = w * case["scaling"]
    # token dropping: each expert keeps at most C pairs of the T tokens
    kept = torch.ones(T, k, dtype=torch.bool)
    if case["capacity"]:
        C = math.ceil(T * k / E * case["capacity"])
        if C <= T:
            for e in range(E):
                pairs = [(t, j) for t in range(T) for j in range(k) if idx[t, j].item() == e]
                if case["policy"] == "probs":
                    pairs.sort(key=lambda tj: (-w[tj[0], tj[1]].item(), tj[0]))
                for t, j in pairs[C:]:
                    kept[t, j] = False
    # aux losses on the plain top-k of p
    aux = torch.zeros(())
    if case["aux_coeff"] > 0:
        top = torch.topk(p.detach(), k, dim=-1)[1]
        routed = torch.zeros(T, E).scatter(1, top, 1.0)
        G = B if case["lb"] == "seq_aux_loss" else 1
        seq = torch.arange(T) % G  # rows t = s*B + b
        for g in range(G):
            rows = seq == g
            n = routed[rows].sum(0)
            N = int(rows.sum())
            aux = aux + E / (N * N * k) * (p[rows].sum(0) * n).sum() / G
    z = (torch.logsumexp(logits, dim=-1) ** 2).mean()
    J = (R * w * kept).sum() + case["aux_coeff"] * aux + case["z_coeff"] * z
    return logits, v, idx, w, kept, aux, z, J


def main():
    cases = []
    for i, case in enumerate(CASES):
        g = torch.Generator().manual_seed(1000 + i)
        T, H, E, k = case["T"], case["H"], case["E"], case["k"]
        for attempt in range(200):  # inputs whose top-k choices have a float32-safe margin
            x = (torch.rand(T, H, generator=g) * 2 - 1).requires_grad_(True)
            W = (torch.rand(E, H, generator=g) * 2 - 1).requires_grad_(True)
            b = (torch.rand(E, generator=g) * 0.2 - 0.1)
            R = torch.rand(T, k, generator=g) * 2 - 1
            logits, v, idx, w, kept, aux, z, J = route(case, x, W, b, R)
            ok = margin(v.detach(), idx, k) > 1e-4
            if ok and case["group_topk"]:
                per = E // case["groups"]
                gs = v.detach().reshape(T, case["groups"], per).topk(k // case["group_topk"], dim=-1)[0].sum(-1)
                srt = gs.sort(dim=-1, descending=True)[0]
                ok = bool((srt[:, case["group_topk"] - 1] - srt[:, case["group_topk"]]).min() > 1e-4)
            if ok and case["capacity"]:  # clear weight order inside each expert's pairs
                ww = sorted(w.detach().flatten().tolist())
                ok = min(b2 - a2 for a2, b2 in zip(ww, ww[1:])) > 1e-5 and not bool(kept.all())
            if ok:
                break
        else:
            sys.exit(f"{case['name']}: no input with clear margins")
        J.backward()
        experts = torch.where(kept, idx, torch.full_like(idx, -1))
        cases.append(dict(
            case,
            x=x.detach().flatten().tolist(), W=W.detach().flatten().tolist(), bias=b.tolist() if case["bias"] else [],
            R=R.flatten().tolist(), experts=experts.flatten().tolist(), probs=w.detach().flatten().tolist(),
            aux=aux.item(), z=z.item(), dx=x.grad.flatten().tolist(), dW=W.grad.flatten().tolist()))
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"generator": "tools/reference/moe_router_reference.py", "torch": torch.__version__, "cases": cases},
                  f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.normpath(OUT)} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
