#!/usr/bin/env python3
"""Float64 golden values of GRPO (Megatron-LM main's --perform-rl-step): writes tests/data/reference/grpo/fixture.json.

Runs Megatron-LM's OWN calculate_grpo_advantages and calculate_grpo_loss (megatron/rl/rl_utils.py)
on small float64 tensors. Nothing is copied: the two functions' source is read from the Megatron-LM
checkout (a git directory; MEGATRON_LM_GIT, default /work/.mirror/NVIDIA+Megatron-LM/repo, at
MEGATRON_LM_REV, default HEAD), parsed with ast and executed on its own, with torch, numpy and a
no-op log_single_rank as its only globals (rl_utils.py's module imports pull in the whole training
stack; these two functions use nothing else).

The micro-batch reduction is train_rl.py's loss_func plus the schedule (megatron/core/
pipeline_parallel/schedules.py, loss_func returning three values, no --calculate-per-token-loss):
    mb_loss = sum(loss * mask) / clamp(sum(mask), min=1) / num_microbatches
and the gradient of mb_loss with respect to current_logprobs is torch autograd's through
Megatron's function (torch.min and clamp as torch differentiates them).

Two cases add --rl-inference-logprobs-is-correction's inference log-probabilities ("inference"; the
weight exp(old - inference)) and one --rl-importance-sampling-truncation-coef ("is_truncation_coef";
the weight min(exp(old - inference), coef)); the others hold null for both.

pass_at_k_cases hold Megatron's pass_at_k (megatron/rl/agent/pass_at_evaluation_agent.py, read and run
alone the same way) for --rl-prompts-per-eval's evaluation.

Each case holds its inputs, Megatron's outputs (per-token loss, kl term, ratios, entropy term,
truncated-from-above/below) and the reduced loss and its gradient. Advantage cases hold rewards
[num_groups, group_size] and Megatron's flat advantages.

Usage: /usr/bin/python3 tools/reference/grpo_reference.py   (Debian's torch 1.13 + numpy)
Deterministic: rerunning reproduces the committed file.
"""
import ast
import json
import logging
import os
import subprocess
import sys

import numpy as np
import torch

GIT = os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo")
REV = os.environ.get("MEGATRON_LM_REV", "HEAD")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference", "grpo",
                   "fixture.json")


def megatron_functions():
    src = subprocess.run(["git", "-C", GIT, "show", f"{REV}:megatron/rl/rl_utils.py"], check=True,
                         capture_output=True, text=True).stdout
    commit = subprocess.run(["git", "-C", GIT, "rev-parse", REV], check=True, capture_output=True,
                            text=True).stdout.strip()
    tree = ast.parse(src)
    wanted = {"calculate_grpo_advantages", "calculate_grpo_loss"}
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    if {n.name for n in nodes} != wanted:
        sys.exit("rl_utils.py no longer defines " + ", ".join(sorted(wanted)))
    module = ast.Module(body=nodes, type_ignores=[])
    env = {"torch": torch, "np": np, "logging": logging, "logger": logging.getLogger("rl_utils"),
           "log_single_rank": lambda *a, **k: None}
    exec(compile(module, "megatron/rl/rl_utils.py", "exec"), env)
    return env["calculate_grpo_advantages"], env["calculate_grpo_loss"], commit


def megatron_pass_at_k():
    """Megatron's pass_at_k (megatron/rl/agent/pass_at_evaluation_agent.py), read and run alone."""
    src = subprocess.run(["git", "-C", GIT, "show", f"{REV}:megatron/rl/agent/pass_at_evaluation_agent.py"],
                         check=True, capture_output=True, text=True).stdout
    nodes = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "pass_at_k"]
    if len(nodes) != 1:
        sys.exit("pass_at_evaluation_agent.py no longer defines pass_at_k")
    env = {"np": np}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "pass_at_evaluation_agent.py", "exec"), env)
    return env["pass_at_k"]


def loss_case(calc_loss, calc_adv, rng, name, B, S, group_size, eps_lo, eps_hi, kl_beta, entropy_w,
              num_microbatches, rewards=None, equal_old=False, is_correction=False, is_truncation_coef=None):
    current = torch.tensor(-rng.uniform(0.05, 3.0, size=(B, S)), dtype=torch.float64, requires_grad=True)
    old = current.detach() if equal_old else current.detach() + torch.tensor(rng.uniform(-0.4, 0.4, size=(B, S)))
    ref = current.detach() + torch.tensor(rng.uniform(-0.6, 0.6, size=(B, S)))
    if rewards is None:
        rewards = rng.integers(0, 3, size=(B // group_size, group_size)).astype(np.float64).tolist()
    adv = calc_adv(rewards, [[1] * group_size for _ in rewards])
    advantages = torch.tensor(adv, dtype=torch.float64)
    mask = torch.tensor((rng.uniform(size=(B, S)) < 0.7).astype(np.float64))
    # --rl-inference-logprobs-is-correction: the sampler's log-probabilities, near pi_old's.
    inference = old + torch.tensor(rng.uniform(-0.3, 0.3, size=(B, S))) if is_correction else None
    loss, kl, ratios, entropy, above, below = calc_loss(current, old, ref, advantages, eps_lo, eps_hi, kl_beta,
                                                        entropy_w, inference_logprobs=inference,
                                                        is_truncation_coef=is_truncation_coef)
    tokens = torch.clamp(mask.sum(), min=1)
    mb_loss = (loss * mask).sum() / tokens / num_microbatches
    mb_loss.backward()
    flat = lambda t: t.detach().reshape(-1).tolist()
    return {
        "name": name, "B": B, "S": S, "group_size": group_size, "clamp_eps_lower": eps_lo,
        "clamp_eps_upper": eps_hi, "kl_beta": kl_beta, "entropy_weight": entropy_w,
        "num_microbatches": num_microbatches, "rewards": rewards,
        "current": flat(current), "old": flat(old), "ref": flat(ref), "advantages": adv, "mask": flat(mask),
        "loss": flat(loss), "kl_term": flat(kl), "ratios": flat(ratios), "entropy_term": flat(entropy),
        "truncated_from_above": [int(v) for v in flat(above)], "truncated_from_below": [int(v) for v in flat(below)],
        "mb_loss": float(mb_loss), "grad": flat(current.grad),
        "inference": flat(inference) if inference is not None else None, "is_truncation_coef": is_truncation_coef,
    }


def main():
    calc_adv, calc_loss, commit = megatron_functions()
    rng = np.random.default_rng(20261204)
    cases = [
        loss_case(calc_loss, calc_adv, rng, "dapo_eps", 4, 6, 2, 0.2, 0.28, 0.05, 0.01, 1),
        loss_case(calc_loss, calc_adv, rng, "megatron_defaults", 6, 5, 3, 0.01, 0.01, 0.001, 0.0, 2),
        loss_case(calc_loss, calc_adv, rng, "no_kl_entropy_only", 4, 4, 4, 0.1, 0.1, 0.0, 0.3, 1),
        loss_case(calc_loss, calc_adv, rng, "first_pass_ratio_one", 4, 5, 2, 0.2, 0.2, 0.1, 0.0, 1,
                  equal_old=True),
        loss_case(calc_loss, calc_adv, rng, "same_reward_group", 4, 5, 2, 0.2, 0.2, 0.02, 0.0, 1,
                  rewards=[[1.0, 1.0], [0.0, 1.0]]),
    ]
    # Importance sampling against the inference log-probabilities (--rl-inference-logprobs-is-correction,
    # --rl-importance-sampling-truncation-coef), from their own generator so the cases above stay as they were.
    is_rng = np.random.default_rng(20261205)
    is_cases = [
        loss_case(calc_loss, calc_adv, is_rng, "is_correction", 4, 6, 2, 0.2, 0.28, 0.05, 0.01, 1,
                  is_correction=True),
        loss_case(calc_loss, calc_adv, is_rng, "is_truncated", 6, 5, 3, 0.2, 0.2, 0.01, 0.0, 2,
                  is_correction=True, is_truncation_coef=1.05),
    ]
    adv_cases = []
    for rewards in ([[-1.0, 1.0], [4.0, 4.0]], [[0.0, 1.0, 1.0, 0.0], [0.5, 0.25, 1.0, 0.0]],
                    [[3.0], [1.0]], rng.uniform(-2, 2, size=(3, 5)).tolist()):
        adv_cases.append({"rewards": rewards,
                          "advantages": calc_adv(rewards, [[1] * len(rewards[0]) for _ in rewards])})
    # --rl-prompts-per-eval's pass@k (n samples, c of them passing, k).
    pass_at_k = megatron_pass_at_k()
    pass_cases = [{"n": n, "c": c, "k": k, "pass_at_k": float(pass_at_k(n, c, k))}
                  for n, c, k in ((32, 0, 1), (32, 0, 32), (32, 1, 1), (32, 1, 32), (32, 5, 1), (32, 5, 4),
                                  (32, 31, 2), (8, 3, 8), (8, 3, 6), (8, 3, 5), (4, 2, 1), (1, 1, 1), (1, 0, 1),
                                  (50, 7, 10))]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump({"megatron_commit": commit, "torch": torch.__version__, "loss_cases": cases + is_cases,
                   "advantage_cases": adv_cases, "pass_at_k_cases": pass_cases}, f, indent=1)
        f.write("\n")
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
