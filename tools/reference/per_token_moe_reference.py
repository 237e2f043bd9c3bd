#!/usr/bin/python3
"""Float64 golden values for the MoE router's auxiliary losses under --calculate-per-token-loss
(src/model/moe_router.h, MoeRouterKey::per_token_loss): Megatron-LM main's per-token path written
independently with PyTorch autograd on one rank (TP = CP = DP = 1).

One step of M micro-batches. Micro-batch m has x_m [T, H] (T = S*B rows t = s*B + b), a loss mask
mask_m [T] and a projection R_m [T, k] standing for the main loss's gradient through the routing
weights w (softmax over the selected top-k logits). Megatron in that mode:
  - the main loss is the masked sum (no division): main_m = sum_t mask_t * sum_j R_tj * w_tj;
  - router.py attach_and_log_load_balancing_loss / apply_z_loss pre-multiply every auxiliary loss by
    num_local_tokens * tp_cp_group.size() = T;
  - schedules.py sets MoEAuxLossAutoScaler's scale to the loss scale alone (1 here);
  - global_aux_loss uses the running mean of the step's token counts (ga_steps);
  - finalize_model_grads divides every gradient by the step's loss tokens sum_m sum_t mask_m,t.
So the router weight's gradient is d/dW [ sum_m (main_m + T * sum_kind coeff * loss_m) ] / sum mask.
The default mode's gradient (the losses not multiplied, each micro-batch's main loss divided by its
mask sum and every term by M) is written too, for the comparison of the two modes.
Writes tests/data/reference/moe_router/per_token.json. Usage:

    /usr/bin/python3 tools/reference/per_token_moe_reference.py

Needs only torch (1.13 used for the committed file) and is deterministic.
"""
import json
import os

import torch

torch.set_default_dtype(torch.float64)

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "moe_router", "per_token.json")

M, S, B, H, E, K = 3, 4, 2, 5, 4, 2
T = S * B
COEFFS = dict(aux_loss=0.3, seq_aux_loss=0.2, global_aux_loss=0.25, z_loss=0.05)


def rounded(t):
    return [float(v) for v in t.reshape(-1).tolist()]


def aux_terms(logits, counts_global):
    """The four losses of one micro-batch (softmax scores), each without its coefficient."""
    p = torch.softmax(logits, dim=-1)
    top = torch.topk(logits.detach(), K, dim=-1).indices
    hit = torch.zeros(T, E)
    hit.scatter_(1, top, 1.0)
    n = hit.sum(0)
    aux = E / (T * T * K) * (p.sum(0) * n).sum()
    # seq_aux_loss: per sequence b (rows t with t % B == b), averaged over the B sequences
    seq = 0.0
    for b in range(B):
        rows = torch.arange(b, T, B)
        Ts = rows.numel()
        seq = seq + E / (Ts * Ts * K) * (p[rows].sum(0) * hit[rows].sum(0)).sum()
    seq = seq / B
    z = (torch.logsumexp(logits, dim=-1) ** 2).sum() / T
    return aux, seq, z, n, p


def main():
    g = torch.Generator().manual_seed(1234)
    W = torch.randn(E, H, generator=g) * 0.5
    xs = [torch.randn(T, H, generator=g) for _ in range(M)]
    Rs = [torch.randn(T, K, generator=g) for _ in range(M)]
    masks = [(torch.rand(T, generator=g) > 0.4).double() for _ in range(M)]
    masks[0][0] = 1.0
    out = dict(M=M, S=S, B=B, H=H, E=E, k=K, coeffs=COEFFS, W=rounded(W), x=[rounded(x) for x in xs],
               R=[rounded(r) for r in Rs], mask=[rounded(m) for m in masks])
    total = sum(m.sum() for m in masks)
    for mode in ("per_token", "default"):
        Wp = W.clone().requires_grad_(True)
        counts_sum = torch.zeros(E)
        J = 0.0
        for m in range(M):
            logits = xs[m] @ Wp.t()
            aux, seq, z, n, _ = aux_terms(logits, None)
            counts_sum = counts_sum + n
            nbar = counts_sum / (m + 1)
            p = torch.softmax(logits, dim=-1)
            glob = E / (T * T * K) * (p.sum(0) * nbar).sum()
            top = torch.topk(logits.detach(), K, dim=-1).indices
            w = torch.softmax(torch.gather(logits, 1, top), dim=-1)
            main = (masks[m][:, None] * Rs[m] * w).sum()
            losses = (COEFFS["aux_loss"] * aux + COEFFS["seq_aux_loss"] * seq + COEFFS["global_aux_loss"] * glob +
                      COEFFS["z_loss"] * z)
            if mode == "per_token":
                J = J + main + T * losses
            else:
                J = J + main / masks[m].sum() / M + losses / M
            if mode == "per_token":
                out.setdefault("losses", []).append(
                    dict(load_balancing=float(aux), seq_load_balancing=float(seq), global_load_balancing=float(glob),
                         z=float(z)))
        J.backward()
        grad = Wp.grad / total if mode == "per_token" else Wp.grad
        out["dW_" + mode] = rounded(grad)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
