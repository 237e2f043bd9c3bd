"""Tiny Megatron-LM GPT checkpoints in Megatron's `torch_dist` (and `torch_dcp`) formats, saved by Megatron itself.

Writes, next to the legacy-format fixtures of megatron_ckpt_reference.py (same weights: tests/data/megatron/tp1):
  torch_dist_tp1/      iter_0000007/{metadata.json, .metadata, __0_0.distcp, common.pt}, latest_checkpointed_iteration.txt
                       Megatron core_v0.12.1's GPTModel.sharded_state_dict() saved by dist_checkpointing.save with
                       the default torch_dist strategy in a one-process gloo group (what save_checkpoint does
                       with --ckpt-format torch_dist: args, checkpoint_version 3.0, iteration, 'model')
  torch_dist_tp2pp2/   the same weights saved by 4 gloo processes at TP 2 x PP 2 (each rank's model built at
                       that layout and given its shard of the tp1 weights with load_state_dict(strict=True))
  torch_dcp_tp1/       --ckpt-format torch_dcp: torch.distributed.checkpoint.save of generate_state_dict's dict
                       (the plain state_dict_for_save_checkpoint() under 'model')
  torch_dist_bf16_layers/  the tp1 weights in bf16 (model.bfloat16(), as --bf16 saves them), saved with Megatron's
                       non-homogeneous layout: one key per global layer (decoder.layers.3.mlp...) instead of stacked
  torch_dist.json      per directory: every .metadata key with its kind, global shape and dtype, as torch's
                       FileSystemReader reads them (the test compares Gale's listing with it)
Checks: torch_dist_tp1 loaded back with dist_checkpointing.load into a fresh model gives the tp1 tensors
bit for bit, and that model's logits match reference.json's within 1e-5 (reference.json
came from torch 1.13: 3.1e-6 measured under torch 2.5.1).
CPU shims: torch.cuda.synchronize (called by Megatron's writer) is a no-op without CUDA, and
FP32Optimizer's CUDA loss scale is made on the CPU (its base __init__ is called directly).
Run (PyPI torch 2.5.1 with packaging, psutil on CPU; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  MEGATRON_LM=/tmp/meg python3 tools/reference/megatron_torch_dist_reference.py tests/data/megatron
"""
import argparse
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_ckpt_reference as ref  # noqa: E402  (shims, sizes, megatron_args, shard)

ITERATION = ref.ITERATION
if not torch.cuda.is_available():  # Megatron's torch_dist writer synchronizes CUDA before copying to CPU
    torch.cuda.synchronize = lambda *a, **k: None


def tp1_state_dict(fixtures):
    path = os.path.join(fixtures, "tp1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt")
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def build(tp, pp, rank, world, port, tied=False, first_stage_layers=None):
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import contextlib

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tp, pp)
    tensor_parallel.model_parallel_cuda_manual_seed(1234) if torch.cuda.is_available() else None
    config = TransformerConfig(
        num_layers=ref.NUM_LAYERS, hidden_size=ref.HIDDEN, ffn_hidden_size=ref.FFN, num_attention_heads=ref.HEADS,
        num_query_groups=ref.GROUPS, normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        **({} if first_stage_layers is None else {"num_layers_in_first_pipeline_stage": first_stage_layers}))
    model = GPTModel(config, get_gpt_layer_local_spec(normalization="LayerNorm"), vocab_size=ref.PADDED,
                     max_sequence_length=16, position_embedding_type="rope",
                     share_embeddings_and_output_weights=tied,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
    model.eval()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return model


def state(model, tp, pp, fmt, per_layer=False):
    args = ref.megatron_args(tp, pp)
    args.ckpt_format = fmt
    if per_layer:  # bf16 weights, one key per layer
        args.bf16, args.params_dtype = True, torch.bfloat16
    if fmt != "torch_dist":
        sd = model.state_dict_for_save_checkpoint()
    else:
        sd = model.sharded_state_dict(metadata={"non_homogeneous_layers": True} if per_layer else None)
    return {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd,
            "num_floating_point_operations_so_far": 0.0}


def worker(rank, world, tp, pp, fixtures, out, port, fmt):
    from megatron.core import dist_checkpointing, parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy

    model = build(tp, pp, rank, world, port)
    t = parallel_state.get_tensor_model_parallel_rank()
    p = parallel_state.get_pipeline_model_parallel_rank()
    mine = ref.shard(tp1_state_dict(fixtures), tp, pp, t, p)
    model.load_state_dict(mine, strict=True)
    ckpt = os.path.join(out, "iter_%07d" % ITERATION)
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    per_layer = fmt == "torch_dist_bf16"
    if per_layer:
        fmt = "torch_dist"
        model.bfloat16()
    if fmt == "torch_dist":
        st = state(model, tp, pp, fmt, per_layer)
        if world == 1 and not per_layer:  # with optimizer state, as a training run saves it (Gale skips it)
            st["optimizer"] = sgd_with_momentum(model, mine).sharded_state_dict(st["model"])
        dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    else:  # what save_checkpoint does for --ckpt-format torch_dcp
        torch.distributed.checkpoint.save(state_dict=state(model, tp, pp, fmt),
                                          storage_writer=torch.distributed.checkpoint.FileSystemWriter(ckpt))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
    if fmt == "torch_dist" and world == 1 and not per_layer:  # load it back, compare tensors and logits
        fresh = build_fresh(tp, pp)
        loaded = dist_checkpointing.load({"model": fresh.sharded_state_dict()}, ckpt)["model"]
        fresh.load_state_dict(loaded, strict=True)
        want = tp1_state_dict(fixtures)
        for k, v in fresh.state_dict().items():
            if torch.is_tensor(v):
                assert torch.equal(v, want[k]), k
        r = json.load(open(os.path.join(fixtures, "reference.json")))
        mask = torch.triu(torch.ones(1, 1, ref.SEQ, ref.SEQ, dtype=torch.bool), diagonal=1)
        with torch.no_grad():
            logits = fresh(torch.tensor([r["tokens"]]), torch.arange(ref.SEQ).unsqueeze(0), mask)
        diff = (logits[0] - torch.tensor(r["logits"])).abs().max().item()
        # reference.json came from torch 1.13; torch 2.5's kernels sum in another order (3.1e-6 measured)
        assert diff < 1e-5, diff
        print("dist_checkpointing.load of", ckpt, "gives the tp1 tensors; logits match reference.json within", diff)
    dist.destroy_process_group()


def sgd_with_momentum(model, weights):
    """Megatron's FP32Optimizer over torch SGD after one step (momentum buffers set), the weights restored."""
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.optimizer.optimizer import FP32Optimizer, MegatronOptimizer
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.01)
    sgd.step()
    model.load_state_dict(weights, strict=True)
    # FP32Optimizer.__init__ puts its loss scale on CUDA; on CPU its base __init__ and a CPU scale.
    opt = FP32Optimizer.__new__(FP32Optimizer)
    MegatronOptimizer.__init__(opt, sgd, OptimizerConfig(optimizer="sgd", lr=0.1), lambda o, config=None: None)
    opt._scale = torch.tensor([1.0])
    opt.is_stub_optimizer = False
    return opt


def build_fresh(tp, pp):
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    config = TransformerConfig(
        num_layers=ref.NUM_LAYERS, hidden_size=ref.HIDDEN, ffn_hidden_size=ref.FFN, num_attention_heads=ref.HEADS,
        num_query_groups=ref.GROUPS, normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False)
    m = GPTModel(config, get_gpt_layer_local_spec(normalization="LayerNorm"), vocab_size=ref.PADDED,
                 max_sequence_length=16, position_embedding_type="rope", share_embeddings_and_output_weights=False)
    m.eval()
    return m


def listing(ckpt):
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(ckpt).read_metadata()
    out = {}
    for k, v in sorted(md.state_dict_metadata.items()):
        if isinstance(v, TensorStorageMetadata):
            out[k] = {"kind": "tensor", "shape": list(v.size), "dtype": str(v.properties.dtype),
                      "chunks": len(v.chunks)}
        else:
            out[k] = {"kind": "bytes"}
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    a = ap.parse_args()
    layouts = [("torch_dist_tp1", "torch_dist", 1, 1), ("torch_dist_tp2pp2", "torch_dist", 2, 2),
               ("torch_dcp_tp1", "torch_dcp", 1, 1), ("torch_dist_bf16_layers", "torch_dist_bf16", 1, 1)]
    result = {}
    for k, (name, fmt, tp, pp) in enumerate(layouts):
        out = os.path.join(a.out, name)
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        port = 29600 + os.getpid() % 300 + 7 * k
        mp.spawn(worker, args=(tp * pp, tp, pp, a.out, out, port, fmt), nprocs=tp * pp, join=True)
        ckpt = os.path.join(out, "iter_%07d" % ITERATION)
        result[name] = {"files": sorted(os.listdir(ckpt)), "keys": listing(ckpt)}
        print(name, result[name]["files"], len(result[name]["keys"]), "keys")
    with open(os.path.join(a.out, "torch_dist.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
