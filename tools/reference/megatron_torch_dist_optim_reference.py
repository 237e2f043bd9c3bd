"""Tiny Megatron-LM torch_dist checkpoints that hold Adam's optimizer state, for Gale's resume of a Megatron run.

Writes, next to the other fixtures of tests/data/megatron (megatron_ckpt_reference.py's model made smaller: 2 layers,
hidden 16, ffn 24, 4 heads in 2 query groups, vocabulary 50 padded to 64, Megatron's own initialisation):
  torch_dist_adam/       the non-distributed optimizer's layout: Megatron core_v0.12.1's FP32Optimizer over
                         torch.optim.AdamW (betas 0.9, 0.95, eps 1e-8, weight decay 0.1 on the matrices, none on
                         the norms, as Megatron's param groups), after 7 real AdamW steps on synthetic gradients
                         with the learning rate of Megatron's OptimizerParamScheduler (linear, warmup 4 samples,
                         decay 40, lr 1e-3 -> 1e-4, 2 samples per iteration); saved by dist_checkpointing.save
                         (torch_dist) in one gloo process: model (f32), optimizer.state.exp_avg.<key>,
                         optimizer.state.exp_avg_sq.<key>, common.pt's optimizer {'state': {'common_step'},
                         'param_groups'}, opt_param_scheduler, iteration 7
  torch_dist_adam_dp2/   the same state as the distributed optimizer saves it with its default
                         fully_sharded_model_space layout, at TP 2 x DP 2 (four gloo processes), the model in bf16
                         (--bf16): each rank's sharded state dict is built as
                         DistributedOptimizer.sharded_param_state_fs_model_space builds it (every model
                         ShardedTensor / SwiGLU factory replaced by optimizer.state.{fp32_param,exp_avg,exp_avg_sq}.<key>
                         holding the flattened_range of the parameter that the rank's contiguous half of the
                         flat buffer covers; DP coordinate of replica_id 0), common.pt's optimizer
                         {'optimizer': {'param_groups' with 'step'}, 'param_state_sharding_type'}; Megatron's own
                         torch_dist writer stores those N-D flattened pieces (global shape
                         [X // x, Y // y, ..., x * y * ...]). The script loads it back with dist_checkpointing.load
                         and checks every tensor.
  torch_dist_adam_reshardable/  the same state in the distributed optimizer's fully_reshardable layout (Megatron main's
                         --dist-ckpt-optim-fully-reshardable; built as its sharded_param_state_fully_reshardable builds
                         it: whole tensors under optimizer.state.{param,exp_avg,exp_avg_sq}.<key>), TP 1, bf16 model,
                         saved by core_v0.12.1's torch_dist writer in one process
  torch_dist_optim.json  per fixture: the step, the scheduler state, and for every tensor (Megatron's torch-format
                         names, global layer numbers, TP 1 layout) its sum and first four values, for Gale's tests.
With --buckets (Megatron core_v0.15.3, PyPI megatron-core, whose torch_dist writer needs torch >= 2.6 for uneven 1-D
pieces): torch_dist_adam_buckets/, torch_dist_adam's state (read back from it) in the distributed optimizer's
bucket-space dp_reshardable layout, DP 2 x TP 1, bf16 model, --overlap-grad-reduce --ddp-bucket-size 1000 (five
buckets), args transformer_impl 'local': Megatron's own _ParamAndGradBuffer lays out the buffer, DistributedOptimizer's
_build_gbuf_range_map, sharded_state_dict and sharded_param_state_dp_reshardable build the sharded state dict over a
stand-in optimizer that hands each rank's range of the masters and moments (as TE's FusedAdam keeps them: no
per-parameter step; Megatron's DistributedOptimizer itself needs CUDA); torch_dist_adam_dp_zero/, the same in the
dp_zero_gather_scatter layout (get_parameter_state_dp_zero gathers the shards over the gloo DP group);
torch_dist_adam_buckets_tp2pp2/, the same state in the dp_reshardable layout at TP 2 x PP 2 x DP 1 (four gloo
processes): each rank's buffer holds its local shards (megatron_ckpt_reference.shard: SwiGLU halves cut separately,
its stage's layers from 0, the embedding on the first stage, the output layer on the last) under
dp_group_idx_<model-parallel rank>, as Megatron's DistributedOptimizer keys them; torch_dist_adam_dp_zero_tp2pp2/, the
same in the dp_zero_gather_scatter layout (each rank's buffers gathered into dp_group_idx_<rank>.param_state);
torch_dist_adam_{buckets,dp_zero}_tp2pp2_tied/, the same two at TP 2 x PP 2 with the embedding tied to the output
layer (GPTModel share_embeddings_and_output_weights, args untie_embeddings_and_output_weights False): the last stage's
copy (output_layer.weight, which Megatron marks shared_embedding and keeps in a bucket of its own) holds the
embedding's state, as Megatron keeps it; the model state saves the embedding alone; torch_dist_adam_buckets_pp2_uneven/,
an uneven pipeline split in the dp_reshardable layout at PP 2 x TP 1: 3 layers with --decoder-first-pipeline-num-layers
1 (Megatron's num_layers_in_first_pipeline_stage), layer 2 holding layer 0's state with the masters and first moment
negated.
ONLY=<names> limits a run to
the named fixtures. Run with
core_v0.12.1 (torch 2.5.1), --buckets writes torch_dist_adam_dp_zero_v012/ (dp_zero_gather_scatter) only.
Shim: numpy 2 lacks np.product (used by the sharding validation), aliased to np.prod.
Run (PyPI torch 2.5.1 with numpy, packaging and psutil on CPU; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  MEGATRON_LM=/tmp/meg python3 tools/reference/megatron_torch_dist_optim_reference.py tests/data/megatron
then with torch 2.6.0 and megatron-core 0.15.3 (TORCH_CUDA_ARCH_LIST set so that core_v0.15's CUDA-only
unified-memory extension fails to build quietly on CPU instead of raising):
  TORCH_CUDA_ARCH_LIST=8.0 MEGATRON_LM=/path/to/megatron-core-0.15.3 python3 \
    tools/reference/megatron_torch_dist_optim_reference.py --buckets tests/data/megatron
"""
import argparse
import dataclasses
import json
import os
import shutil
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt_reference as ref  # noqa: E402  (shims, sizes, megatron_args, shard)
import megatron_torch_dist_reference as dref  # noqa: E402  (build, the CPU shim of torch.cuda.synchronize)

# A smaller model than the other fixtures (the optimizer state triples the tensors): 2 layers, hidden 16,
# 4 heads in 2 query groups, SwiGLU ffn 24, vocabulary 50 padded to 64; Megatron's initialisation (seed 1234).
ref.NUM_LAYERS, ref.HIDDEN, ref.FFN = 2, 16, 24
ITERATION = ref.ITERATION
if not hasattr(np, "product"):  # numpy 2 dropped the alias that core_v0.12.1's sharding validation calls
    np.product = np.prod
GBS = 2
LR, MIN_LR, WARMUP, DECAY = 1e-3, 1e-4, 2 * GBS, 20 * GBS
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1


def scheduler(groups):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    class Holder:  # OptimizerParamScheduler only sets the groups' lr and weight_decay
        param_groups = groups
    return OptimizerParamScheduler(Holder(), init_lr=0.0, max_lr=LR, min_lr=MIN_LR, lr_warmup_steps=WARMUP,
                                   lr_decay_steps=DECAY, lr_decay_style="linear", start_wd=WD, end_wd=WD,
                                   wd_incr_steps=DECAY, wd_incr_style="constant")


def megatron_groups(model):
    """Megatron's two param groups: weight decay on the matrices, none on the 1-D norms."""
    extra = {"lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False}
    return [{"params": [p for p in model.parameters() if p.dim() > 1], "wd_mult": 1.0, **extra},
            {"params": [p for p in model.parameters() if p.dim() == 1], "wd_mult": 0.0, **extra}]


def args_for(tp, dp, distributed):
    a = ref.megatron_args(tp, 1)
    a.ckpt_format = "torch_dist"
    a.optimizer, a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay = "adam", BETAS[0], BETAS[1], EPS, WD
    a.lr, a.min_lr, a.lr_decay_style, a.lr_warmup_iters, a.lr_decay_iters = LR, MIN_LR, "linear", 2, 20
    a.global_batch_size, a.micro_batch_size, a.data_parallel_size = GBS, 1, dp
    a.consumed_train_samples = ITERATION * GBS
    a.use_distributed_optimizer = distributed
    a.ckpt_fully_parallel_save = True
    if distributed:
        a.bf16, a.params_dtype = True, torch.bfloat16
    return a


def train_adamw():
    """7 AdamW steps of Megatron's FP32Optimizer (world 1): the model, the optimizer and the scheduler."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer, MegatronOptimizer
    torch.manual_seed(1234)
    model = dref.build(1, 1, 0, 1, 29400 + os.getpid() % 300)
    groups = megatron_groups(model)
    adamw = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    sched = scheduler(adamw.param_groups)
    g = torch.Generator().manual_seed(7)
    for _ in range(ITERATION):
        for p in model.parameters():
            p.grad = 0.05 * torch.randn(p.shape, generator=g)
        adamw.step()
        sched.step(increment=GBS)
    opt = FP32Optimizer.__new__(FP32Optimizer)  # its __init__ puts the loss scale on CUDA
    MegatronOptimizer.__init__(opt, adamw, OptimizerConfig(optimizer="adam", lr=LR), lambda o, config=None: None)
    opt._scale = torch.tensor([1.0])
    opt.is_stub_optimizer = False
    return model, opt, sched


def global_state(model, adamw):
    """{name: {'fp32_param', 'exp_avg', 'exp_avg_sq'}} in the TP 1 torch-format names."""
    out = {}
    for name, p in model.named_parameters():
        s = adamw.state[p]
        out[name] = {"fp32_param": p.detach().clone(), "exp_avg": s["exp_avg"].clone(),
                     "exp_avg_sq": s["exp_avg_sq"].clone()}
    return out


def save_non_distributed(out):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    model, opt, sched = train_adamw()
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    os.makedirs(ckpt, exist_ok=True)
    st = {"args": args_for(1, 1, False), "checkpoint_version": 3.0, "iteration": ITERATION,
          "model": model.sharded_state_dict(), "num_floating_point_operations_so_far": 0.0,
          "opt_param_scheduler": sched.state_dict()}
    st["optimizer"] = opt.sharded_state_dict(st["model"])
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    state = global_state(model, opt.optimizer)
    groups = opt.optimizer.state_dict()["param_groups"]
    dist.destroy_process_group()
    return state, groups, sched.state_dict()


def dp_ranges(model, dp):
    """Each parameter's (start, stop) slice of its flattened local tensor owned by DP rank r: the flat buffer
    holds the parameters in reverse order (as Megatron's DDP buffer), padded to a multiple of dp, cut in dp
    contiguous parts."""
    params = list(model.named_parameters())[::-1]
    total = sum(p.numel() for _, p in params)
    per = -(-total // dp)
    ranges, at = {}, 0
    for name, p in params:
        ranges[name] = [(max(at, r * per) - at, min(at + p.numel(), (r + 1) * per) - at) for r in range(dp)]
        at += p.numel()
    return ranges


def fs_model_space(model, model_sd, state, dp_rank, tp, tp_rank):
    """DistributedOptimizer.sharded_param_state_fs_model_space for this rank: {param_idx: {state key: ShardedBase}}."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory
    by_name = {}
    for k, sh in model_sd.items():
        if "_extra_state" not in k:
            by_name[k] = sh
    local = {s: ref.shard({k: v[s] for k, v in state.items()}, tp, 1, tp_rank, 0)
             for s in ("fp32_param", "exp_avg", "exp_avg_sq")}
    out, idx = {}, 0
    for name, (start, stop) in ((n, r[dp_rank]) for n, r in dp_ranges(model, 2).items()):
        if start >= stop:
            continue
        sh = by_name[name]
        tensors = {}
        for s in ("fp32_param", "exp_avg", "exp_avg_sq"):
            data = local[s][name].reshape(-1)[start:stop].clone()
            kw = dict(key="optimizer.state.%s.%s" % (s, sh.key), data=data, dtype=data.dtype,
                      flattened_range=slice(start, stop), replica_id=(*sh.replica_id[:2], 0))
            if isinstance(sh, ShardedTensorFactory):
                kw.pop("dtype")
            tensors[s] = dataclasses.replace(sh, **kw)
        out[idx] = tensors
        idx += 1
    return out


def dp2_worker(rank, world, out, port, state, groups, sched_sd):
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    tp = 2
    model = dref.build(tp, 1, rank, world, port)
    t = parallel_state.get_tensor_model_parallel_rank()
    d = parallel_state.get_data_parallel_rank()
    weights = {k: v["fp32_param"] for k, v in state.items()}
    model.load_state_dict(ref.shard(weights, tp, 1, t, 0), strict=True)
    model.bfloat16()
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    model_sd = model.sharded_state_dict()
    dist_groups = []
    for grp in groups:
        g = {k: v for k, v in grp.items() if k != "params"}
        g["step"] = ITERATION  # DistributedOptimizer.state_dict: torch Adam's step moved into the groups
        dist_groups.append(g)
    optimizer = {"optimizer": {"param_groups": dist_groups},
                 "param_state": fs_model_space(model, model_sd, state, d, tp, t),
                 "param_state_sharding_type": "fully_sharded_model_space"}
    st = {"args": args_for(tp, 2, True), "checkpoint_version": 3.0, "iteration": ITERATION, "model": model_sd,
          "num_floating_point_operations_so_far": 0.0, "opt_param_scheduler": sched_sd, "optimizer": optimizer}
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    # Megatron reads it back: the same sharded state dict, emptied, loaded.
    empty = fs_model_space(model, model.sharded_state_dict(), {k: {s: torch.zeros_like(x) for s, x in v.items()}
                                                               for k, v in state.items()}, d, tp, t)
    loaded = dist_checkpointing.load({"optimizer": {"param_state": empty}}, ckpt)["optimizer"]["param_state"]
    want = fs_model_space(model, model.sharded_state_dict(), state, d, tp, t)
    for i, tensors in want.items():
        for s, sh in tensors.items():
            got = loaded[i][s]
            got = got.data if hasattr(got, "data") and not torch.is_tensor(got) else got
            assert torch.equal(got, sh.data), (i, s)
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        print("dist_checkpointing.load of", ckpt, "gives every rank's fp32_param / exp_avg / exp_avg_sq pieces back")
    dist.destroy_process_group()


def reshardable_worker(rank, world, out, port, state, groups, sched_sd):
    """One process, TP 1: the distributed optimizer's fully_reshardable layout (Megatron main's
    sharded_param_state_fully_reshardable: whole model-space tensors replacing each model ShardedTensor,
    the master copies under 'param'), bf16 model."""
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    model = dref.build(1, 1, rank, world, port)
    model.load_state_dict({k: v["fp32_param"] for k, v in state.items()}, strict=True)
    model.bfloat16()
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    os.makedirs(ckpt, exist_ok=True)
    model_sd = model.sharded_state_dict()
    param_state = {}
    for idx, (name, sh) in enumerate((k, v) for k, v in model_sd.items() if "_extra_state" not in k):
        tensors = {}
        for s, key in (("param", "fp32_param"), ("exp_avg", "exp_avg"), ("exp_avg_sq", "exp_avg_sq")):
            data = state[name][key].clone()
            kw = dict(key="optimizer.state.%s.%s" % (s, sh.key), data=data, dtype=data.dtype)
            if isinstance(sh, ShardedTensorFactory):
                kw.pop("dtype")
            tensors[s] = dataclasses.replace(sh, **kw)
        param_state[idx] = tensors
    dist_groups = [dict({k: v for k, v in g.items() if k != "params"}, step=ITERATION) for g in groups]
    optimizer = {"optimizer": {"param_groups": dist_groups}, "param_state": param_state,
                 "param_state_sharding_type": "fully_reshardable"}
    st = {"args": args_for(1, 1, True), "checkpoint_version": 3.0, "iteration": ITERATION, "model": model_sd,
          "num_floating_point_operations_so_far": 0.0, "opt_param_scheduler": sched_sd, "optimizer": optimizer}
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    dist.destroy_process_group()


def saved_state(fixtures, keep_shape=False):
    """{TP 1 torch-format name: {'fp32_param', 'exp_avg', 'exp_avg_sq'}} read back from torch_dist_adam (the
    non-distributed fixture), so that the bucket-space fixtures hold exactly its state whatever Megatron
    release builds them."""
    from torch.distributed.checkpoint import FileSystemReader, load
    ckpt = os.path.join(fixtures, "torch_dist_adam", "iter_%07d" % ITERATION)
    md = FileSystemReader(ckpt).read_metadata()
    flat = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if hasattr(v, "size")}
    load(flat, storage_reader=FileSystemReader(ckpt))  # before the process group: no collectives
    local_names = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                   "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
                   "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
                   "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}
    out = {}
    for key, t in flat.items():
        if key.startswith("optimizer."):
            continue
        for s, src in (("fp32_param", key), ("exp_avg", "optimizer.state.exp_avg." + key),
                       ("exp_avg_sq", "optimizer.state.exp_avg_sq." + key)):
            x = flat[src]
            if key.startswith("decoder.layers."):
                rest = key[len("decoder.layers."):]
                for i in range(x.shape[0]):
                    name = "decoder.layers.%d.%s" % (i, local_names.get(rest, rest))
                    out.setdefault(name, {})[s] = (x[i] if keep_shape else x[i].reshape(-1)).clone()
            else:
                out.setdefault(key, {})[s] = (x if keep_shape else x.reshape(-1)).clone()
    return out


BUCKET_SIZE = 1000  # --ddp-bucket-size with --overlap-grad-reduce: several buckets from the tiny model


def bucket_worker(rank, world, out, port, fixtures, sharding_type, tp=1, pp=1, tied=False, first_stage_layers=None):
    """DP 2 x TP 1, bf16 model: Megatron's own _ParamAndGradBuffer lays the parameters out in buckets (reverse
    order, 64-element aligned starts, buckets padded to lcm(DP, 128)), DistributedOptimizer's classmethods cut
    each bucket's DP shards, and its sharded_state_dict / sharded_param_state_<layout> build the optimizer's
    sharded state dict over an optimizer stand-in that hands each parameter's fp32 master and Adam moments for
    the rank's range (as TE's FusedAdam keeps them: no per-parameter step)."""
    import inspect
    import types
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    state = saved_state(fixtures, keep_shape=True)
    if tied:  # the embedding shared with the output layer: the last stage's copy holds the embedding's state, as
        # Megatron keeps it (both copies start equal and their gradients are all-reduced over the embedding group)
        state["output_layer.weight"] = {s: x.clone() for s, x in state["embedding.word_embeddings.weight"].items()}
        torch.Tensor.cuda = lambda t, *a, **k: t  # GPTModel all-reduces the two copies on "CUDA" (here gloo)
    if first_stage_layers is not None:  # an uneven split of 3 layers: layer 2 is layer 0's state, masters and first
        # moment negated (a state of its own that still fits Adam), the first stage holding `first_stage_layers`
        ref.NUM_LAYERS = 3
        for name in [n for n in state if n.startswith("decoder.layers.0.")]:
            s0 = state[name]
            state["decoder.layers.2." + name[len("decoder.layers.0."):]] = {
                "fp32_param": -s0["fp32_param"], "exp_avg": -s0["exp_avg"], "exp_avg_sq": s0["exp_avg_sq"].clone()}
    model = dref.build(tp, pp, rank, world, port, tied=tied, first_stage_layers=first_stage_layers)
    t, p_rank = parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_rank()
    # Rank (t, p)'s local masters and moments: TP shards (SwiGLU halves cut separately), its stage's layers
    # renumbered from 0, the embedding on the first stage and the output layer on the last, as Megatron holds them.
    if first_stage_layers is None:
        local = {s: ref.shard({k: v[s] for k, v in state.items()}, tp, pp, t, p_rank)
                 for s in ("fp32_param", "exp_avg", "exp_avg_sq")}
    else:  # TP 1, PP 2: layers [0, first) on the first stage, the rest on the last, renumbered from 0
        assert tp == 1 and pp == 2
        offset = 0 if p_rank == 0 else first_stage_layers
        local = {}
        for k, v in state.items():
            if k.startswith("decoder.layers."):
                i = int(k.split(".")[2])
                if (i < first_stage_layers) != (p_rank == 0):
                    continue
                k = "decoder.layers.%d.%s" % (i - offset, k.split(".", 3)[3])
            elif k.startswith("embedding.") and p_rank != 0:
                continue
            elif (k.startswith("output_layer.") or k.startswith("decoder.final_layernorm")) and p_rank != 1:
                continue
            for s in ("fp32_param", "exp_avg", "exp_avg_sq"):
                local.setdefault(s, {})[k] = v[s].clone()
    state = {k: {s: local[s][k].reshape(-1) for s in local} for k in local["fp32_param"]}
    model.load_state_dict({k: state[k]["fp32_param"].reshape(p.shape) for k, p in model.named_parameters()},
                          strict=False)
    model.bfloat16()
    dp_group = parallel_state.get_data_parallel_group()
    # DistributedOptimizer's data_parallel_group_idx: the rank in the model-parallel group (TP x PP), which
    # tells each model-parallel rank's buffers apart in the checkpoint keys.
    mp_rank = dist.get_rank(group=parallel_state.get_model_parallel_group())
    params = [p for p in model.parameters() if p.requires_grad]
    names = {p: n for n, p in model.named_parameters()}
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                               use_distributed_optimizer=True, bucket_size=BUCKET_SIZE)
    extra = ()  # core_v0.15 added nccl_ub and the process groups
    if "nccl_ub" in inspect.signature(_ParamAndGradBuffer.__init__).parameters:
        extra = (False, types.SimpleNamespace(tp=parallel_state.get_tensor_model_parallel_group(), dp_cp=dp_group))
    buffer = _ParamAndGradBuffer(ddp_config, torch.bfloat16, torch.float32, params, dp_group, BUCKET_SIZE, names,
                                 1.0, list(range(len(params))), *extra)
    gbuf_ranges = [DistributedOptimizer._build_gbuf_range_map(buffer)]

    def main_states(model_param):
        rng = None
        for per_bucket in gbuf_ranges[0].values():
            for m in per_bucket:
                if model_param in m["param_map"]:
                    rng = m["param_map"][model_param]["param"]
        s = state[names[model_param]]
        return {"param": s["fp32_param"][rng.start:rng.end].clone(), "exp_avg": s["exp_avg"][rng.start:rng.end].clone(),
                "exp_avg_sq": s["exp_avg_sq"][rng.start:rng.end].clone()}

    _, groups, _ = json_groups(fixtures)
    opt = types.SimpleNamespace(
        gbuf_ranges=gbuf_ranges, buffers=[buffer], data_parallel_group=dp_group, data_parallel_group_idx=mp_rank,
        distributed_optimizer_instance_id=0,  # per buffer {(param dtype, grad dtype): [per bucket]}, as Megatron's
        per_bucket_numel=[{(torch.bfloat16, torch.float32): [b.grad_data.numel() for b in buffer.buckets]}],
        per_bucket_numel_unpadded=[{(torch.bfloat16, torch.float32): [b.numel_unpadded for b in buffer.buckets]}],
        ddp_config=types.SimpleNamespace(use_megatron_fsdp=False, use_custom_fsdp=False),
        checkpoint_fully_reshardable_formats=getattr(DistributedOptimizer, "checkpoint_fully_reshardable_formats",
                                                     {"fully_sharded_model_space"}),
        _get_main_param_and_optimizer_states=main_states,
        state_dict=lambda: {"optimizer": {"param_groups": [dict(g, step=ITERATION) for g in groups]}})
    opt.data_parallel_group_gloo = dp_group  # core_v0.12 gathers over it
    for name in ("get_parameter_state_dp_reshardable", "sharded_param_state_dp_reshardable",
                 "get_parameter_state_dp_zero", "sharded_param_state_dp_zero"):
        if hasattr(DistributedOptimizer, name):
            setattr(opt, name, types.MethodType(getattr(DistributedOptimizer, name), opt))
    torch.Tensor.cuda = lambda t, *a, **k: t  # dp_zero_gather_scatter gathers over the (here gloo) DP group
    model_sd = model.sharded_state_dict()
    if "metadata" in inspect.signature(DistributedOptimizer.sharded_state_dict).parameters:  # core_v0.13+
        optimizer = DistributedOptimizer.sharded_state_dict(opt, model_sd, metadata={"distrib_optim_sharding_type":
                                                                                     sharding_type})
    else:
        optimizer = DistributedOptimizer.sharded_state_dict(opt, model_sd, sharding_type=sharding_type)
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    a = args_for(tp, world // (tp * pp), True)
    a.pipeline_model_parallel_size = pp
    a.transformer_impl = "local"
    a.overlap_grad_reduce, a.ddp_bucket_size, a.accumulate_allreduce_grads_in_fp32 = True, BUCKET_SIZE, True
    a.dist_ckpt_optim_fully_reshardable = False
    a.untie_embeddings_and_output_weights = not tied
    if first_stage_layers is not None:
        a.num_layers, a.decoder_first_pipeline_num_layers = 3, first_stage_layers
    _, _, sched_sd = json_groups(fixtures)
    st = {"args": a, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model_sd,
          "num_floating_point_operations_so_far": 0.0, "opt_param_scheduler": sched_sd, "optimizer": optimizer}
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
    if parallel_state.get_data_parallel_rank() == 0:
        layout = {names[p]: list(r[:2]) for p, r in buffer.param_index_map.items()}
        print("tp", t, "pp", p_rank, "dp_group_idx", mp_rank,
              "buckets", [(b.offset, b.grad_data.numel(), b.numel_unpadded) for b in buffer.buckets])
        print("tp", t, "pp", p_rank, "layout", layout)
    dist.destroy_process_group()


def json_groups(fixtures):
    with open(os.path.join(fixtures, "torch_dist_optim.json")) as f:
        d = json.load(f)["torch_dist_adam"]
    return d["step"], d["param_groups"], d["opt_param_scheduler"]


def main_buckets(fixtures):
    """The bucket-space fixtures (run with a Megatron release that has dp_reshardable, core_v0.15)."""
    with open(os.path.join(fixtures, "torch_dist_optim.json")) as f:
        result = json.load(f)
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
    if hasattr(DistributedOptimizer, "sharded_param_state_dp_reshardable"):  # core_v0.15
        fixtures_to_write = (("torch_dist_adam_buckets", "dp_reshardable", 1, 1, 2),
                             ("torch_dist_adam_dp_zero", "dp_zero_gather_scatter", 1, 1, 2),
                             ("torch_dist_adam_buckets_tp2pp2", "dp_reshardable", 2, 2, 4),
                             ("torch_dist_adam_dp_zero_tp2pp2", "dp_zero_gather_scatter", 2, 2, 4),
                             ("torch_dist_adam_buckets_tp2pp2_tied", "dp_reshardable", 2, 2, 4, True),
                             ("torch_dist_adam_dp_zero_tp2pp2_tied", "dp_zero_gather_scatter", 2, 2, 4, True),
                             ("torch_dist_adam_buckets_pp2_uneven", "dp_reshardable", 1, 2, 2, False, 1))
    else:  # core_v0.12
        fixtures_to_write = (("torch_dist_adam_dp_zero_v012", "dp_zero_gather_scatter", 1, 1, 2),)
    if os.environ.get("ONLY"):  # regenerate the named fixtures only (comma-separated)
        fixtures_to_write = [f for f in fixtures_to_write if f[0] in os.environ["ONLY"].split(",")]
    for name, layout, tp, pp, world, *more in fixtures_to_write:
        tied, first_stage_layers = (more + [False, None])[:2]
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        mp.spawn(bucket_worker, args=(world, out, 29600 + os.getpid() % 90, fixtures, layout, tp, pp, tied,
                                      first_stage_layers), nprocs=world, join=True)
        result[name] = {"step": ITERATION, "opt_param_scheduler": json_groups(fixtures)[2]}
        result["listing"][name] = dref.listing(os.path.join(out, "iter_%07d" % ITERATION))
    with open(os.path.join(fixtures, "torch_dist_optim.json"), "w") as f:
        json.dump(result, f, indent=1)


def summary(state):
    out = {}
    for name, v in sorted(state.items()):
        for s, t in v.items():
            out.setdefault(s, {})[name] = {"shape": list(t.shape), "sum": float(t.double().sum()),
                                           "first": [float(x) for x in t.reshape(-1)[:4]]}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--buckets", action="store_true", help="write the bucket-space fixtures only")
    a = ap.parse_args()
    if a.buckets:
        return main_buckets(a.out)
    result = {}
    out = os.path.join(a.out, "torch_dist_adam")
    shutil.rmtree(out, ignore_errors=True)
    state, groups, sched_sd = save_non_distributed(out)
    for x in groups:
        x.pop("params")
    result["torch_dist_adam"] = {"step": ITERATION, "opt_param_scheduler": sched_sd, "param_groups": groups,
                                 "tensors": summary(state)}
    out = os.path.join(a.out, "torch_dist_adam_dp2")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    mp.spawn(dp2_worker, args=(4, out, 29700 + os.getpid() % 200, state, groups, sched_sd), nprocs=4, join=True)
    result["torch_dist_adam_dp2"] = {"step": ITERATION, "opt_param_scheduler": sched_sd}
    out = os.path.join(a.out, "torch_dist_adam_reshardable")
    shutil.rmtree(out, ignore_errors=True)
    mp.spawn(reshardable_worker, args=(1, out, 29900 + os.getpid() % 90, state, groups, sched_sd), nprocs=1, join=True)
    result["torch_dist_adam_reshardable"] = {"step": ITERATION, "opt_param_scheduler": sched_sd}
    names = ("torch_dist_adam", "torch_dist_adam_dp2", "torch_dist_adam_reshardable")
    result["listing"] = {n: dref.listing(os.path.join(a.out, n, "iter_%07d" % ITERATION)) for n in names}
    with open(os.path.join(a.out, "torch_dist_optim.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("wrote", ", ".join(result))


if __name__ == "__main__":
    main()
