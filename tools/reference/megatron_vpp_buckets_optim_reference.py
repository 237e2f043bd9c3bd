#!/usr/bin/env python3
"""The distributed optimizer's dp_reshardable state of a run with virtual pipeline chunks (torch_dist_adam_buckets_vpp).

Writes tests/data/megatron/torch_dist_adam_buckets_vpp/ (and the same state in the dp_zero_gather_scatter layout,
torch_dist_adam_dp_zero_vpp/: each rank's object .param_state {'buckets_coalesced': True, <chunk>: {(param dtype, grad
dtype): {'param', 'exp_avg', 'exp_avg_sq': the chunk's buckets one after another, 'numel_unpadded'}}}): a 4-layer model whose layers 0 and 1 hold
tests/data/megatron/torch_dist_adam's AdamW state after 7 steps (Megatron core_v0.12.1's own save) and layers 2 and 3
layers 0 and 1's with the masters and first moment negated, saved as Megatron's DistributedOptimizer saves it at PP 2 x
TP 1 x DP 1 with --num-layers-per-virtual-pipeline-stage 1 (two model chunks per pipeline rank), --bf16,
--overlap-grad-reduce --ddp-bucket-size 1000, transformer_impl 'local':
  - pipeline rank p's chunk v is virtual stage v * PP + p: layer v * 2 + p; the embedding in rank 0's chunk 0, the
    final norm and the output layer in rank 1's chunk 1;
  - each chunk is its own DDP module with its own buffer; the distributed optimizer numbers the buffers of all chunks
    in order (gbuf_idx_<v>); training.get_model disables bucketing for the chunks after the first (one bucket), the
    first chunk's buffer closes a bucket at 1000 elements;
  - each buffer as in megatron_moe_chained_optim_reference.py (reverse registration order, 64-aligned starts, the next
    bucket at a multiple of lcm(DP, 128)), one tensor per bucket and state under
    optimizer.distributed.dp_group_idx_<p>.gbuf_idx_<v>.dtype_(torch.bfloat16, torch.float32).bucket_idx_<b>.<state>;
    the objects .optimizer (param groups with step 7), .per_bucket_numel and .per_bucket_numel_unpadded (a list with
    one {dtype: [sizes]} per chunk);
  - the model tensors in bf16 (the masters rounded).
Not Megatron's writer (its DistributedOptimizer needs CUDA and torch 2): the layout is this script's rendering of
Megatron's rules; the bucket sizes and Gale's element-by-element master check tie it to the weights.
  python3 tools/reference/megatron_vpp_buckets_optim_reference.py tests/data/megatron
"""
import argparse
import copy
import io
import math
import os
import shutil
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_moe_chained_optim_reference as dcp  # noqa: E402  (read_dcp, write_dcp)

PP, CHUNKS, BUCKET, DP = 2, 2, 1000, 1
DTYPE = "(torch.bfloat16, torch.float32)"
LAYER = ["self_attention.linear_qkv.layer_norm_weight", "self_attention.linear_qkv.layer_norm_bias",
         "self_attention.linear_proj.weight", "self_attention.linear_qkv.weight",
         "mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.layer_norm_bias", "mlp.linear_fc1.weight",
         "mlp.linear_fc2.weight"]


def chunk_order(p, v):
    """model.parameters() of pipeline rank p's chunk v (local spec): (key, layer)."""
    out = [("embedding.word_embeddings.weight", None)] if p == 0 and v == 0 else []
    out += [("decoder.layers." + sub, v * PP + p) for sub in LAYER]
    if p == PP - 1 and v == CHUNKS - 1:
        out += [("decoder.final_layernorm.weight", None), ("decoder.final_layernorm.bias", None),
                ("output_layer.weight", None)]
    return out


def buckets_of(order, state, bucket_size):
    buckets, cur, start, at = [], [], 0, 0
    lcm = 128 * DP // math.gcd(128, DP)
    for key, layer in reversed(order):
        n = (state[key] if layer is None else state[key][layer]).numel()
        at = (at + 63) // 64 * 64
        cur.append(((key, layer), at - start))
        at += n
        if bucket_size and at - start >= bucket_size:
            buckets.append((cur, at - start))
            cur, start = [], (at + lcm - 1) // lcm * lcm
            at = start
    if cur:
        buckets.append((cur, at - start))
    return buckets


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", help="tests/data/megatron")
    a = ap.parse_args()
    for layout in ("dp_reshardable", "dp_zero_gather_scatter"):
        write(a, layout)


def write(a, layout):
    src = os.path.join(a.out, "torch_dist_adam", "iter_0000007")
    e = dcp.read_dcp(src)
    common = torch.load(os.path.join(src, "common.pt"), map_location="cpu")
    params = [k[len("optimizer.state.exp_avg."):] for k in e if k.startswith("optimizer.state.exp_avg.")]
    states = {"param": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for k in params:
        for name in states:
            t = (e[k][0] if name == "param" else e[f"optimizer.state.{name}.{k}"][0]).float()
            if k.startswith("decoder.layers."):  # layers 2, 3: layers 0, 1 with the masters and first moment negated
                t = torch.cat([t, t if name == "exp_avg_sq" else -t])
            states[name][k] = t
    out_dir = os.path.join(a.out, "torch_dist_adam_buckets_vpp" if layout == "dp_reshardable"
                           else "torch_dist_adam_dp_zero_vpp")
    shutil.rmtree(out_dir, ignore_errors=True)
    it = os.path.join(out_dir, "iter_0000007")
    entries = {}
    for k, t in states["param"].items():
        chunks = [((i,) + (0,) * (t.dim() - 1), (1,) + tuple(t.shape[1:])) for i in range(t.shape[0])] \
            if k.startswith("decoder.layers.") else [((0,) * t.dim(), tuple(t.shape))]
        entries[k] = (t.to(torch.bfloat16), chunks)
    sizes = {}
    for p in range(PP):
        head = f"optimizer.distributed.dp_group_idx_{p}."
        unpadded_all, padded_all, gathered = [], [], {"buckets_coalesced": True}
        for v in range(CHUNKS):
            buckets = buckets_of(chunk_order(p, v), states["param"], BUCKET if v == 0 else None)
            unpadded = [n for _, n in buckets]
            unpadded_all.append({(torch.bfloat16, torch.float32): unpadded})
            padded_all.append({(torch.bfloat16, torch.float32): [(n + 127) // 128 * 128 for n in unpadded]})
            sizes[(p, v)] = unpadded
            chunk = {name: [] for name in states}
            for b, (members, n) in enumerate(buckets):
                for name, by_key in states.items():
                    t = torch.zeros(n, dtype=torch.float32)
                    for (key, layer), off in members:
                        x = (by_key[key] if layer is None else by_key[key][layer]).reshape(-1)
                        t[off:off + x.numel()] = x
                    chunk[name].append(t)
                    if layout == "dp_reshardable":
                        entries[f"{head}gbuf_idx_{v}.dtype_{DTYPE}.bucket_idx_{b}.{name}"] = (t, [((0,), (n,))])
            gathered[v] = {(torch.bfloat16, torch.float32): dict(
                {name: torch.cat(ts) for name, ts in chunk.items()}, numel_unpadded=sum(unpadded))}
        groups = [dict(g, step=7) for g in common["optimizer"]["param_groups"]]
        entries[f"{head}optimizer/shard_0_1"] = dcp.obj([{"param_groups": groups}])
        if layout == "dp_reshardable":
            entries[f"{head}per_bucket_numel/shard_0_1"] = dcp.obj([padded_all])
            entries[f"{head}per_bucket_numel_unpadded/shard_0_1"] = dcp.obj([unpadded_all])
        else:  # get_parameter_state_dp_zero: every chunk's buffer gathered, by gbuf_idx
            entries[f"{head}param_state/shard_0_1"] = dcp.obj([gathered])
    dcp.write_dcp(it, entries)
    with open(os.path.join(out_dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("7")
    args = copy.deepcopy(common["args"])
    args.num_layers, args.pipeline_model_parallel_size = 4, PP
    args.virtual_pipeline_model_parallel_size, args.num_layers_per_virtual_pipeline_stage = CHUNKS, 1
    args.bf16, args.params_dtype, args.use_distributed_optimizer = True, torch.bfloat16, True
    args.overlap_grad_reduce, args.ddp_bucket_size, args.data_parallel_size = True, BUCKET, DP
    args.world_size = PP
    c = dict(common)
    c["args"] = args
    c["optimizer"] = {"param_state_sharding_type": layout}
    torch.save(c, os.path.join(it, "common.pt"))
    print(layout, "bucket sizes (numel_unpadded) by (pipeline rank, chunk):", sizes)


if __name__ == "__main__":
    main()
