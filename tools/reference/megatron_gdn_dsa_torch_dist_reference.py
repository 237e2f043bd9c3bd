"""Megatron `torch_dist` checkpoints of the tiny Gated DeltaNet (-2) and DeepSeek sparse attention fixtures.

Writes, next to the torch-format fixtures of megatron_gdn_reference.py and megatron_dsa_reference.py (their tp1
rank files are the weights):
  gdn/torch_dist_tp1, gdn/torch_dist_tp2, gdn2/torch_dist_tp1, gdn2/torch_dist_tp2,
  dsa/torch_dist_tp1, dsa/torch_dist_tp2   iter_0000007/{.metadata, __R_0.distcp, common.pt, metadata.json}
                                           + latest_checkpointed_iteration.txt
  gdn/torch_dcp_tp1                        --ckpt-format torch_dcp: DCP of {'model': state dict, args, ...}
Megatron's GatedDeltaNet needs CUDA and flash-linear-attention, so Megatron cannot build the model here; the
sharded state dict is restated from Megatron main's rules and written by torch's own DCP writer in gloo
processes (one per TP rank), each rank giving DCP its local shards as torch ShardedTensors at their global
offsets, as Megatron's torch_dist strategy does (only replica 0 of a replicated tensor is written):
  * keys: GDN models set linear_attention_freq (a list), which makes TransformerBlock.sharded_state_dict
    non-homogeneous: one key per global layer (decoder.layers.<i>.); the DSA model's layers are alike: its
    layer tensors are stacked along a leading num_layers dimension under decoder.layers.<rest>.
  * GatedDeltaNet.sharded_state_dict (megatron/core/ssm/gated_delta_net/common.py): in_proj.weight goes through
    _split_tensor_factory into in_proj.weight.<name> for in_proj_split_names (GDN: query, key, value, z, beta,
    alpha; GDN2: query, key, value, z, f, b, w), each the global section, TP rank r holding its r-th 1/TP rows;
    conv1d.weight into conv1d.weight.{query,key,value} the same way; dt_bias and A_log TP-split along dim 0;
    out_proj row-parallel (columns); out_norm and the fused layer norms replicated.
  * dense parts: linear_qkv rows, SwiGLU linear_fc1 as [all gate rows; all up rows] (rank r: gate_r at r*F/TP,
    up_r at F + r*F/TP), linear_proj / linear_fc2 columns, embedding / output_layer vocabulary rows.
  * DSA (get_dsa_module_spec_for_backend): linear_q_down_proj, linear_kv_down_proj and the indexer's
    linear_wq_b / linear_wk / linear_weights_proj are parallel_mode="duplicated" linears and k_norm, q_layernorm,
    kv_layernorm norms: replicated keys (one copy); linear_q_up_proj / linear_kv_up_proj rows, linear_proj columns.
  * each linear's `_extra_state` a ShardedObject: bytes under <key>/shard_<offset>_<count>.
common.pt holds args (ckpt_format torch_dist), checkpoint_version 3.0, iteration and
num_floating_point_operations_so_far. Check: every checkpoint read back with torch's FileSystemReader /
dcp.load into full tensors gives the tp1 rank file's tensors bit for bit (printed).
Run (torch >= 2.4 with torch.distributed.checkpoint; 2.6 used):
  /tmp/venv_gptoss/bin/python tools/reference/megatron_gdn_dsa_torch_dist_reference.py tests/data/megatron
"""
import io
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
from torch.distributed._shard.sharded_tensor import Shard, ShardMetadata, init_from_local_shards

ITERATION = 7
GDN_SECTIONS = {"gdn": ["query", "key", "value", "z", "beta", "alpha"],
                "gdn2": ["query", "key", "value", "z", "f", "b", "w"]}


def tp1_file(root, variant):
    path = os.path.join(root, variant, "tp1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt")
    return torch.load(path, map_location="cpu", weights_only=False)


def gdn_in_proj_sections(a, variant):
    qk, vd = a.linear_num_key_heads * a.linear_key_head_dim, a.linear_num_value_heads * a.linear_value_head_dim
    if variant == "gdn2":
        return [qk, qk, vd, vd, qk, qk, vd]
    return [qk, qk, vd, vd, a.linear_num_value_heads, a.linear_num_value_heads]


def rows(t, tp, r, base=0):
    """Rank r's 1/TP rows of t (global rows offset by `base`): (offset tuple, piece)."""
    n = t.shape[0] // tp
    return (base + r * n,) + (0,) * (t.dim() - 1), t[r * n:(r + 1) * n]


def cols(t, tp, r):
    n = t.shape[1] // tp
    return (0, r * n) + (0,) * (t.dim() - 2), t[:, r * n:(r + 1) * n]


def layer_entries(name, t, variant, a, tp, r, dsa):
    """[(sharded key, global shape, [(offset, local piece)])] of tp1 tensor `name` on TP rank r."""
    whole = (0,) * t.dim()
    if variant in GDN_SECTIONS and name.endswith(("in_proj.weight", "conv1d.weight")):
        names = GDN_SECTIONS[variant] if name.endswith("in_proj.weight") else ["query", "key", "value"]
        sizes = gdn_in_proj_sections(a, variant)[:len(names)]
        out, start = [], 0
        for sec, n in zip(names, sizes):
            s = t[start:start + n]
            start += n
            out.append((name + "." + sec, list(s.shape), [rows(s, tp, r)]))
        return out
    if name.endswith(("dt_bias", "A_log", "linear_qkv.weight", "word_embeddings.weight", "output_layer.weight",
                      "linear_q_up_proj.weight", "linear_kv_up_proj.weight")):
        return [(name, list(t.shape), [rows(t, tp, r)])]
    if name.endswith("linear_fc1.weight"):  # SwiGLU: [gate; up], each split over TP
        f = t.shape[0] // 2
        return [(name, list(t.shape), [rows(t[:f], tp, r), rows(t[f:], tp, r, base=f)])]
    if name.endswith(("out_proj.weight", "linear_proj.weight", "linear_fc2.weight")):
        return [(name, list(t.shape), [cols(t, tp, r)])]
    # norms, out_norm, DSA's duplicated down projections and indexer: replicated, replica 0 written
    return [(name, list(t.shape), [(whole, t)] if r == 0 else [])]


def sharded_entries(sd, variant, a, tp, r, stacked):
    """The rank's {key: (global shape, [(offset, piece)])}, stacked layers along num_layers when `stacked`."""
    out, extra = {}, set()
    L = a.num_layers
    for name, t in sd.items():
        if name.endswith("_extra_state"):
            extra.add(name)
            continue
        for key, shape, pieces in layer_entries(name, t, variant, a, tp, r, variant == "dsa"):
            parts = key.split(".")
            if stacked and key.startswith("decoder.layers."):
                i = int(parts[2])
                skey = ".".join(parts[:2] + parts[3:])
                shape = [L] + shape
                pieces = [((i,) + off, p.unsqueeze(0)) for off, p in pieces]
                prev = out.setdefault(skey, (shape, []))
                prev[1].extend(pieces)
            else:
                out[key] = (shape, pieces)
    objects = {}
    for name in sorted(extra):  # ShardedObjects: replica 0 (TP rank 0) writes them
        if r != 0:
            continue
        parts = name.split(".")
        if stacked and name.startswith("decoder.layers."):
            key = "%s/shard_%s_%d" % (".".join(parts[:2] + parts[3:]), parts[2], L)
        else:
            key = name + "/shard_0_1"
        buf = io.BytesIO()
        torch.save(None, buf)
        buf.seek(0)
        objects[key] = buf
    return out, objects


def to_sharded(entries, rank):
    sd = {}
    for key in sorted(entries):
        shape, pieces = entries[key]
        shards = [Shard(tensor=p.contiguous().clone(), metadata=ShardMetadata(
            shard_offsets=list(off), shard_sizes=list(p.shape), placement="rank:%d/cpu" % rank)) for off, p in pieces]
        sd[key] = init_from_local_shards(shards, *shape)
    return sd


def worker(rank, world, root, variant, out, port, fmt):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    f = tp1_file(root, variant)
    args = f["args"]
    args.tensor_model_parallel_size = world
    args.ckpt_format = fmt
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    if fmt == "torch_dcp":  # generate_state_dict's plain dict at TP 1
        sd = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
              "num_floating_point_operations_so_far": 0.0,
              "model": {k: (v if v is not None else io.BytesIO()) for k, v in f["model"].items()}}
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(ckpt))
    else:
        entries, objects = sharded_entries(f["model"], variant, args, world, rank, stacked=variant == "dsa")
        sd = to_sharded(entries, rank)
        sd.update(objects)
        dcp.save(sd, storage_writer=dcp.FileSystemWriter(ckpt))
        if rank == 0:
            torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
                        "num_floating_point_operations_so_far": 0.0}, os.path.join(ckpt, "common.pt"))
            with open(os.path.join(ckpt, "metadata.json"), "w") as fh:
                json.dump({"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch",
                           "common_backend_version": 1}, fh)
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as fh:
            fh.write(str(ITERATION))
    dist.destroy_process_group()


def check(root, variant, out, fmt):
    """The checkpoint read back by torch's reader into full tensors: the tp1 tensors bit for bit."""
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    md = dcp.FileSystemReader(ckpt).read_metadata()
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    full = {k: torch.empty(list(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)}
    dcp.load(full, storage_reader=dcp.FileSystemReader(ckpt))
    f = tp1_file(root, variant)
    want = {k: v for k, v in f["model"].items() if v is not None}
    if fmt == "torch_dcp":
        got = {k[len("model."):]: v for k, v in full.items()}
    else:
        got = {}
        a = f["args"]
        for k, v in full.items():
            parts = k.split(".")
            if variant == "dsa" and k.startswith("decoder.layers."):
                for i in range(a.num_layers):
                    got[".".join(parts[:2] + [str(i)] + parts[2:])] = v[i]
            else:
                got[k] = v
        for name in list(want):  # sections back into in_proj / conv1d
            if variant in GDN_SECTIONS and name.endswith(("in_proj.weight", "conv1d.weight")):
                names = GDN_SECTIONS[variant] if name.endswith("in_proj.weight") else ["query", "key", "value"]
                got[name] = torch.cat([got.pop(name + "." + s) for s in names])
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    for k in want:
        assert torch.equal(got[k], want[k]), k
    return len(want)


def main():
    root = sys.argv[1]
    layouts = [("gdn", "torch_dist", 1), ("gdn", "torch_dist", 2), ("gdn2", "torch_dist", 1),
               ("gdn2", "torch_dist", 2), ("dsa", "torch_dist", 1), ("dsa", "torch_dist", 2), ("gdn", "torch_dcp", 1)]
    for k, (variant, fmt, tp) in enumerate(layouts):
        out = os.path.join(root, variant, "%s_tp%d" % (fmt, tp))
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        port = 29900 + os.getpid() % 300 + 7 * k
        mp.spawn(worker, args=(tp, root, variant, out, port, fmt), nprocs=tp, join=True)
        n = check(root, variant, out, fmt)
        print("%s: read back by torch's FileSystemReader: the tp1 rank file's %d tensors bit for bit" % (out, n))


if __name__ == "__main__":
    main()
