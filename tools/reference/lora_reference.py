#!/usr/bin/env python3
"""Independent float64 PyTorch reference of LoRA fine-tuning (docs/model.md "LoRA"): writes tests/data/golden/lora_llama/.

The base model is the committed "llama" golden fixture (its weights.safetensors and
inputs.safetensors, read as they are) run by gpt_reference.py's forward pass; every linear named by
TARGETS gains a peft-style adapter written here by hand (no peft dependency):

    y = x W^T + (alpha / r) (x A^T) B^T,    A [r, in], B [out, r]

Only A and B train (AdamW, the fixture's schedule, clipping over the adapters' gradient norm); the
base stays frozen. B starts non-zero (normal(0, 0.02)) so that every adapter gradient is non-zero
(peft's zero B would give dA = 0 at the first step). Written under tests/data/golden/lora_llama/:

  lora_weights.safetensors  initial A and B by Gale's (peft-style) names, float32-exact values
  forward.safetensors       logits [B, S, V] and per-token losses of iteration 0, micro-batch 0
  grads.safetensors         that micro-batch loss's gradient for every A and B (f32)
  final.safetensors         A and B after TRAIN_ITERS AdamW steps (f32)
  fixture.json              r, alpha, targets, the forward loss, the per-iteration loss / grad norm /
                            learning rate, the finite-difference check of this reference's own
                            adapter gradients, and the largest change of any base weight (0)

Usage: /tmp/gale-ref-venv/bin/python tools/reference/lora_reference.py [--golden tests/data/golden]
The run is deterministic: rerunning it reproduces the committed files bit for bit.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_reference as ref  # noqa: E402  (the base model's forward pass and LR schedule)

torch.set_default_dtype(torch.float64)

R, ALPHA = 4, 8
TARGETS = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"]
TRAIN_ITERS = 3
MODULE_OF = {"linear_qkv": "self_attention.", "linear_proj": "self_attention.", "linear_fc1": "mlp.", "linear_fc2": "mlp."}


def lora_names(layer, target):
    prefix = f"decoder.layers.{layer}.{MODULE_OF[target]}{target}"
    return prefix, prefix + ".lora_A.default.weight", prefix + ".lora_B.default.weight"


def install_lora_linear():
    """Replaces gpt_reference.linear (used by its forward and mlp) with one that adds the adapter."""
    base_linear = ref.linear

    def linear(x, p, prefix):
        y = base_linear(x, p, prefix)
        a = p.get(prefix + ".lora_A.default.weight")
        if a is not None:
            y = y + (ALPHA / R) * ((x @ a.T) @ p[prefix + ".lora_B.default.weight"].T)
        return y

    ref.linear = linear


def initial_adapters(base, m, seed):
    rng = np.random.RandomState(seed)
    out = {}
    for layer in range(m["num_layers"]):
        for t in TARGETS:
            prefix, a_name, b_name = lora_names(layer, t)
            rows, cols = base[prefix + ".weight"].shape
            bound = 1.0 / math.sqrt(cols)  # kaiming_uniform(a = sqrt(5)) on [r, in]
            a = rng.uniform(-bound, bound, size=(R, cols)).astype(np.float32).astype(np.float64)
            b = rng.normal(0.0, 0.02, size=(rows, R)).astype(np.float32).astype(np.float64)
            out[a_name], out[b_name] = torch.from_numpy(a), torch.from_numpy(b)
    return out


def finite_difference_check(base, adapters, m, batch, rng):
    p = dict(base)
    p.update({k: v.clone().requires_grad_(True) for k, v in adapters.items()})
    loss, _, _ = ref.micro_batch_loss(p, m, batch)
    loss.backward()
    worst, checked, h = 0.0, 0, 1e-6
    for name in adapters:
        for _ in range(2):
            idx = tuple(int(rng.randint(0, s)) for s in adapters[name].shape)
            q = {k: v.detach() for k, v in p.items()}
            plus, minus = dict(q), dict(q)
            plus[name] = q[name].clone()
            plus[name][idx] += h
            minus[name] = q[name].clone()
            minus[name][idx] -= h
            numeric = (float(ref.micro_batch_loss(plus, m, batch)[0]) - float(ref.micro_batch_loss(minus, m, batch)[0])) / (2 * h)
            analytic = float(p[name].grad[idx])
            worst = max(worst, abs(numeric - analytic) / max(abs(numeric), abs(analytic), 1e-8))
            checked += 1
    assert worst < 1e-5, f"finite differences: relative error {worst}"
    return {"elements_checked": checked, "max_relative_error": worst}


def train(base, adapters, m, t, inputs):
    """TRAIN_ITERS iterations: gradient accumulation over micro-batches, clipping, AdamW on A and B only."""
    frozen = {k: v.clone() for k, v in base.items()}
    p = {k: v.clone().requires_grad_(True) for k, v in adapters.items()}
    state = {k: (torch.zeros_like(v), torch.zeros_like(v)) for k, v in p.items()}
    mbs = t["global_batch_size"] // t["micro_batch_size"]
    series = {"loss": [], "grad_norm": [], "lr_used": [], "lr": []}
    for it in range(TRAIN_ITERS):
        for v in p.values():
            v.grad = None
        loss_sum, mask_sum = 0.0, 0.0
        for mb in range(mbs):
            batch = ref.micro_batch(inputs, it, mb)
            full = dict(frozen)
            full.update(p)
            loss_mb, losses, _ = ref.micro_batch_loss(full, m, batch)
            (loss_mb / mbs).backward()
            mask = batch["loss_mask"].to(torch.float64)
            loss_sum += float((losses.detach() * mask).sum())
            mask_sum += float(mask.sum())
        grad_norm = math.sqrt(sum(float((v.grad ** 2).sum()) for v in p.values()))
        clip = t["clip_grad"] / (grad_norm + 1e-6)
        scale = clip if (t["clip_grad"] > 0 and clip < 1.0) else 1.0
        step = it + 1
        lr = ref.learning_rate(t, (step - 1) * t["global_batch_size"])
        b1, b2 = t["adam_beta1"], t["adam_beta2"]
        with torch.no_grad():
            for name, v in p.items():
                g = v.grad * scale
                m1, m2 = state[name]
                m1 = b1 * m1 + (1 - b1) * g
                m2 = b2 * m2 + (1 - b2) * g * g
                state[name] = (m1, m2)
                wd = t["weight_decay"]  # A and B are 2-D: Megatron's rule gives them weight decay
                v -= lr * ((m1 / (1 - b1 ** step)) / (torch.sqrt(m2 / (1 - b2 ** step)) + t["adam_eps"]) + wd * v)
        series["loss"].append(loss_sum / mask_sum)
        series["grad_norm"].append(grad_norm)
        series["lr_used"].append(lr)
        series["lr"].append(ref.learning_rate(t, step * t["global_batch_size"]))
    base_change = max(float((frozen[k] - base[k]).abs().max()) for k in base)
    return {k: v.detach() for k, v in p.items()}, series, base_change


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--golden", default=os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/golden")))
    args = ap.parse_args()
    cfg = ref.CONFIGS["llama"]
    m, t = cfg["model"], cfg["train"]
    base = {k: v.to(torch.float64) for k, v in load_file(os.path.join(args.golden, "llama", "weights.safetensors")).items()}
    inputs = load_file(os.path.join(args.golden, "llama", "inputs.safetensors"))
    install_lora_linear()
    adapters = initial_adapters(base, m, seed=2024)
    out_dir = os.path.join(args.golden, "lora_llama")
    os.makedirs(out_dir, exist_ok=True)
    f32 = lambda d: {k: v.to(torch.float32).contiguous() for k, v in d.items()}  # noqa: E731
    save_file(f32(adapters), os.path.join(out_dir, "lora_weights.safetensors"),
              metadata={"content": f"initial LoRA adapters (r {R}, alpha {ALPHA}) on the llama fixture"})

    batch = ref.micro_batch(inputs, 0, 0)
    p = dict(base)
    p.update({k: v.clone().requires_grad_(True) for k, v in adapters.items()})
    loss, losses, logits = ref.micro_batch_loss(p, m, batch)
    loss.backward()
    save_file({"logits": logits.detach().to(torch.float32), "token_losses": losses.detach().to(torch.float32)},
              os.path.join(out_dir, "forward.safetensors"),
              metadata={"content": "LoRA forward of iteration 0, micro-batch 0: logits [B, S, V], per-token losses [B, S]"})
    save_file(f32({k: p[k].grad for k in adapters}), os.path.join(out_dir, "grads.safetensors"),
              metadata={"content": "gradient of the iteration-0 micro-batch-0 loss for every LoRA A and B"})
    fd = finite_difference_check(base, adapters, m, batch, np.random.RandomState(7))

    final, series, base_change = train(base, adapters, m, t, inputs)
    save_file(f32(final), os.path.join(out_dir, "final.safetensors"),
              metadata={"content": f"LoRA adapters after {TRAIN_ITERS} AdamW iterations"})
    fixture = {"name": "lora_llama", "generator": "tools/reference/lora_reference.py", "base_fixture": "llama",
               "versions": {"torch": torch.__version__, "numpy": np.__version__, "python": sys.version.split()[0]},
               "lora_r": R, "lora_alpha": ALPHA, "lora_target_modules": TARGETS, "train_iters": TRAIN_ITERS,
               "forward": {"loss": float(loss)}, "train": series, "finite_difference": fd,
               "base_max_abs_change": base_change}
    with open(os.path.join(out_dir, "fixture.json"), "w") as f:
        f.write(ref.compact_json(fixture) + "\n")
    print(f"lora_llama: loss {float(loss):.6f}; train loss {series['loss'][0]:.6f} -> {series['loss'][-1]:.6f}; "
          f"finite differences: {fd['elements_checked']} elements, max rel err {fd['max_relative_error']:.2e}")


if __name__ == "__main__":
    main()
