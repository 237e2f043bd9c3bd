"""Tiny Megatron-LM legacy `torch`-format checkpoints (--ckpt-format torch) that hold Adam's optimizer state.

The state is trained by torch_dist_adam's recipe (megatron_torch_dist_optim_reference.py's train_adamw: Megatron
core_v0.12.1's FP32Optimizer over torch AdamW, 7 steps, 2 layers, hidden 16, ffn 24, vocabulary 50 padded to 64) in
this process (torch 1.13's AdamW and initialisation give other values than the torch 2.5 that wrote torch_dist_adam:
the state is recorded in torch_optim.json), and written in the legacy format's files, iter_0000007/mp_rank_TT[_PPP]/model_optim_rng.pt:
  torch_adam/                the non-distributed optimizer, TP 1, f32 weights: 'optimizer' is Megatron's own
                             FP32Optimizer.state_dict() (torch AdamW's {'state': {param index: {'step', 'exp_avg',
                             'exp_avg_sq'}}, 'param_groups': [{'params': [indices], 'wd_mult', ...}]})
  torch_adam_bf16_tp2pp2/    Megatron's Float16OptimizerWithFloat16Params.state_dict() ({'optimizer': torch AdamW's
                             dict over the fp32 masters, 'fp32_from_fp16_params': the masters per param group}) of each
                             of the four ranks of TP 2 x PP 2, bf16 weights; each rank's param groups are Megatron
                             core_v0.12.1's _get_param_groups of its own model chunk (built with Megatron's GPTModel in
                             a gloo group): the no-weight-decay group first on the second stage (its first parameter is
                             a norm), as that release orders them
  torch_adam_distopt/        the distributed optimizer at DP 2, bf16, --overlap-grad-reduce --ddp-bucket-size 1000
                             (five buckets): model_optim_rng.pt's 'optimizer' is DistributedOptimizer.state_dict()
                             (param groups without params, with the step), and DP rank 0 writes
                             mp_rank_00/distrib_optim.pt = DistributedOptimizer.get_parameter_state_dp_zero() (its
                             save_parameter_state), the buffers laid out by Megatron's own _ParamAndGradBuffer
  torch_adam_distopt_tp2pp2/ the same at TP 2 x PP 2 (DP 1): each model-parallel rank's distrib_optim.pt
  torch_adam_{bf16,distopt}_tp2pp2_tied/  the two at TP 2 x PP 2 with the word embedding tied to the output layer
                             (args untie_embeddings_and_output_weights False): the last stage's copy
                             (output_layer.weight, Megatron's shared_embedding, in a bucket of its own in the
                             distributed optimizer's buffer) holds the embedding's state; no untied output layer
The DistributedOptimizer methods run over a stand-in that hands each parameter's range of masters and moments
(its constructor needs CUDA), as megatron_torch_dist_optim_reference.py's bucket_worker does.
Writes torch_optim.json: the step, the scheduler state and, per tensor, its shape, sum and first values. Every
fixture holds the same state (the bf16 ones with the masters rounded into the weights).
Run (Debian's torch 1.13 on CPU, PyPI packaging; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  PYTHONPATH=/path/to/packaging MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 /usr/bin/python3 \
    tools/reference/megatron_torch_optim_reference.py tests/data/megatron
"""
import json
import os
import shutil
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_torch_dist_optim_reference as oref  # noqa: E402  (train_adamw, args_for, the sizes)
import megatron_ckpt_reference as ref  # noqa: E402  (shard)
import megatron_torch_dist_reference as dref  # noqa: E402  (build)

ITERATION = oref.ITERATION
BUCKET_SIZE = oref.BUCKET_SIZE


def rank_dir(out, tp, pp, t, p):
    name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
    d = os.path.join(out, "iter_%07d" % ITERATION, name)
    os.makedirs(d, exist_ok=True)
    return d


def legacy_args(tp, pp, dp, distributed, bf16):
    a = oref.args_for(tp, dp, distributed)
    a.ckpt_format = "torch"
    a.pipeline_model_parallel_size = pp
    a.transformer_impl = "local"
    a.bf16, a.params_dtype = bf16, torch.bfloat16 if bf16 else torch.float32
    if distributed:
        a.overlap_grad_reduce, a.ddp_bucket_size, a.accumulate_allreduce_grads_in_fp32 = True, BUCKET_SIZE, True
    return a


def write_root(d, args, model_sd, optimizer_sd, sched_sd):
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model_sd,
                "optimizer": optimizer_sd, "opt_param_scheduler": sched_sd,
                "num_floating_point_operations_so_far": 0.0}, os.path.join(d, "model_optim_rng.pt"))


def param_groups(model, group_values):
    """Megatron core_v0.12.1's param groups of this rank's model chunk, with the lr and weight decay the scheduler
    set after 7 steps (group_values: wd_mult -> (lr, weight_decay))."""
    from megatron.core.optimizer import _get_param_groups
    chunk = types.SimpleNamespace(  # the DDP wrapper's attributes it reads
        ddp_config=types.SimpleNamespace(use_custom_fsdp=False), named_parameters=model.named_parameters)
    groups = _get_param_groups([chunk], None, None, 1.0, oref.LR, oref.MIN_LR, None, None)
    for g in groups:
        g["lr"], g["weight_decay"] = group_values[g["wd_mult"]]
    return groups


def adamw_over(groups, masters_of, local, names):
    """torch AdamW over fp32 masters of `groups` (params replaced in place, as Float16OptimizerWithFloat16Params
    does), its state the rank's pieces `local` at step 7; returns the optimizer and the masters per group."""
    masters = []
    for g in groups:
        masters.append([masters_of(p) for p in g["params"]])
        g["params"] = list(masters[-1])
    adamw = torch.optim.AdamW(groups, lr=oref.LR, betas=oref.BETAS, eps=oref.EPS, weight_decay=oref.WD)
    for g, ms in zip(adamw.param_groups, masters):
        for m in ms:
            n = names[m]
            adamw.state[m] = {"step": torch.tensor(float(ITERATION)), "exp_avg": local["exp_avg"][n].clone(),
                              "exp_avg_sq": local["exp_avg_sq"][n].clone()}
    return adamw, masters


def worker(rank, world, out, port, state, sched_sd, group_values, mode, tp, pp, tied=False):
    from megatron.core import parallel_state
    if tied:  # the last stage's copy of the tied embedding holds the embedding's state, as Megatron keeps it
        state = dict(state)  # the untied run's output layer replaced by the embedding's copy
        state["output_layer.weight"] = {s: x.clone() for s, x in state["embedding.word_embeddings.weight"].items()}
        torch.Tensor.cuda = lambda t, *a, **k: t  # GPTModel all-reduces the two copies on "CUDA" (here gloo)
    model = dref.build(tp, pp, rank, world, port, tied=tied)
    t, p = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()
    dp_rank = parallel_state.get_data_parallel_rank()
    local = {s: ref.shard({k: v[s] for k, v in state.items()}, tp, pp, t, p) for s in ("fp32_param", "exp_avg",
                                                                                          "exp_avg_sq")}
    model.load_state_dict(local["fp32_param"], strict=False)
    model.bfloat16()
    names = {}
    if mode == "float16":
        from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
        model_names = {q: n for n, q in model.named_parameters()}

        def master(q):
            m = torch.nn.Parameter(local["fp32_param"][model_names[q]].clone())
            names[m] = model_names[q]
            return m
        adamw, masters = adamw_over(param_groups(model, group_values), master, local, names)
        f16 = Float16OptimizerWithFloat16Params.__new__(Float16OptimizerWithFloat16Params)  # its __init__ needs CUDA
        f16.optimizer, f16.fp32_from_float16_groups, f16.grad_scaler = adamw, masters, None
        optimizer_sd = Float16OptimizerWithFloat16Params.state_dict(f16)
        args = legacy_args(tp, pp, 1, False, True)
        args.untie_embeddings_and_output_weights = not tied
    else:
        import inspect
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        dp_group = parallel_state.get_data_parallel_group()
        params = [q for q in model.parameters() if q.requires_grad]
        model_names = {q: n for n, q in model.named_parameters()}
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                   use_distributed_optimizer=True, bucket_size=BUCKET_SIZE)
        extra = ()
        if "nccl_ub" in inspect.signature(_ParamAndGradBuffer.__init__).parameters:
            extra = (False, types.SimpleNamespace(tp=parallel_state.get_tensor_model_parallel_group(), dp_cp=dp_group))
        buffer = _ParamAndGradBuffer(ddp_config, torch.bfloat16, torch.float32, params, dp_group, BUCKET_SIZE,
                                     model_names, 1.0, list(range(len(params))), *extra)
        gbuf_ranges = [DistributedOptimizer._build_gbuf_range_map(buffer)]
        flat = {s: {n: x.reshape(-1) for n, x in local[s].items()} for s in local}

        def main_states(model_param):
            rng = None
            for per_bucket in gbuf_ranges[0].values():
                for m in per_bucket:
                    if model_param in m["param_map"]:
                        rng = m["param_map"][model_param]["param"]
            n = model_names[model_param]
            return {"param": flat["fp32_param"][n][rng.start:rng.end].clone(),
                    "exp_avg": flat["exp_avg"][n][rng.start:rng.end].clone(),
                    "exp_avg_sq": flat["exp_avg_sq"][n][rng.start:rng.end].clone()}

        # The inner optimizer (whose state_dict gives the param groups and, for torch's AdamW, the step): AdamW over
        # this rank's groups, as DistributedOptimizer builds it over its shards of the masters.
        def master(q):
            m = torch.nn.Parameter(local["fp32_param"][model_names[q]].clone())
            names[m] = model_names[q]
            return m
        adamw, _ = adamw_over(param_groups(model, group_values), master, local, names)
        opt = types.SimpleNamespace(gbuf_ranges=gbuf_ranges, buffers=[buffer], data_parallel_group=dp_group,
                                    data_parallel_group_gloo=dp_group, optimizer=adamw, grad_scaler=None,
                                    _get_main_param_and_optimizer_states=main_states,
                                    ddp_config=types.SimpleNamespace(use_custom_fsdp=False, use_megatron_fsdp=False))
        param_state = DistributedOptimizer.get_parameter_state_dp_zero(opt)
        optimizer_sd = DistributedOptimizer.state_dict(opt)
        args = legacy_args(tp, pp, world // (tp * pp), True, True)
        args.untie_embeddings_and_output_weights = not tied
        if dp_rank == 0:
            print("tp", t, "pp", p, "buckets", [(b.grad_data.numel(), b.numel_unpadded) for b in buffer.buckets])
    if dp_rank == 0:
        d = rank_dir(out, tp, pp, t, p)
        write_root(d, args, model.state_dict_for_save_checkpoint(), optimizer_sd, sched_sd)
        if mode != "float16":
            torch.save(param_state, os.path.join(d, "distrib_optim.pt"))  # save_parameter_state's file
    dist.destroy_process_group()


def write_summary(state, sched_sd, fixtures):
    """torch_optim.json: the step, the scheduler state and, per tensor (TP 1 names), its shape, sum and first values."""
    with open(os.path.join(fixtures, "torch_optim.json"), "w") as f:
        json.dump({"step": ITERATION, "opt_param_scheduler": sched_sd, "tensors": oref.summary(state)}, f, indent=1)



def main():
    fixtures = sys.argv[1]
    model, opt, sched = oref.train_adamw()
    state = oref.global_state(model, opt.optimizer)
    sched_sd = sched.state_dict()
    write_summary(state, sched_sd, fixtures)
    group_values = {g["wd_mult"]: (g["lr"], g["weight_decay"]) for g in opt.optimizer.param_groups}
    out = os.path.join(fixtures, "torch_adam")
    shutil.rmtree(out, ignore_errors=True)
    write_root(rank_dir(out, 1, 1, 0, 0), legacy_args(1, 1, 1, False, False), model.state_dict_for_save_checkpoint(),
               opt.state_dict(), sched_sd)
    dist.destroy_process_group()
    for k, (name, mode, tp, pp, world, *tied) in enumerate((
            ("torch_adam_bf16_tp2pp2", "float16", 2, 2, 4),
            ("torch_adam_distopt", "distributed", 1, 1, 2),
            ("torch_adam_distopt_tp2pp2", "distributed", 2, 2, 4),
            ("torch_adam_bf16_tp2pp2_tied", "float16", 2, 2, 4, True),
            ("torch_adam_distopt_tp2pp2_tied", "distributed", 2, 2, 4, True))):
        if os.environ.get("ONLY") and name not in os.environ["ONLY"].split(","):
            continue
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        mp.spawn(worker, args=(world, out, 27000 + os.getpid() % 500 + 600 * k, state, sched_sd, group_values, mode, tp, pp, bool(tied)),
                 nprocs=world, join=True)
    for name in ("torch_adam", "torch_adam_bf16_tp2pp2", "torch_adam_distopt", "torch_adam_distopt_tp2pp2",
                 "torch_adam_bf16_tp2pp2_tied", "torch_adam_distopt_tp2pp2_tied"):
        with open(os.path.join(fixtures, name, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
    print("wrote torch_adam, torch_adam_bf16_tp2pp2, torch_adam_distopt, torch_adam_distopt_tp2pp2 and the _tied ones")


if __name__ == "__main__":
    main()
