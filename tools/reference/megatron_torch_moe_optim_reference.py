"""Megatron's optimizer state of a MoE model in the legacy `torch` format (--ckpt-format torch), at EP 1 and EP 2.

The state is moe/torch_dist_adam_chained's (megatron_moe_chained_optim_reference.py: the MoE model of moe/torch_ep1 --
Megatron core_v0.12.1's own GPTModel, local spec, 2 layers, 4 SequentialMLP experts with SwiGLU ffn 8, a shared expert,
a router with expert bias -- after 7 AdamW steps), its fp32 masters and moments read back from that directory and
unstacked into the torch format's per-layer, per-expert tensors, so the two fixtures hold the same state element for
element. Written under tests/data/megatron/moe/, as a --bf16 run saves it in the legacy format (the weights the masters
rounded to bf16; the router's expert_bias, a buffer, and the _extra_state entries as torch_ep1 has them):
  torch_adam_ep1/          EP 1, DP 1, non-distributed: at EP 1 Megatron's expert parameters keep allreduce True
                           (tensor_parallel/layers.py: allreduce = not (is_expert and expert_parallel)), so
                           get_megatron_optimizer builds one optimizer over every parameter and ChainedOptimizer's
                           state_dict() is that optimizer's own: mp_rank_00/model_optim_rng.pt's 'optimizer' is
                           Float16OptimizerWithFloat16Params.state_dict(), the experts in its param groups
  torch_adam_ep2/          EP 2 (world 2: dense DP 2, expert DP 1), non-distributed: the experts (allreduce False) sit in
                           an optimizer of their own, so 'optimizer' is ChainedOptimizer.state_dict()'s list
                           [dense Float16 state, expert Float16 state]; each EP rank's file mp_rank_00_00E (written by
                           expert-DP rank 0) holds its two local experts numbered 0, 1 and its own expert state (the
                           param groups with is_expert_parallel True), the dense state alike in both
  torch_adam_distopt_ep1/  EP 1 at DP 2 with the distributed optimizer (--overlap-grad-reduce --ddp-bucket-size 300):
                           one _ParamAndGradBuffer over every parameter, distrib_optim.pt =
                           get_parameter_state_dp_zero() as DistributedOptimizer.save_parameter_state writes it
  torch_adam_distopt_ep2/  EP 2 with the distributed optimizer: 'optimizer' is the list [dense, expert]
                           DistributedOptimizer.state_dict(), and ChainedOptimizer.save_parameter_state writes
                           distrib_optim.pt = [dense get_parameter_state_dp_zero() on dense-DP rank 0 else None,
                           expert one on expert-DP rank 0] (so mp_rank_00_001's is [None, its experts']); the dense
                           buffer over the dense DP group of 2, each expert buffer over its expert DP group of 1
  torch_adam_tp2ep2/, torch_adam_distopt_tp2ep2/  the two EP 2 layouts at TP 2 x EP 2 (world 4: dense DP 2, expert TP
                           2, expert DP 1), mp_rank_TT_EEE: each rank's TP pieces cut as Megatron's layers split them
                           (cut(): megatron_moe_reference.py's rules, whose torch_tp2ep2 Megatron's own model
                           reproduces), the dense state from each tensor rank's dense-DP rank 0 (expert rank 0)
  torch_adam_pp2ep2/, torch_adam_distopt_pp2ep2/  the same at PP 2 x EP 2 (world 4: dense DP 2, expert DP 1), one layer
                           per stage (the embedding on the first, the final norm and output layer on the last), each
                           stage's file numbering its layer 0, mp_rank_00_PPP_EEE
Megatron core_v0.12.1's own code builds every piece: _get_param_groups (over a stand-in chunk whose named_parameters
are the rank's parameters in torch_ep1's state-dict order, Megatron's registration order, with the allreduce flags
Megatron's layers set), the get_megatron_optimizer split of the groups (is_expert_parallel), the optimizers'
state_dict(), ChainedOptimizer.state_dict() / save_parameter_state(), _ParamAndGradBuffer and
DistributedOptimizer._build_gbuf_range_map / get_parameter_state_dp_zero / state_dict() over stand-ins (their
constructors need CUDA) in a gloo group, as megatron_torch_optim_reference.py does. The GPTModel itself is not rebuilt
(torch 1.13): the parameter order and names are torch_ep1's saved state dict's.
Run (Debian's torch 1.13 on CPU, PyPI packaging; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  PYTHONPATH=/path/to/packaging MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 /usr/bin/python3 \
    tools/reference/megatron_torch_moe_optim_reference.py tests/data/megatron/moe
"""
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_ckpt_reference  # noqa: E402,F401  (torch 1.13 shims for Megatron's imports; MEGATRON_LM on the path)
ITERATION, GBS = 7, 2
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1
MAX_LR, MIN_LR = 1e-3, 1e-4
BUCKET = 300
FUSED_NORMS = {"self_attention.linear_qkv.layer_norm_": "input_layernorm.", "mlp.linear_fc1.layer_norm_": "pre_mlp_layernorm."}
EXPERT = re.compile(r"^(decoder\.layers\.\d+\.mlp\.experts\.local_experts\.)(\d+)(\..*)$")

READ_CHAINED = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import megatron_moe_chained_optim_reference as cref
d = sys.argv[2] + "/torch_dist_adam_chained/iter_0000007"
e = cref.read_dcp(d)
common = torch.load(d + "/common.pt", map_location="cpu")
out = {"state": {}, "scheduler": common["opt_param_scheduler"], "lr": common["optimizer"][0]["optimizer"]["param_groups"][0]["lr"]}
for k in e:
    if k.startswith("optimizer.state.param."):
        n = k[len("optimizer.state.param."):]
        out["state"][n] = {"fp32_param": e[k][0].clone(), "exp_avg": e["optimizer.state.exp_avg." + n][0].clone(),
                           "exp_avg_sq": e["optimizer.state.exp_avg_sq." + n][0].clone()}
torch.save(out, sys.argv[3])
"""


def chained_state(fixtures):
    """torch_dist_adam_chained's state by torch-format name (TP 1, global experts), its scheduler state and lr."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "state.pt")
        subprocess.run([sys.executable, "-c", READ_CHAINED, HERE, fixtures, path], check=True)  # its own module stubs
        got = torch.load(path)
    state = {}
    for key, s in got["state"].items():
        m = re.match(r"^decoder\.layers\.(.*)$", key)
        if not m:
            state[key] = s
            continue
        sub = m.group(1)
        for fused, local in FUSED_NORMS.items():  # the local spec's sharded_state_dict_keys_map, undone
            sub = sub.replace(fused, local)
        layers = s["fp32_param"].shape[0]
        for l in range(layers):
            if sub.startswith("mlp.experts.experts."):
                for e in range(s["fp32_param"].shape[1]):
                    name = "decoder.layers.%d.mlp.experts.local_experts.%d.%s" % (l, e, sub[len("mlp.experts.experts."):])
                    state[name] = {k: v[l, e].clone() for k, v in s.items()}
            else:
                state["decoder.layers.%d.%s" % (l, sub)] = {k: v[l].clone() for k, v in s.items()}
    return state, got["scheduler"], got["lr"]


def is_param(key, value):
    return torch.is_tensor(value) and not key.endswith("_extra_state") and not key.endswith(".router.expert_bias")


def cut(k, v, tp, t):
    """Tensor-parallel piece t of tp of `v` (torch-format name k) as Megatron's layers split it (expert TP = TP; the
    rules of megatron_moe_reference.py, whose torch_tp2ep2 Megatron's model reproduces): SwiGLU linear_fc1 (experts'
    and shared expert's) [gate piece; up piece], rows of linear_qkv, word embeddings and output layer, columns of
    linear_proj and linear_fc2; norms and the router whole."""
    if tp == 1:
        return v.clone()
    if k.endswith("linear_fc1.weight"):
        gate, up = v.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]], 0).clone()
    if any(k.endswith(x) for x in ("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
        return v.chunk(tp, 0)[t].clone()
    if any(k.endswith(x) for x in ("linear_proj.weight", "linear_fc2.weight")):
        return v.chunk(tp, 1)[t].clone()
    return v.clone()


def stage_name(key, pp, p, num_layers):
    """`key` as pipeline stage p of pp names it (its layers numbered from 0; the embedding on the first stage, the final
    norm and output layer on the last), None when another stage holds it."""
    m = re.match(r"^decoder\.layers\.(\d+)\.(.*)$", key)
    per = num_layers // pp
    if m:
        layer = int(m.group(1))
        return "decoder.layers.%d.%s" % (layer - p * per, m.group(2)) if layer // per == p else None
    if key.startswith("embedding."):
        return key if p == 0 else None
    return key if p == pp - 1 else None


def rank_model(src_sd, state, ep, e, local_experts, tp=1, t=0, pp=1, p=0, num_layers=0):
    """(EP rank e, TP rank t, stage p)'s state dict (torch_ep1's order, local experts renumbered) and its parameters
    [(file name, global)]."""
    sd, params = {}, []
    for key, v in src_sd.items():
        name = stage_name(key, pp, p, num_layers)
        if name is None:
            continue
        m = EXPERT.match(name)
        if m:
            g = int(m.group(2))
            if g // local_experts != e:
                continue
            name = "%s%d%s" % (m.group(1), g % local_experts, m.group(3))
        if is_param(key, v):
            assert state[key]["fp32_param"].shape == cut(key, v, tp, t).shape, key
            sd[name] = state[key]["fp32_param"].to(torch.bfloat16)
            params.append((name, key, m is not None))
        else:
            sd[name] = v
    return sd, params


def worker(rank, world, port, out, name, src, state, sched_sd, lr, tp, ep, distributed, pp=1):
    from megatron.core.optimizer import _get_param_groups
    from megatron.core.optimizer.optimizer import ChainedOptimizer, Float16OptimizerWithFloat16Params
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from megatron.core import parallel_state
    parallel_state.initialize_model_parallel(tp, pp, expert_model_parallel_size=ep, expert_tensor_parallel_size=tp)
    t = parallel_state.get_tensor_model_parallel_rank()
    p = parallel_state.get_pipeline_model_parallel_rank()
    state = {k: {n: cut(k, v, tp, t) for n, v in s.items()} for k, s in state.items()}  # this TP rank's pieces
    dense_dp = parallel_state.get_data_parallel_group()
    expert_dp = parallel_state.get_expert_data_parallel_group()
    e = parallel_state.get_expert_model_parallel_rank()
    experts = src["args"].num_experts
    sd, params = rank_model(src["model"], state, ep, e, experts // ep, tp, t, pp, p, src["args"].num_layers)
    masters, names = {}, {}
    named = []
    for file_name, global_name, is_expert in params:
        q = torch.nn.Parameter(state[global_name]["fp32_param"].to(torch.bfloat16))
        q.allreduce = not (is_expert and ep > 1)  # Megatron's layers: not (is_expert and expert_parallel)
        names[q] = global_name
        named.append((file_name, q))
    chunk = types.SimpleNamespace(ddp_config=types.SimpleNamespace(use_custom_fsdp=False),
                                  named_parameters=lambda: iter(named))
    groups = _get_param_groups([chunk], None, None, 1.0, MAX_LR, MIN_LR, None, None)
    for g in groups:
        g["lr"], g["weight_decay"] = lr, WD * g["wd_mult"]
    split = [[g for g in groups if not g["is_expert_parallel"]], [g for g in groups if g["is_expert_parallel"]]]
    split = [s for s in split if s]

    def adamw(gs):
        ms = []
        for g in gs:
            ms.append([])
            for q in g["params"]:
                m = torch.nn.Parameter(state[names[q]]["fp32_param"].clone())
                names[m] = names[q]
                ms[-1].append(m)
            g["params"] = list(ms[-1])
        opt = torch.optim.AdamW(gs, lr=lr, betas=BETAS, eps=EPS, weight_decay=WD)
        for g in opt.param_groups:
            for m in g["params"]:
                s = state[names[m]]
                opt.state[m] = {"step": torch.tensor(float(ITERATION)), "exp_avg": s["exp_avg"].clone(),
                                "exp_avg_sq": s["exp_avg_sq"].clone()}
        return opt, ms

    d = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_%02d" % t + ("_%03d" % p if pp > 1 else "") +
                     ("_%03d" % e if ep > 1 else ""))
    writes = dist.get_rank(expert_dp) == 0  # checkpointing.py: expert-data-parallel rank 0 writes the rank file
    chained = []
    if not distributed:
        for gs in split:
            opt, ms = adamw(gs)
            f16 = Float16OptimizerWithFloat16Params.__new__(Float16OptimizerWithFloat16Params)  # __init__ needs CUDA
            f16.optimizer, f16.fp32_from_float16_groups, f16.grad_scaler = opt, ms, None
            f16.state_dict = types.MethodType(Float16OptimizerWithFloat16Params.state_dict, f16)
            chained.append(f16)
    else:
        import inspect
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                   use_distributed_optimizer=True, bucket_size=BUCKET)
        assert "nccl_ub" not in inspect.signature(_ParamAndGradBuffer.__init__).parameters
        model_names = {q: n for n, q in named}
        for i, gs in enumerate(split):
            expert_opt = len(split) > 1 and i == 1
            group = expert_dp if expert_opt else dense_dp
            members = {id(q) for g in gs for q in g["params"]}
            buf_params = [q for _, q in named if id(q) in members]  # the buffer walks model.parameters()
            buffer = _ParamAndGradBuffer(ddp_config, torch.bfloat16, torch.float32, buf_params, group, BUCKET,
                                         model_names, 1.0, list(range(len(buf_params))))
            if dist.get_rank(group) == 0:
                print(name, "rank", rank, "expert" if expert_opt else "dense", "buckets",
                      [(b.grad_data.numel(), b.numel_unpadded) for b in buffer.buckets])
            gbuf_ranges = [DistributedOptimizer._build_gbuf_range_map(buffer)]
            opt, _ = adamw(gs)

            def main_states(model_param, gbuf_ranges=gbuf_ranges):
                rng = None
                for per_bucket in gbuf_ranges[0].values():
                    for m in per_bucket:
                        if model_param in m["param_map"]:
                            rng = m["param_map"][model_param]["param"]
                s = state[names[model_param]]
                return {"param": s["fp32_param"].reshape(-1)[rng.start:rng.end].clone(),
                        "exp_avg": s["exp_avg"].reshape(-1)[rng.start:rng.end].clone(),
                        "exp_avg_sq": s["exp_avg_sq"].reshape(-1)[rng.start:rng.end].clone()}
            so = types.SimpleNamespace(gbuf_ranges=gbuf_ranges, buffers=[buffer], data_parallel_group=group,
                                       data_parallel_group_gloo=group, optimizer=opt, grad_scaler=None,
                                       _get_main_param_and_optimizer_states=main_states,
                                       ddp_config=types.SimpleNamespace(use_custom_fsdp=False))
            so.get_parameter_state_dp_zero = types.MethodType(DistributedOptimizer.get_parameter_state_dp_zero, so)
            so.save_parameter_state = types.MethodType(DistributedOptimizer.save_parameter_state, so)
            so.state_dict = types.MethodType(DistributedOptimizer.state_dict, so)
            chained.append(so)
    chain = ChainedOptimizer.__new__(ChainedOptimizer)
    chain.chained_optimizers = chained
    optimizer_sd = ChainedOptimizer.state_dict(chain)
    os.makedirs(d, exist_ok=True)
    dist.barrier()
    if distributed:  # every rank calls it on its own checkpoint directory (checkpointing.save_checkpoint)
        ChainedOptimizer.save_parameter_state(chain, os.path.join(d, "distrib_optim.pt"))
    if writes:
        args = copy.deepcopy(src["args"])
        args.bf16, args.params_dtype, args.fp16 = True, torch.bfloat16, False
        args.optimizer, args.adam_beta1, args.adam_beta2, args.adam_eps, args.weight_decay = "adam", *BETAS, EPS, WD
        args.lr, args.min_lr, args.lr_decay_style, args.lr_warmup_iters, args.lr_decay_iters = MAX_LR, MIN_LR, \
            "linear", 2, 20
        args.global_batch_size, args.micro_batch_size = GBS, 1
        args.consumed_train_samples = ITERATION * GBS
        args.iteration = ITERATION
        args.expert_model_parallel_size, args.world_size, args.data_parallel_size = ep, world, world // tp
        args.tensor_model_parallel_size, args.expert_tensor_parallel_size = tp, tp
        args.pipeline_model_parallel_size, args.data_parallel_size = pp, world // (tp * pp)
        args.use_distributed_optimizer = distributed
        args.overlap_grad_reduce, args.ddp_bucket_size = distributed, BUCKET if distributed else None
        args.accumulate_allreduce_grads_in_fp32 = True
        torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd,
                    "optimizer": optimizer_sd, "opt_param_scheduler": sched_sd,
                    "num_floating_point_operations_so_far": 0.0}, os.path.join(d, "model_optim_rng.pt"))
    dist.barrier()
    dist.destroy_process_group()


def main():
    fixtures = sys.argv[1]
    state, sched_sd, lr = chained_state(fixtures)
    src = torch.load(os.path.join(fixtures, "torch_ep1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt"),
                     map_location="cpu")
    keys = [k for k, v in src["model"].items() if is_param(k, v)]
    assert sorted(keys) == sorted(state), (sorted(set(keys) ^ set(state)))
    for k, (name, world, tp, ep, distributed) in enumerate((("torch_adam_ep1", 1, 1, 1, False),
                                                            ("torch_adam_ep2", 2, 1, 2, False),
                                                            ("torch_adam_distopt_ep1", 2, 1, 1, True),
                                                            ("torch_adam_distopt_ep2", 2, 1, 2, True),
                                                            ("torch_adam_tp2ep2", 4, 2, 2, False),
                                                            ("torch_adam_distopt_tp2ep2", 4, 2, 2, True),
                                                            ("torch_adam_pp2ep2", 4, 1, 2, False),
                                                            ("torch_adam_distopt_pp2ep2", 4, 1, 2, True))):
        if os.environ.get("ONLY") and name not in os.environ["ONLY"].split(","):
            continue
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        pp = 2 if "pp2" in name else 1
        mp.spawn(worker, args=(world, 29000 + os.getpid() % 400 + 50 * k, out, name, src, state, sched_sd, lr, tp, ep,
                               distributed, pp), nprocs=world, join=True)
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        print("wrote", out)


if __name__ == "__main__":
    main()
