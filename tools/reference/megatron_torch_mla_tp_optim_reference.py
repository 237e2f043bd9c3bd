"""Megatron's legacy torch-format optimizer state of the MLA model at TP 2 and with the distributed optimizer.

The state is torch_adam_mla's (megatron_torch_mla_optim_reference.py: Megatron core_v0.12.1's q-LoRA MLA GPTModel after
7 AdamW steps, saved at TP 1 by Float16OptimizerWithFloat16Params): read back from its rank file (each saved param
group's indices matched to the parameters by core_v0.12.1's own _get_param_groups over the saved state dict's order,
checked by the masters rounding to the saved bf16 weights), then written as a --bf16 run saves it:
  torch_adam_mla_tp2/          TP 2, non-distributed: mp_rank_0T/model_optim_rng.pt, each rank's
                               Float16OptimizerWithFloat16Params.state_dict() over its TP pieces
  torch_adam_mla_distopt/      TP 1 at DP 2 with the distributed optimizer (--overlap-grad-reduce --ddp-bucket-size 200):
                               DistributedOptimizer.state_dict() and mp_rank_00/distrib_optim.pt =
                               get_parameter_state_dp_zero() (save_parameter_state, DP rank 0)
  torch_adam_mla_distopt_tp2/  the same at TP 2 (DP 1): each tensor rank's distrib_optim.pt
The TP pieces are cut by the rules of Megatron's local MLA spec as mla_qlora/tp2 (Megatron's own TP 2 save) shows them:
rows of the word embedding, output layer, linear_q_down_proj, linear_q_up_proj, linear_kv_down_proj, linear_kv_up_proj
(whole heads) and linear_fc1 (SwiGLU: each rank [its gate rows; its up rows]); columns of linear_proj and linear_fc2;
the norms (input, pre-MLP, q/kv layernorms, final) whole on every rank. This file's parameter order per rank is the
saved state dict's (the modules' registration order), as the TP 1 file's. Megatron core_v0.12.1's own
_get_param_groups, Float16OptimizerWithFloat16Params.state_dict, _ParamAndGradBuffer and DistributedOptimizer's
_build_gbuf_range_map / get_parameter_state_dp_zero / state_dict / save_parameter_state (over stand-ins: their
constructors need CUDA) write the optimizer files, in a gloo group with Megatron's parallel_state.
Run (Debian's torch 1.13 on CPU, PyPI packaging; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  PYTHONPATH=/path/to/packaging MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 /usr/bin/python3 \
    tools/reference/megatron_torch_mla_tp_optim_reference.py tests/data/megatron
"""
import copy
import os
import shutil
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt_reference  # noqa: E402,F401  (torch 1.13 shims for Megatron's imports; MEGATRON_LM on the path)

ITERATION = 7
BETAS, EPS = (0.9, 0.95), 1e-8
BUCKET = 200
ROWS = ("embedding.word_embeddings.weight", "output_layer.weight", "linear_q_down_proj.weight",
        "linear_q_up_proj.weight", "linear_kv_down_proj.weight", "linear_kv_up_proj.weight")
COLUMNS = ("linear_proj.weight", "linear_fc2.weight")


def params_of(sd):
    return [k for k, v in sd.items() if torch.is_tensor(v) and not k.endswith("_extra_state")]


def groups_of(named, lr_wd):
    """core_v0.12.1's _get_param_groups over `named` [(name, param)], lr and weight decay as the saved groups."""
    from megatron.core.optimizer import _get_param_groups
    chunk = types.SimpleNamespace(ddp_config=types.SimpleNamespace(use_custom_fsdp=False),
                                  named_parameters=lambda: iter(named))
    groups = _get_param_groups([chunk], None, None, 1.0, 1e-3, 1e-4, None, None)
    for g in groups:
        g["lr"], g["weight_decay"] = lr_wd[g["wd_mult"]]
    return groups


def saved_state(root):
    """{name: {fp32_param, exp_avg, exp_avg_sq}} of torch_adam_mla's Float16 state, and the groups' lr / weight decay."""
    sd, opt = root["model"], root["optimizer"]
    names = params_of(sd)
    named = [(n, torch.nn.Parameter(sd[n].float())) for n in names]
    by_param = {id(p): n for n, p in named}
    saved_groups = opt["optimizer"]["param_groups"]
    lr_wd = {g["wd_mult"]: (g["lr"], g["weight_decay"]) for g in saved_groups}
    groups = groups_of(named, lr_wd)
    state = {}
    for g, sg, masters in zip(groups, saved_groups, opt["fp32_from_fp16_params"]):
        assert g["wd_mult"] == sg["wd_mult"] and len(g["params"]) == len(sg["params"])
        for p, idx, m in zip(g["params"], sg["params"], masters):
            n = by_param[id(p)]
            s = opt["optimizer"]["state"][idx]
            assert int(s["step"]) == ITERATION
            assert torch.equal(m.to(torch.bfloat16), sd[n]), n  # the masters are the saved weights: the mapping holds
            state[n] = {"fp32_param": m.detach().float().clone(), "exp_avg": s["exp_avg"].detach().clone(),
                        "exp_avg_sq": s["exp_avg_sq"].detach().clone()}
    return state, lr_wd


def cut(name, t, tp, r, swiglu):
    if tp == 1 or t.dim() == 1:
        return t.clone()
    if name.endswith("mlp.linear_fc1.weight") and swiglu:
        gate, up = t.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[r], up.chunk(tp, 0)[r]], 0).clone()
    if name.endswith("mlp.linear_fc1.weight") or any(name.endswith(x) for x in ROWS):
        return t.chunk(tp, 0)[r].clone()
    if any(name.endswith(x) for x in COLUMNS):
        return t.chunk(tp, 1)[r].clone()
    raise ValueError(name)


def worker(rank, world, port, out, src, state, lr_wd, tp, distributed):
    from megatron.core import parallel_state
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tp, 1)
    t = parallel_state.get_tensor_model_parallel_rank()
    dp_group = parallel_state.get_data_parallel_group()
    swiglu = src["args"].swiglu
    local = {n: {k: cut(n, v, tp, t, swiglu) for k, v in s.items()} for n, s in state.items()}
    names = {}
    named = []
    for n in params_of(src["model"]):
        q = torch.nn.Parameter(local[n]["fp32_param"].to(torch.bfloat16))
        names[q] = n
        named.append((n, q))
    groups = groups_of(named, lr_wd)
    masters = []
    for g in groups:
        masters.append([])
        for q in g["params"]:
            m = torch.nn.Parameter(local[names[q]]["fp32_param"].clone())
            names[m] = names[q]
            masters[-1].append(m)
        g["params"] = list(masters[-1])
    adamw = torch.optim.AdamW(groups, lr=1e-3, betas=BETAS, eps=EPS)
    for g in adamw.param_groups:
        for m in g["params"]:
            s = local[names[m]]
            adamw.state[m] = {"step": torch.tensor(float(ITERATION)), "exp_avg": s["exp_avg"].clone(),
                              "exp_avg_sq": s["exp_avg_sq"].detach().clone()}
    d = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_%02d" % t)
    os.makedirs(d, exist_ok=True)
    if not distributed:
        f16 = Float16OptimizerWithFloat16Params.__new__(Float16OptimizerWithFloat16Params)  # __init__ needs CUDA
        f16.optimizer, f16.fp32_from_float16_groups, f16.grad_scaler = adamw, masters, None
        optimizer_sd = Float16OptimizerWithFloat16Params.state_dict(f16)
    else:
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                   use_distributed_optimizer=True, bucket_size=BUCKET)
        params = [q for _, q in named]
        model_names = {q: n for n, q in named}
        buffer = _ParamAndGradBuffer(ddp_config, torch.bfloat16, torch.float32, params, dp_group, BUCKET, model_names,
                                     1.0, list(range(len(params))))
        if parallel_state.get_data_parallel_rank() == 0:
            print(out, "tp rank", t, "buckets", [(b.grad_data.numel(), b.numel_unpadded) for b in buffer.buckets])
        gbuf_ranges = [DistributedOptimizer._build_gbuf_range_map(buffer)]

        def main_states(model_param):
            rng = None
            for per_bucket in gbuf_ranges[0].values():
                for m in per_bucket:
                    if model_param in m["param_map"]:
                        rng = m["param_map"][model_param]["param"]
            s = local[model_names[model_param]]
            return {k2: s[k1].reshape(-1)[rng.start:rng.end].clone()
                    for k1, k2 in (("fp32_param", "param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq"))}
        so = types.SimpleNamespace(gbuf_ranges=gbuf_ranges, buffers=[buffer], data_parallel_group=dp_group,
                                   data_parallel_group_gloo=dp_group, optimizer=adamw, grad_scaler=None,
                                   _get_main_param_and_optimizer_states=main_states,
                                   ddp_config=types.SimpleNamespace(use_custom_fsdp=False))
        so.get_parameter_state_dp_zero = types.MethodType(DistributedOptimizer.get_parameter_state_dp_zero, so)
        optimizer_sd = DistributedOptimizer.state_dict(so)
        DistributedOptimizer.save_parameter_state(so, os.path.join(d, "distrib_optim.pt"))
    if parallel_state.get_data_parallel_rank() == 0:
        sd = {}
        for k, v in src["model"].items():
            sd[k] = local[k]["fp32_param"].to(torch.bfloat16) if k in local else v
        args = copy.deepcopy(src["args"])
        args.tensor_model_parallel_size, args.world_size, args.data_parallel_size = tp, world, world // tp
        args.use_distributed_optimizer = distributed
        args.overlap_grad_reduce, args.ddp_bucket_size = distributed, BUCKET if distributed else None
        args.accumulate_allreduce_grads_in_fp32 = True
        torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd,
                    "optimizer": optimizer_sd, "opt_param_scheduler": src["opt_param_scheduler"],
                    "num_floating_point_operations_so_far": 0.0}, os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    fixtures = sys.argv[1]
    src = torch.load(os.path.join(fixtures, "torch_adam_mla", "iter_%07d" % ITERATION, "mp_rank_00",
                                  "model_optim_rng.pt"), map_location="cpu")
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(28000 + os.getpid() % 400)
    dist.init_process_group("gloo", rank=0, world_size=1)  # _get_param_groups asks for ranks
    state, lr_wd = saved_state(src)
    dist.destroy_process_group()
    for k, (name, world, tp, distributed) in enumerate((("torch_adam_mla_tp2", 2, 2, False),
                                                        ("torch_adam_mla_distopt", 2, 1, True),
                                                        ("torch_adam_mla_distopt_tp2", 2, 2, True))):
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        mp.spawn(worker, args=(world, 28500 + os.getpid() % 400 + 40 * k, out, src, state, lr_wd, tp, distributed),
                 nprocs=world, join=True)
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        print("wrote", out)


if __name__ == "__main__":
    main()
