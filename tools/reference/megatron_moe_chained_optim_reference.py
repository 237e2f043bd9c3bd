#!/usr/bin/env python3
"""Megatron's ChainedOptimizer state (dense + MoE expert optimizer) in a torch_dist checkpoint, for Gale's resume.

Writes tests/data/megatron/moe/torch_dist_adam_chained/ (and torch_dist_adam_chained.json next to it; the same state in
the bucket-space layouts at EP 2 as torch_dist_adam_chained_buckets/ and torch_dist_adam_chained_dp_zero/, see
write_bucket_layout): the MoE model of
tests/data/megatron/moe/torch_dist (megatron_moe_reference.py: Megatron core_v0.12.1's own save; 2 layers, 4 experts
top-2, SwiGLU expert ffn 8, a shared expert, sigmoid router with expert bias) after 7 AdamW steps (torch.optim.AdamW,
betas 0.9 / 0.95, eps 1e-8, weight decay 0.1 on the matrices and none on 1-D tensors, as Megatron's param groups) on
seeded synthetic gradients with Megatron's learning-rate schedule (linear, warmup 4 and decay 40 samples, 1e-3 -> 1e-4,
2 samples per iteration: iteration t uses num_steps 2 (t - 1)), saved as Megatron main saves the distributed optimizer
with MoE and --bf16 in its fully_reshardable layout (--dist-ckpt-optim-fully-reshardable):
  - get_megatron_optimizer builds a ChainedOptimizer of two DistributedOptimizers: the dense parameters' (router and
    shared expert included) and the expert parameters' (mlp.experts.*, over the expert-data-parallel group);
  - ChainedOptimizer.sharded_state_dict gives {0: dense, 1: experts}; Megatron's checkpointing passes
    chained_optim_avoid_prefix and fully_reshardable is one of DistributedOptimizer's
    checkpoint_fully_reshardable_formats, so no chained_<i>. prefix: each parameter's state keeps the plain
    optimizer.state.{param,exp_avg,exp_avg_sq}.<model key> (sharded as the model tensor: the same chunks), and
    common.pt's 'optimizer' is {0: {'optimizer': {'param_groups': [...]}, 'param_state_sharding_type':
    'fully_reshardable'}, 1: the experts' (param groups with is_expert_parallel True)}, every group's step 7;
  - the model tensors in bf16 (the masters rounded), the router's expert_bias (an fp32 buffer) as saved, the
    _extra_state objects copied.
The json holds the step, which keys each chained optimizer holds, and per optimizer tensor its sum and first values.

Needs only torch (1.13 is enough: torch.distributed.checkpoint is not used; its .metadata pickle and .distcp layout --
one torch.save archive per chunk -- are written directly, with stand-in classes of torch's module paths) and reads the
source fixture the same way. No Megatron needed.
  python3 tools/reference/megatron_moe_chained_optim_reference.py tests/data/megatron/moe
"""
import argparse
import copy
import enum
import io
import json
import os
import pickle
import shutil
import sys
import types

import torch

ITERATION = 7
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1
MAX_LR, MIN_LR, WARMUP, DECAY, GBS = 1e-3, 1e-4, 4, 40, 2


def lr_at(num_steps):
    """Megatron's OptimizerParamScheduler.get_lr, linear style, init_lr 0."""
    if num_steps <= WARMUP:
        return MAX_LR * num_steps / WARMUP
    ratio = (num_steps - WARMUP) / (DECAY - WARMUP)
    return MIN_LR + (MAX_LR - MIN_LR) * (1.0 - ratio)


# --- torch.distributed.checkpoint's classes under their module paths (pickled by name) -------------------------------
META = "torch.distributed.checkpoint.metadata"
FS = "torch.distributed.checkpoint.filesystem"


def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        n = ".".join(parts[:i])
        if n not in sys.modules:
            sys.modules[n] = types.ModuleType(n)
    return sys.modules[name]


def _cls(mod, name, base=object):
    c = type(name, (base,), {"__module__": mod})
    setattr(_module(mod), name, c)
    return c


class _Record:
    def __init__(self, *args, **kw):  # args: enum values of classes this script does not model (WriteItemType)
        self.__dict__.update(kw)

    def __setstate__(self, s):
        self.__dict__.update(s if isinstance(s, dict) else (s[1] or {}))


Metadata = _cls(META, "Metadata", _Record)
TensorStorageMetadata = _cls(META, "TensorStorageMetadata", _Record)
BytesStorageMetadata = _cls(META, "BytesStorageMetadata", _Record)
ChunkStorageMetadata = _cls(META, "ChunkStorageMetadata", _Record)
MetadataIndex = _cls(META, "MetadataIndex", _Record)
StorageInfo = _cls(FS, "_StorageInfo", _Record)


class _MemFormat(enum.Enum):
    TORCH_CONTIGUOUS_FORMAT = 0


_MemFormat.__module__ = META
_MemFormat.__qualname__ = _MemFormat.__name__ = "_MEM_FORMAT_ENCODING"
setattr(_module(META), "_MEM_FORMAT_ENCODING", _MemFormat)


class TensorProperties:
    """torch's TensorProperties pickles its state as (dtype, layout, requires_grad, memory format, pin_memory)."""

    def __init__(self, dtype=None):
        self.dtype = dtype

    def __getstate__(self):
        return (self.dtype, torch.strided, False, _MemFormat.TORCH_CONTIGUOUS_FORMAT, False)

    def __setstate__(self, s):
        self.dtype = s[0]


TensorProperties.__module__ = META
setattr(_module(META), "TensorProperties", TensorProperties)


class _Loose(pickle.Unpickler):
    """Reads a .metadata written by torch 2 / Megatron: unknown classes become plain records."""

    def find_class(self, mod, name):
        if mod.startswith("torch.distributed") or mod.startswith("megatron"):
            if mod == META and name == "TensorProperties":
                return TensorProperties
            if mod == META and name == "_MEM_FORMAT_ENCODING":
                return _MemFormat
            return _cls(mod, name, _Record) if not hasattr(_module(mod), name) else getattr(_module(mod), name)
        return super().find_class(mod, name)


def read_dcp(d):
    """{key: (global tensor or None for bytes, [(offsets, sizes)] chunks, raw bytes of a bytes entry)}."""
    md = _Loose(open(os.path.join(d, ".metadata"), "rb")).load()
    where = {}
    for idx, info in md.storage_data.items():
        where[(idx.fqn, tuple(getattr(idx, "offset", None) or ()))] = info
    out = {}
    for key, m in md.state_dict_metadata.items():
        if isinstance(m, BytesStorageMetadata) or not hasattr(m, "chunks"):
            info = where[(key, ())]
            with open(os.path.join(d, info.relative_path), "rb") as f:
                f.seek(info.offset)
                out[key] = (None, None, f.read(info.length))
            continue
        dtype = m.properties.dtype
        t = torch.zeros(tuple(m.size), dtype=dtype)
        chunks = []
        for ch in m.chunks:
            info = where[(key, tuple(ch.offsets))]
            with open(os.path.join(d, info.relative_path), "rb") as f:
                f.seek(info.offset)
                piece = torch.load(io.BytesIO(f.read(info.length)), map_location="cpu")
            sl = tuple(slice(o, o + s) for o, s in zip(ch.offsets, ch.sizes))
            t[sl] = piece
            chunks.append((tuple(ch.offsets), tuple(ch.sizes)))
        out[key] = (t, chunks, None)
    return out


def write_dcp(d, entries):
    """entries: {key: (tensor, chunks) or (None, None, raw bytes)}; one .distcp file, torch.save per chunk."""
    os.makedirs(d, exist_ok=True)
    sdm, storage = {}, {}
    blob = io.BytesIO()
    for key, e in entries.items():
        t, chunks = e[0], e[1]
        if t is None:
            raw = e[2]
            storage[MetadataIndex(fqn=key, offset=None, index=None)] = StorageInfo(
                relative_path="__0_0.distcp", offset=blob.tell(), length=len(raw))
            blob.write(raw)
            sdm[key] = BytesStorageMetadata()
            continue
        cms = []
        for off, size in chunks:
            sl = tuple(slice(o, o + s) for o, s in zip(off, size))
            buf = io.BytesIO()
            torch.save(t[sl].clone(), buf)
            storage[MetadataIndex(fqn=key, offset=torch.Size(off), index=None)] = StorageInfo(
                relative_path="__0_0.distcp", offset=blob.tell(), length=len(buf.getvalue()))
            blob.write(buf.getvalue())
            cms.append(ChunkStorageMetadata(offsets=torch.Size(off), sizes=torch.Size(size)))
        sdm[key] = TensorStorageMetadata(properties=TensorProperties(t.dtype), size=torch.Size(t.shape), chunks=cms)
    with open(os.path.join(d, "__0_0.distcp"), "wb") as f:
        f.write(blob.getvalue())
    with open(os.path.join(d, ".metadata"), "wb") as f:
        pickle.dump(Metadata(state_dict_metadata=sdm, planner_data=None, storage_data=storage), f)
    with open(os.path.join(d, "metadata.json"), "w") as f:
        json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                   "common_backend_version": 1}, f)


def per_param_dims(key, t):
    """The parameter's own dimensions: stacked layers [L, ...] and stacked global experts [L, E, ...] removed."""
    d = t.dim() - (1 if key.startswith("decoder.layers.") else 0)
    return d - (1 if ".mlp.experts." in key else 0)


def is_expert(key):
    return ".mlp.experts." in key


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="tests/data/megatron/moe")
    a = ap.parse_args()
    src = os.path.join(a.out, "torch_dist", "iter_0000007")
    entries = read_dcp(src)
    common = torch.load(os.path.join(src, "common.pt"), map_location="cpu")
    params = sorted(k[len("optimizer.state.momentum_buffer."):] for k in entries
                    if k.startswith("optimizer.state.momentum_buffer."))
    # 7 AdamW steps, the dense and the expert optimizer each over their own parameters (elementwise: as one).
    p = {k: torch.nn.Parameter(entries[k][0].clone().float()) for k in params}
    groups = {}
    for k in params:
        groups.setdefault((is_expert(k), per_param_dims(k, p[k]) > 1 and not k.endswith(".bias")), []).append(p[k])
    opts = {e: torch.optim.AdamW([{"params": v, "weight_decay": WD if wd else 0.0}
                                  for (ee, wd), v in sorted(groups.items()) if ee == e],
                                 lr=0.0, betas=BETAS, eps=EPS) for e in (False, True)}
    for t in range(1, ITERATION + 1):
        gen = torch.Generator().manual_seed(1000 + t)
        for k in params:
            p[k].grad = 0.01 * torch.randn(p[k].shape, generator=gen)
        for o in opts.values():
            for g in o.param_groups:
                g["lr"] = lr_at(GBS * (t - 1))
            o.step()
    out_dir = os.path.join(a.out, "torch_dist_adam_chained")
    shutil.rmtree(out_dir, ignore_errors=True)
    it = os.path.join(out_dir, "iter_0000007")
    new = {}
    for key, e in entries.items():
        if key.startswith("optimizer."):
            continue
        if e[0] is None:
            new[key] = e
        elif key in p:
            new[key] = (p[key].detach().to(torch.bfloat16), e[1])
        else:
            new[key] = e  # the router's expert_bias: an fp32 buffer, no optimizer state
    ref = {"step": ITERATION, "dense": [], "expert": [], "tensors": {}}
    for k in params:
        st = opts[is_expert(k)].state[p[k]]
        for name, v in (("param", p[k].detach()), ("exp_avg", st["exp_avg"]), ("exp_avg_sq", st["exp_avg_sq"])):
            key = f"optimizer.state.{name}.{k}"
            new[key] = (v.clone().float(), entries[k][1])
            ref["tensors"][key] = {"shape": list(v.shape), "sum": float(v.double().sum()),
                                   "first": [float(x) for x in v.flatten()[:4]]}
        ref["expert" if is_expert(k) else "dense"].append(k)
        assert int(st["step"]) == ITERATION
    write_dcp(it, new)
    with open(os.path.join(out_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    args = copy.deepcopy(common["args"])
    args.optimizer, args.adam_beta1, args.adam_beta2, args.adam_eps, args.weight_decay = "adam", *BETAS, EPS, WD
    args.lr, args.min_lr, args.lr_decay_style, args.lr_warmup_iters, args.lr_decay_iters = MAX_LR, MIN_LR, "linear", 2, 20
    args.global_batch_size, args.micro_batch_size = GBS, 1
    args.bf16, args.params_dtype, args.use_distributed_optimizer = True, torch.bfloat16, True
    args.dist_ckpt_optim_fully_reshardable = True
    args.consumed_train_samples = ITERATION * GBS

    def group(wd, expert):
        return {"wd_mult": 1.0 if wd else 0.0, "lr_mult": 1.0, "is_expert_parallel": expert, "is_decoupled_lr": False,
                "lr": lr_at(GBS * ITERATION), "betas": BETAS, "eps": EPS, "weight_decay": WD if wd else 0.0,
                "amsgrad": False, "foreach": None, "maximize": False, "capturable": False, "differentiable": False,
                "fused": None, "step": ITERATION}
    new_common = {
        "args": args, "checkpoint_version": common["checkpoint_version"], "iteration": ITERATION,
        "num_floating_point_operations_so_far": common.get("num_floating_point_operations_so_far", 0),
        "optimizer": {
            0: {"optimizer": {"param_groups": [group(True, False), group(False, False)]},
                "param_state_sharding_type": "fully_reshardable"},
            1: {"optimizer": {"param_groups": [group(True, True)]}, "param_state_sharding_type": "fully_reshardable"}},
        "opt_param_scheduler": {"max_lr": MAX_LR, "lr_warmup_steps": WARMUP, "num_steps": GBS * ITERATION,
                                "lr_decay_style": "linear", "lr_decay_steps": DECAY, "min_lr": MIN_LR, "start_wd": WD,
                                "end_wd": WD, "wd_incr_style": "constant", "wd_incr_steps": DECAY}}
    torch.save(new_common, os.path.join(it, "common.pt"))
    # Read back: every tensor as written.
    back = read_dcp(it)
    for k, e in new.items():
        if e[0] is not None:
            assert torch.equal(back[k][0], e[0]), k
    with open(os.path.join(a.out, "torch_dist_adam_chained.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    write_buckets(a.out, new, new_common, p, opts)


# --- the dp_reshardable layout at EP 2 (torch_dist_adam_chained_buckets) ---------------------------------------------
EP, DP, BUCKET = 2, 2, 300  # world 2: dense DP 2 (one model-parallel rank), EP 2 x expert DP 1
DTYPE = "(torch.bfloat16, torch.float32)"


def registration_order(params, num_layers, experts, ep_rank):
    """model.parameters() of Megatron's local-spec GPTModel with MoE layers, as (key, layer, expert) with the dense
    buffer's parameters (experts None) or expert-parallel rank ep_rank's local experts (SequentialMLP local_experts):
    embedding; per layer input_layernorm, linear_proj, linear_qkv, pre_mlp_layernorm, MoELayer's router, experts and
    shared experts (MLP: linear_fc1, linear_fc2); the final norm; the output layer."""
    layer_order = ["self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
                   "self_attention.linear_proj.weight", "self_attention.linear_qkv.weight",
                   "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias", "mlp.router.weight",
                   "EXPERTS", "mlp.shared_experts.linear_fc1.weight", "mlp.shared_experts.linear_fc2.weight"]
    out = []
    if experts is None:
        out.append(("embedding.word_embeddings.weight", None, None))
    for layer in range(num_layers):
        for sub in layer_order:
            key = "decoder.layers." + sub
            if sub == "EXPERTS":
                if experts is not None:
                    for j in range(experts // EP):
                        for lin in ("linear_fc1", "linear_fc2"):
                            out.append((f"decoder.layers.mlp.experts.experts.{lin}.weight", layer,
                                        ep_rank * (experts // EP) + j))
                continue
            if experts is None:
                assert key in params, key
                out.append((key, layer, None))
    if experts is None:
        out += [("decoder.final_layernorm.weight", None, None), ("decoder.final_layernorm.bias", None, None),
                ("output_layer.weight", None, None)]
    return out


def piece(t, layer, expert):
    return t if layer is None else t[layer] if expert is None else t[layer, expert]


def buckets_of(order, p):
    """_ParamAndGradBuffer with the distributed optimizer: parameters in reverse order, each starting at a multiple
    of 64; a bucket closes after the parameter that brings it to BUCKET elements, the next starting at a multiple of
    lcm(DP, 128). Returns per bucket [(entry, offset in bucket)], numel_unpadded."""
    buckets, cur, start, at = [], [], 0, 0
    for entry in reversed(order):
        n = piece(p[entry[0]], entry[1], entry[2]).numel()
        at = (at + 63) // 64 * 64
        cur.append((entry, at - start))
        at += n
        if at - start >= BUCKET:
            buckets.append((cur, at - start))
            cur, start = [], (at + 127) // 128 * 128
            at = start
    if cur:
        buckets.append((cur, at - start))
    return buckets


def obj(value):
    buf = io.BytesIO()
    torch.save(value, buf)
    return (None, None, buf.getvalue())


def write_buckets(out, model_space, common, p, opts):
    for layout in ("dp_reshardable", "dp_zero_gather_scatter"):
        write_bucket_layout(out, model_space, common, p, opts, layout)


def write_bucket_layout(out, model_space, common, p, opts, layout):
    """Megatron main's chained [dense, experts] DistributedOptimizer state in the dp_reshardable layout, saved at
    EP 2 x TP 1 x PP 1 with DP 2, --overlap-grad-reduce --ddp-bucket-size 300: each optimizer's sharded state dict
    prefixed chained_<i>. (dp_reshardable is not a fully reshardable format); the dense buffer under
    dp_group_idx_0 (its model-parallel rank), each EP rank's expert buffer under dp_group_idx_<EP rank> (its rank in
    the tp-ep-pp expert group); one tensor per bucket and state of its numel_unpadded elements (zeros in the
    padding), the param groups, per_bucket_numel and per_bucket_numel_unpadded as objects. dp_zero_gather_scatter
    (torch_dist_adam_chained_dp_zero): instead of the bucket tensors and sizes, one object per buffer,
    <prefix>optimizer.distributed.dp_group_idx_<G>.param_state = {'buckets_coalesced': True, 0: {(param dtype, grad
    dtype): {'param', 'exp_avg', 'exp_avg_sq': every bucket's unpadded elements one after another,
    'numel_unpadded'}}}, as get_parameter_state_dp_zero gathers it."""
    out_dir = os.path.join(out, "torch_dist_adam_chained_buckets" if layout == "dp_reshardable"
                           else "torch_dist_adam_chained_dp_zero")
    shutil.rmtree(out_dir, ignore_errors=True)
    it = os.path.join(out_dir, "iter_0000007")
    entries = {k: v for k, v in model_space.items() if not k.startswith("optimizer.")}
    num_layers = common["args"].num_layers
    experts = common["args"].num_experts
    states = {"param": lambda k: p[k].detach()}
    for name in ("exp_avg", "exp_avg_sq"):
        states[name] = (lambda nm: lambda k: opts[is_expert(k)].state[p[k]][nm])(name)
    ranks = [("chained_0.", 0, registration_order(p, num_layers, None, 0))]
    ranks += [("chained_1.", e, registration_order(p, num_layers, experts, e)) for e in range(EP)]
    sizes = {}
    for prefix, group, order in ranks:
        head = f"{prefix}optimizer.distributed.dp_group_idx_{group}."
        buckets = buckets_of(order, p)
        unpadded = [n for _, n in buckets]
        sizes[f"{prefix}{group}"] = unpadded
        lcm = 128 * DP // __import__("math").gcd(128, DP)
        padded = [(n + lcm - 1) // lcm * lcm for n in unpadded]
        gathered = {name: [] for name in states}
        for b, (members, n) in enumerate(buckets):
            for name, get in states.items():
                t = torch.zeros(n, dtype=torch.float32)
                for (key, layer, expert), off in members:
                    x = piece(get(key), layer, expert).reshape(-1).float()
                    t[off:off + x.numel()] = x
                gathered[name].append(t)
                if layout == "dp_reshardable":
                    entries[f"{head}gbuf_idx_0.dtype_{DTYPE}.bucket_idx_{b}.{name}"] = (t, [((0,), (n,))])
        sub = common["optimizer"][0 if prefix == "chained_0." else 1]
        entries[f"{head}optimizer/shard_0_1"] = obj([sub["optimizer"]])
        if layout == "dp_reshardable":
            entries[f"{head}per_bucket_numel/shard_0_1"] = obj([[{(torch.bfloat16, torch.float32): padded}]])
            entries[f"{head}per_bucket_numel_unpadded/shard_0_1"] = obj([[{(torch.bfloat16, torch.float32): unpadded}]])
        else:
            state = {name: torch.cat(v) for name, v in gathered.items()}
            state["numel_unpadded"] = sum(unpadded)
            entries[f"{head}param_state/shard_0_1"] = obj([{"buckets_coalesced": True,
                                                           0: {(torch.bfloat16, torch.float32): state}}])
    write_dcp(it, entries)
    with open(os.path.join(out_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    c = dict(common)
    args = copy.deepcopy(common["args"])
    args.dist_ckpt_optim_fully_reshardable = False
    args.expert_model_parallel_size, args.data_parallel_size = EP, DP
    args.overlap_grad_reduce, args.ddp_bucket_size = True, BUCKET
    args.world_size = EP
    c["args"] = args
    c["optimizer"] = {0: {"param_state_sharding_type": layout}, 1: {"param_state_sharding_type": layout}}
    torch.save(c, os.path.join(it, "common.pt"))
    print("bucket sizes (numel_unpadded):", sizes)


if __name__ == "__main__":
    main()
