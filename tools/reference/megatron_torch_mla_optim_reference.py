"""A tiny Megatron-LM multi-latent-attention checkpoint in the legacy `torch` format that holds Adam's optimizer state.

Writes tests/data/megatron/torch_adam_mla/ (and torch_adam_mla.json): megatron_mla_reference.py's 'qlora' model
(Megatron core_v0.12.1's GPTModel with the local MLA spec: q LoRA, --qk-layernorm, RMSNorm, 2 layers, hidden 32;
its CPU shim for the core attention, which has no parameters) after 7 torch AdamW steps on synthetic gradients
(betas 0.9, 0.95, eps 1e-8, weight decay 0.1 through Megatron's param groups, core_v0.12.1's own _get_param_groups;
the learning rate of Megatron's own OptimizerParamScheduler: linear, warmup 4 samples, decay 40, lr 1e-3 -> 1e-4, 2
samples per iteration), saved as a --bf16 run saves it in the legacy format at TP 1: iter_0000007/mp_rank_00/
model_optim_rng.pt with the bf16 weights (the fp32 masters rounded), 'optimizer' = core_v0.12.1's own
Float16OptimizerWithFloat16Params.state_dict() (torch AdamW's state over the fp32 masters, 'fp32_from_fp16_params'
per param group), 'opt_param_scheduler'. torch_adam_mla.json: the step, the scheduler state and, per Megatron
torch-format name, the shape, sum and first values of fp32_param, exp_avg and exp_avg_sq.
Run (torch >= 2.4 on CPU with packaging, as megatron_mla_reference.py; written with torch 2.6; Megatron-LM core_v0.12.1
source in MEGATRON_LM):
  MEGATRON_LM=/tmp/meg python3 tools/reference/megatron_torch_mla_optim_reference.py tests/data/megatron
"""
import json
import os
import shutil
import sys
import types

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_mla_reference as mref  # noqa: E402  (build, init_weights, megatron_args, init_group; the CPU shims)

ITERATION, GBS = 7, 2
LR, MIN_LR, BETAS, EPS, WD = 1e-3, 1e-4, (0.9, 0.95), 1e-8, 0.1


def summary(t):
    t = t.float().reshape(-1)
    return {"shape": list(t.shape), "sum": float(t.double().sum()), "first": [float(x) for x in t[:4]]}


def main():
    from megatron.core.optimizer import _get_param_groups
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    fixtures = sys.argv[1]
    mref.init_group(0, 1, 33000 + os.getpid() % 2000)
    v = mref.VARIANTS["qlora"]
    model = mref.build(v, 1)
    mref.init_weights(model)
    names = {p: n for n, p in model.named_parameters()}
    chunk = types.SimpleNamespace(ddp_config=types.SimpleNamespace(use_custom_fsdp=False),
                                  named_parameters=model.named_parameters)
    groups = _get_param_groups([chunk], None, None, 1.0, LR, MIN_LR, None, None)
    adamw = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)

    class Holder:  # OptimizerParamScheduler only sets the groups' lr and weight_decay
        param_groups = adamw.param_groups
    sched = OptimizerParamScheduler(Holder(), init_lr=0.0, max_lr=LR, min_lr=MIN_LR, lr_warmup_steps=2 * GBS,
                                    lr_decay_steps=20 * GBS, lr_decay_style="linear", start_wd=WD, end_wd=WD,
                                    wd_incr_steps=20 * GBS, wd_incr_style="constant")
    g = torch.Generator().manual_seed(7)
    for _ in range(ITERATION):
        for p in model.parameters():
            p.grad = 0.05 * torch.randn(p.shape, generator=g)
        adamw.step()
        sched.step(increment=GBS)
    # --bf16: Float16OptimizerWithFloat16Params keeps AdamW over fp32 master copies of the bf16 weights.
    masters, new_groups = [], []
    for grp in adamw.param_groups:
        ms = [torch.nn.Parameter(p.detach().clone()) for p in grp["params"]]
        masters.append(ms)
        new_groups.append({**{k: x for k, x in grp.items() if k != "params"}, "params": ms})
    opt = torch.optim.AdamW(new_groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    state = {}
    for grp, ms in zip(adamw.param_groups, masters):
        for p, m in zip(grp["params"], ms):
            s = adamw.state[p]
            opt.state[m] = {"step": s["step"].clone(), "exp_avg": s["exp_avg"].clone(),
                            "exp_avg_sq": s["exp_avg_sq"].clone()}
            state[names[p]] = {"fp32_param": summary(m), "exp_avg": summary(s["exp_avg"]),
                               "exp_avg_sq": summary(s["exp_avg_sq"])}
    model.bfloat16()
    f16 = Float16OptimizerWithFloat16Params.__new__(Float16OptimizerWithFloat16Params)  # its __init__ needs CUDA
    f16.optimizer, f16.fp32_from_float16_groups, f16.grad_scaler = opt, masters, None
    args = mref.megatron_args(v, 1)
    args.bf16, args.params_dtype, args.ckpt_format = True, torch.bfloat16, "torch"
    args.optimizer, args.adam_beta1, args.adam_beta2, args.adam_eps, args.weight_decay = "adam", BETAS[0], BETAS[1], \
        EPS, WD
    args.lr, args.min_lr, args.lr_decay_style, args.lr_warmup_iters, args.lr_decay_iters = LR, MIN_LR, "linear", 2, 20
    args.global_batch_size, args.micro_batch_size, args.data_parallel_size = GBS, 1, 1
    args.consumed_train_samples = ITERATION * GBS
    args.use_distributed_optimizer = False
    out = os.path.join(fixtures, "torch_adam_mla")
    shutil.rmtree(out, ignore_errors=True)
    d = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_00")
    os.makedirs(d)
    sd = model.state_dict_for_save_checkpoint()
    print("state dict", [k for k in sd if torch.is_tensor(sd[k])])
    print("groups", [(grp["wd_mult"], [names[p] for p in grp["params"]]) for grp in adamw.param_groups])
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd,
                "optimizer": Float16OptimizerWithFloat16Params.state_dict(f16), "opt_param_scheduler": sched.state_dict(),
                "num_floating_point_operations_so_far": 0.0}, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    with open(os.path.join(fixtures, "torch_adam_mla.json"), "w") as f:
        json.dump({"step": ITERATION, "opt_param_scheduler": sched.state_dict(), "tensors": state}, f, indent=1)
    dist.destroy_process_group()
    print("wrote", out)


if __name__ == "__main__":
    main()
