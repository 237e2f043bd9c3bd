#!/usr/bin/env python3
"""Independent float64 PyTorch reference of offline DPO (--stage dpo): writes tests/data/golden/dpo_llama/.

The policy is the committed "llama" golden model (tests/data/golden/llama/weights.safetensors, read
as it is) run by gpt_reference.py's forward pass; the frozen reference model is the same weights
plus small seeded noise (rounded to bfloat16, so float32 Gale reads exactly these values). One
micro-batch holds 2 preference pairs: rows 0-1 the chosen sequences, rows 2-3 the rejected ones of
the same prompts (MindSpeed-LLM's pairwise collator order), as the model consumes them: tokens,
next-token labels, a loss mask that is 1 only on response labels, positions 0..S-1; right padding
with id 0 and mask 0.

DPO as MindSpeed-LLM's DPOTrainer states it (written here from the paper's formulas, with autograd):
log-probabilities are sums over the masked labels of log_softmax(logits)[label] (ipo: divided by
the label count); x = (pc - pr) - (rc - rr); sigmoid: -(1-e) logsigmoid(b x) - e logsigmoid(-b x);
hinge: relu(1 - b x); ipo: (x - 1/(2b))^2; plus pref_ftx * (-pc / nc) when pref_ftx > 1e-6; the
micro-batch loss is the mean over pairs. Written:

  reference_weights.safetensors  the reference model (bf16 values)
  inputs.safetensors             tokens, labels, loss_mask, position_ids [4, S] (int64 / f32)
  grads.safetensors              d loss / d policy parameter for the first configuration (f32)
  fixture.json                   per configuration: options, loss, rewards, accuracy, the policy's and
                                 reference's log-probabilities, the global gradient norm; and the
                                 finite-difference check of this reference's own gradient

Usage: /tmp/tv/bin/python tools/reference/dpo_reference.py   (torch 2.5.1, numpy, safetensors 0.8.0)
Deterministic: rerunning reproduces the committed files.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402  (the llama model's forward pass)

torch.set_default_dtype(torch.float64)

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.normpath(os.path.join(HERE, "..", "..", "tests", "data", "golden"))
OUT = os.path.join(GOLDEN, "dpo_llama")
M = ref.CONFIGS["llama"]["model"]
S = M["seq_length"]
# (prompt length, chosen response length, rejected response length) of each pair, in tokens
PAIRS = [(5, 6, 9), (7, 8, 4)]
CONFIGS = [  # the first gets full gradients
    dict(name="sigmoid_smoothed_ftx", loss_type="sigmoid", beta=0.5, label_smoothing=0.1, pref_ftx=0.2),
    dict(name="sigmoid", loss_type="sigmoid", beta=0.1, label_smoothing=0.0, pref_ftx=0.0),
    dict(name="hinge", loss_type="hinge", beta=0.5, label_smoothing=0.0, pref_ftx=0.0),
    dict(name="ipo_ftx", loss_type="ipo", beta=0.5, label_smoothing=0.0, pref_ftx=0.3),
]


def make_batch():
    rng = np.random.RandomState(7)
    vocab = M["tokenizer_vocab_size"]
    n = len(PAIRS)
    tokens = np.zeros((2 * n, S), dtype=np.int64)
    labels = np.zeros((2 * n, S), dtype=np.int64)
    mask = np.zeros((2 * n, S), dtype=np.float32)
    for i, (p, c, r) in enumerate(PAIRS):
        prompt = rng.randint(1, vocab, size=p)
        for row, resp_len in ((i, c), (n + i, r)):
            ids = np.concatenate([prompt, rng.randint(1, vocab, size=resp_len)])
            L = len(ids)
            assert L <= S
            tokens[row, :L] = ids
            for s in range(L - 1):  # position s predicts ids[s + 1]; a label of the response counts
                labels[row, s] = ids[s + 1]
                mask[row, s] = 1.0 if s + 1 >= p else 0.0
    positions = np.broadcast_to(np.arange(S, dtype=np.int64), tokens.shape).copy()
    return {"tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(mask), "position_ids": torch.from_numpy(positions)}


def sequence_log_probs(p, batch):
    logits = ref.forward(p, M, batch["tokens"], batch["position_ids"])
    token_logp = -ref.token_losses(logits, batch["labels"])
    mask = batch["loss_mask"].to(torch.float64)
    return (token_logp * mask).sum(-1), mask.sum(-1)


def dpo_loss(policy, reference, batch, c):
    n = len(PAIRS)
    pl, counts = sequence_log_probs(policy, batch)
    with torch.no_grad():
        rl, _ = sequence_log_probs(reference, batch)
    if c["loss_type"] == "ipo":
        pl, rl = pl / counts.clamp(min=1), rl / counts.clamp(min=1)
    pc, pr, rc, rr = pl[:n], pl[n:], rl[:n], rl[n:]
    x = (pc - pr) - (rc - rr)
    b, e = c["beta"], c["label_smoothing"]
    if c["loss_type"] == "sigmoid":
        losses = -F.logsigmoid(b * x) * (1 - e) - F.logsigmoid(-b * x) * e
    elif c["loss_type"] == "hinge":
        losses = torch.relu(1 - b * x)
    else:
        losses = (x - 1 / (2 * b)) ** 2
    if c["pref_ftx"] > 1e-6:
        losses = losses + c["pref_ftx"] * (-pc / counts[:n])
    chosen_rewards, rejected_rewards = b * (pc - rc).detach(), b * (pr - rr).detach()
    info = dict(policy_log_probs=pl.detach().tolist(), reference_log_probs=rl.tolist(),
                chosen_rewards=chosen_rewards.tolist(), rejected_rewards=rejected_rewards.tolist(),
                accuracy=float((chosen_rewards > rejected_rewards).double().mean()))
    return losses.mean(), info


def main():
    os.makedirs(OUT, exist_ok=True)
    policy = {k: v.to(torch.float64) for k, v in load_file(os.path.join(GOLDEN, "llama", "weights.safetensors")).items()}
    rng = np.random.RandomState(99)
    reference = {k: ref.round_to_bf16(v.numpy() + rng.normal(0.0, 0.01, size=tuple(v.shape)))
                 for k, v in sorted(policy.items())}
    batch = make_batch()
    results = []
    grads_out = {}
    for i, c in enumerate(CONFIGS):
        params = {k: v.clone().requires_grad_(True) for k, v in policy.items()}
        loss, info = dpo_loss(params, reference, batch, c)
        loss.backward()
        norm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in params.values())))
        results.append(dict(c, loss=float(loss), grad_norm=norm, **info))
        if i == 0:
            grads_out = {k: p.grad.to(torch.float32) for k, p in params.items()}
            # Finite-difference check of this reference's own gradient on a few elements.
            fd = []
            for name in ["output_layer.weight", "decoder.layers.0.self_attention.linear_qkv.weight"]:
                for idx in [(3, 5), (10, 20)]:
                    h = 1e-6
                    plus = {k: v.detach().clone() for k, v in params.items()}
                    minus = {k: v.detach().clone() for k, v in params.items()}
                    plus[name][idx] += h
                    minus[name][idx] -= h
                    num = (float(dpo_loss(plus, reference, batch, c)[0]) - float(dpo_loss(minus, reference, batch, c)[0])) / (2 * h)
                    fd.append(dict(param=name, index=list(idx), autograd=float(params[name].grad[idx]), numeric=num))
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in reference.items()},
              os.path.join(OUT, "reference_weights.safetensors"))
    save_file({k: v.contiguous() for k, v in batch.items()}, os.path.join(OUT, "inputs.safetensors"))
    save_file({k: v.contiguous() for k, v in grads_out.items()}, os.path.join(OUT, "grads.safetensors"))
    doc = dict(policy="llama", pairs=PAIRS, configs=results, finite_difference=fd)
    with open(os.path.join(OUT, "fixture.json"), "w") as f:
        f.write(ref.compact_json(doc) + "\n")
    print(json.dumps([(r["name"], r["loss"], r["accuracy"]) for r in results]))
    print(json.dumps(fd))


if __name__ == "__main__":
    main()
