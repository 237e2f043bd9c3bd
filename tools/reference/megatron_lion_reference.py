#!/usr/bin/env python3
"""Megatron main's --optimizer lion state in a torch_dist checkpoint (tests/data/megatron/torch_dist_lion/).

Megatron main builds --optimizer lion as an emerging optimizer (megatron/core/optimizer/__init__.py,
emerging_optimizers.py): the 2-D parameters that are neither the word embedding nor the output layer get
emerging_optimizers' Lion (betas = (--adam-beta1, --adam-beta2), decoupled weight decay, one state tensor
'exp_avg', no step), every other parameter AdamW; the two are a ChainedOptimizer [Lion, AdamW] (param groups
sorted with the override-free group first). Without the distributed optimizer each is an FP32Optimizer (f32
model) whose sharded_state_dict names its tensors optimizer.state.<state>.<model key>, and Megatron's
checkpointing passes chained_optim_avoid_prefix, so both sub-optimizers' tensors keep those names; common.pt's
'optimizer' is {0: Lion's non-sharded state, 1: AdamW's} (torch state dicts without the tensors and the
params lists: AdamW's step as state['common_step'], Lion none).

This script (torch >= 2.4 for torch.distributed.checkpoint; no Megatron needed) takes the model weights, args and
scheduler of tests/data/megatron/torch_dist_adam (Megatron core_v0.12.1's own save), runs 7 steps of that chained
optimizer on seeded synthetic gradients with Megatron's learning-rate schedule (linear, warmup 4 and decay 40
samples, 1e-3 to 1e-4, 2 samples per iteration: iteration t uses num_steps 2 (t - 1)), and saves
iteration 7 in that layout with torch's DCP writer (the writer Megatron's torch_dist strategy drives), plus
torch_dist_lion.json: the step, which keys each state holds, and per tensor its sum and first values.

  /path/to/python-with-torch2 tools/reference/megatron_lion_reference.py tests/data/megatron
"""
import argparse
import json
import os
import shutil
import sys
import types

import torch
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, load, save

ITERATION = 7
BETA1, BETA2, EPS, WD = 0.9, 0.95, 1e-8, 0.1
MAX_LR, MIN_LR, WARMUP, DECAY, GBS = 1e-3, 1e-4, 4, 40, 2


def lr_at(num_steps):
    """Megatron's OptimizerParamScheduler.get_lr, linear style, init_lr 0."""
    if num_steps <= WARMUP:
        return MAX_LR * num_steps / WARMUP
    ratio = (num_steps - WARMUP) / (DECAY - WARMUP)
    return MIN_LR + (MAX_LR - MIN_LR) * (1.0 - ratio)


def is_lion(key, t):
    """Megatron's _is_nonlinear_or_embedding, negated, for a sharded key: stacked layers [L, ...] carry one
    more dimension than the layer's parameter."""
    if key in ("embedding.word_embeddings.weight", "output_layer.weight"):
        return False
    per_param_dims = t.dim() - 1 if key.startswith("decoder.layers.") else t.dim()
    return per_param_dims == 2


def stub_megatron_classes():
    """The source fixture's .metadata pickles Megatron's MCoreSavePlan (its planner data, unused here): a
    stand-in class lets torch read the index without Megatron installed."""
    name = "megatron.core.dist_checkpointing.strategies.torch"
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    sys.modules[name].MCoreSavePlan = type("MCoreSavePlan", (), {"__module__": name})


def main():
    stub_megatron_classes()
    ap = argparse.ArgumentParser()
    ap.add_argument("fixtures")
    a = ap.parse_args()
    src = os.path.join(a.fixtures, "torch_dist_adam", "iter_%07d" % ITERATION)
    md = FileSystemReader(src).read_metadata()
    flat = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if hasattr(v, "size") and not k.startswith("optimizer.")}
    load(flat, storage_reader=FileSystemReader(src))
    common = torch.load(os.path.join(src, "common.pt"), weights_only=False)
    model = {k: v.clone() for k, v in sorted(flat.items())}
    lion_keys = [k for k, t in model.items() if is_lion(k, t)]
    adam_keys = [k for k in model if k not in lion_keys]
    decayed = {k for k, t in model.items() if (t.dim() - 1 if k.startswith("decoder.layers.") else t.dim()) > 1}

    lion_m = {k: torch.zeros_like(model[k]) for k in lion_keys}
    adam_params = [torch.nn.Parameter(model[k]) for k in adam_keys]
    adamw = torch.optim.AdamW(
        [{"params": [p for k, p in zip(adam_keys, adam_params) if k in decayed], "weight_decay": WD},
         {"params": [p for k, p in zip(adam_keys, adam_params) if k not in decayed], "weight_decay": 0.0}],
        lr=MAX_LR, betas=(BETA1, BETA2), eps=EPS)
    gen = torch.Generator().manual_seed(1234)
    for t in range(1, ITERATION + 1):
        lr = lr_at(GBS * (t - 1))
        grads = {k: torch.randn(model[k].shape, generator=gen) * 0.01 for k in model}
        for k in lion_keys:  # emerging_optimizers' Lion: decoupled decay, then the sign update; m by lerp
            p, m, g = model[k], lion_m[k], grads[k]
            p.mul_(1 - lr * WD)
            update = torch.sign(BETA1 * m + (1 - BETA1) * g)
            m.lerp_(g, 1 - BETA2)
            p.add_(update, alpha=-lr)
        for k, p in zip(adam_keys, adam_params):
            p.grad = grads[k]
        for g in adamw.param_groups:
            g["lr"] = lr
        adamw.step()
    for k, p in zip(adam_keys, adam_params):
        model[k] = p.detach()

    state = {}  # the DCP's tensors: the model (f32) and both sub-optimizers' states under their plain keys
    for k, t in model.items():
        state[k] = t.contiguous()
    for k in lion_keys:
        state["optimizer.state.exp_avg." + k] = lion_m[k].contiguous()
    astate = adamw.state_dict()["state"]  # indexed in param-group order
    by_param = {id(p): k for k, p in zip(adam_keys, adam_params)}
    order = [by_param[id(p)] for g in adamw.param_groups for p in g["params"]]
    for i, k in enumerate(order):
        assert astate[i]["exp_avg"].shape == model[k].shape, k
        state["optimizer.state.exp_avg." + k] = astate[i]["exp_avg"].contiguous()
        state["optimizer.state.exp_avg_sq." + k] = astate[i]["exp_avg_sq"].contiguous()

    out = os.path.join(a.fixtures, "torch_dist_lion")
    shutil.rmtree(out, ignore_errors=True)
    it = os.path.join(out, "iter_%07d" % ITERATION)
    os.makedirs(it)
    save(state, storage_writer=FileSystemWriter(it, thread_count=1))
    shutil.copy(os.path.join(src, "metadata.json"), it)
    args = common["args"]
    args.optimizer = "lion"
    args.lion_beta1, args.lion_beta2 = 0.95, 0.98  # Megatron's defaults (Lion as Muon's scalar optimizer)
    lion_group = {"wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
                  "lr": lr_at(GBS * ITERATION), "betas": (BETA1, BETA2), "weight_decay": WD}
    adam_groups = [dict(g) for g in adamw.state_dict()["param_groups"]]
    for g, wd_mult in zip(adam_groups, (1.0, 0.0)):
        del g["params"]  # Megatron's LocalNonpersistentObject: not saved
        g.update({"wd_mult": wd_mult, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False,
                  "lr": lr_at(GBS * ITERATION)})
    common["optimizer"] = {0: {"state": {}, "param_groups": [lion_group]},
                           1: {"state": {"common_step": astate[0]["step"]}, "param_groups": adam_groups}}
    torch.save(common, os.path.join(it, "common.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))

    summary = {"step": ITERATION, "lion": sorted(lion_keys), "adam": sorted(adam_keys), "tensors": {}}
    for key, t in sorted(state.items()):
        summary["tensors"][key] = {"shape": list(t.shape), "sum": float(t.double().sum()),
                                   "first": [float(x) for x in t.reshape(-1)[:4]]}
    with open(os.path.join(a.fixtures, "torch_dist_lion.json"), "w") as f:
        json.dump(summary, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
