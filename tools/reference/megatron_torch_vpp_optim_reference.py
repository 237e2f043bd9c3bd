"""A tiny Megatron-LM legacy `torch`-format checkpoint with virtual pipeline chunks that holds Adam's optimizer state.

Writes tests/data/megatron/torch_adam_bf16_vpp/: a 4-layer model (torch_adam's sizes: hidden 16, ffn 24, vocabulary 50
padded to 64) whose layers 0 and 1 hold torch_adam's AdamW state after 7 steps (megatron_torch_dist_optim_reference's
train_adamw, the same run as the torch_adam fixture: checked bit for bit) and layers 2 and 3 layers 0 and 1's with the
masters and the first moment negated, saved as Megatron's legacy format saves a run at PP 2 x TP 1 with
--num-layers-per-virtual-pipeline-stage 1 and --bf16 (two gloo processes):
  - each pipeline rank builds Megatron core_v0.12.1's own GPTModel for each of its two chunks
    (parallel_state.initialize_model_parallel with virtual_pipeline_model_parallel_size 2, the virtual rank set before
    each chunk is built, as training.get_model does): rank p's chunk v is virtual stage v * PP + p, global layer
    v * 2 + p; the embedding in rank 0's chunk 0, the final norm and output layer in rank 1's chunk 1;
  - the rank's optimizer is Megatron core_v0.12.1's own Float16OptimizerWithFloat16Params over torch AdamW whose param
    groups are core_v0.12.1's _get_param_groups over both chunks (each chunk's named_parameters in turn), its
    state_dict() the rank file's 'optimizer'; the chunks' state_dict_for_save_checkpoint() are 'model0' and 'model1';
  - mp_rank_00_00P/model_optim_rng.pt per pipeline rank, args with virtual_pipeline_model_parallel_size 2.
And tests/data/megatron/torch_adam_distopt_vpp/: the same state as the distributed optimizer saves it (DP 1,
--overlap-grad-reduce --ddp-bucket-size 40): each chunk's own Megatron _ParamAndGradBuffer (training.get_model
disables bucketing for the chunks after the first: one bucket), model_optim_rng.pt's 'optimizer' is
DistributedOptimizer.state_dict() and distrib_optim.pt = DistributedOptimizer.get_parameter_state_dp_zero()
({'buckets_coalesced': True, 0: chunk 0's buffer, 1: chunk 1's}), both Megatron's own methods run over a stand-in that
hands each parameter's range of masters and moments (its constructor needs CUDA), as megatron_torch_optim_reference.py
does.
Run (Debian's torch 1.13 on CPU, PyPI packaging; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  PYTHONPATH=/path/to/packaging MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 /usr/bin/python3 \
    tools/reference/megatron_torch_vpp_optim_reference.py tests/data/megatron
"""
import contextlib
import os
import re
import shutil
import sys
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_torch_dist_optim_reference as oref  # noqa: E402  (train_adamw, global_state, the sizes)
import megatron_ckpt_reference as ref  # noqa: E402
import megatron_torch_optim_reference as toref  # noqa: E402  (legacy_args, adamw_over, write_root, rank_dir)

PP, CHUNKS, LAYERS = 2, 2, 4
# --ddp-bucket-size of the distributed optimizer's fixture: small, so that buckets close after 16-element norms (a bucket
# boundary that is not 64-aligned), where bucketing the chunks after the first would shift the later parameters.
DISTOPT_BUCKET = 40
ITERATION = oref.ITERATION


def four_layers(state):
    """{name: {state: tensor}} of 4 layers: 2 and 3 are 0 and 1 with the masters and first moment negated."""
    out = {}
    for name, s in state.items():
        m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
        out[name] = s
        if m:
            neg = {k: (-v if k in ("fp32_param", "exp_avg") else v.clone()) for k, v in s.items()}
            out["decoder.layers.%d.%s" % (int(m.group(1)) + 2, m.group(2))] = neg
    return out


def global_name(local, layer):
    return re.sub(r"^decoder\.layers\.\d+\.", "decoder.layers.%d." % layer, local)


def worker(rank, world, out, port, state, sched_sd, group_values, distributed=False):
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import _get_param_groups
    from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params
    from megatron.core.transformer.transformer_config import TransformerConfig

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(1, PP, virtual_pipeline_model_parallel_size=CHUNKS)
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    p = parallel_state.get_pipeline_model_parallel_rank()
    chunks, model_names = [], {}
    for v in range(CHUNKS):
        parallel_state.set_virtual_pipeline_model_parallel_rank(v)
        config = TransformerConfig(
            num_layers=LAYERS, hidden_size=ref.HIDDEN, ffn_hidden_size=ref.FFN, num_attention_heads=ref.HEADS,
            num_query_groups=ref.GROUPS, normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
            activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
            attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
            masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
            gradient_accumulation_fusion=False, pipeline_model_parallel_size=PP,
            virtual_pipeline_model_parallel_size=CHUNKS, pipeline_dtype=torch.float32)
        m = GPTModel(config, get_gpt_layer_local_spec(normalization="LayerNorm"), vocab_size=ref.PADDED,
                     max_sequence_length=16, position_embedding_type="rope", share_embeddings_and_output_weights=False,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage())
        layer = v * PP + p  # virtual stage v * PP + p holds one layer
        weights = {n: state[global_name(n, layer)]["fp32_param"].clone() for n, _ in m.named_parameters()}
        missing, unexpected = m.load_state_dict(weights, strict=False)
        assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
        m.bfloat16()
        for n, q in m.named_parameters():
            model_names[q] = global_name(n, layer)
        chunks.append(m)
    parallel_state.set_virtual_pipeline_model_parallel_rank(0)
    wrappers = [types.SimpleNamespace(ddp_config=types.SimpleNamespace(use_custom_fsdp=False),
                                      named_parameters=c.named_parameters) for c in chunks]
    groups = _get_param_groups(wrappers, None, None, 1.0, oref.LR, oref.MIN_LR, None, None)
    for g in groups:
        g["lr"], g["weight_decay"] = group_values[g["wd_mult"]]
    local = {s: {n: x[s] for n, x in state.items()} for s in ("fp32_param", "exp_avg", "exp_avg_sq")}
    names = {}

    def master(q):
        m = torch.nn.Parameter(local["fp32_param"][model_names[q]].clone())
        names[m] = model_names[q]
        return m
    adamw, masters = toref.adamw_over(groups, master, local, names)
    param_state = None
    if distributed:
        import inspect
        from megatron.core.distributed import DistributedDataParallelConfig
        from megatron.core.distributed.param_and_grad_buffer import _ParamAndGradBuffer
        from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
        dp_group = parallel_state.get_data_parallel_group()
        ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=True,
                                                   use_distributed_optimizer=True, bucket_size=DISTOPT_BUCKET)
        extra = ()
        if "nccl_ub" in inspect.signature(_ParamAndGradBuffer.__init__).parameters:
            extra = (False, types.SimpleNamespace(tp=parallel_state.get_tensor_model_parallel_group(), dp_cp=dp_group))
        buffers = []
        for v, c in enumerate(chunks):  # get_model: bucketing disabled for the chunks after the first
            params = [q for q in c.parameters() if q.requires_grad]
            chunk_names = {q: n for n, q in c.named_parameters()}
            buffers.append(_ParamAndGradBuffer(ddp_config, torch.bfloat16, torch.float32, params, dp_group,
                                               DISTOPT_BUCKET if v == 0 else None, chunk_names, 1.0,
                                               list(range(len(params))), *extra))
        gbuf_ranges = [DistributedOptimizer._build_gbuf_range_map(b) for b in buffers]
        flat = {s: {n: x.reshape(-1) for n, x in local[s].items()} for s in local}

        def main_states(model_param):
            rng = None
            for ranges in gbuf_ranges:
                for per_bucket in ranges.values():
                    for m in per_bucket:
                        if model_param in m["param_map"]:
                            rng = m["param_map"][model_param]["param"]
            n = model_names[model_param]
            return {"param": flat["fp32_param"][n][rng.start:rng.end].clone(),
                    "exp_avg": flat["exp_avg"][n][rng.start:rng.end].clone(),
                    "exp_avg_sq": flat["exp_avg_sq"][n][rng.start:rng.end].clone()}
        opt = types.SimpleNamespace(gbuf_ranges=gbuf_ranges, buffers=buffers, data_parallel_group=dp_group,
                                    data_parallel_group_gloo=dp_group, optimizer=adamw, grad_scaler=None,
                                    _get_main_param_and_optimizer_states=main_states,
                                    ddp_config=types.SimpleNamespace(use_custom_fsdp=False, use_megatron_fsdp=False))
        param_state = DistributedOptimizer.get_parameter_state_dp_zero(opt)
        optimizer_sd = DistributedOptimizer.state_dict(opt)
        print("rank", p, "buckets", [[(b.grad_data.numel(), b.numel_unpadded) for b in buf.buckets] for buf in buffers])
    else:
        f16 = Float16OptimizerWithFloat16Params.__new__(Float16OptimizerWithFloat16Params)  # its __init__ needs CUDA
        f16.optimizer, f16.fp32_from_float16_groups, f16.grad_scaler = adamw, masters, None
        optimizer_sd = Float16OptimizerWithFloat16Params.state_dict(f16)
    args = toref.legacy_args(1, PP, 1, distributed, True)
    if distributed:
        args.ddp_bucket_size = DISTOPT_BUCKET
    args.num_layers = LAYERS
    args.virtual_pipeline_model_parallel_size = CHUNKS
    args.num_layers_per_virtual_pipeline_stage = 1
    args.untie_embeddings_and_output_weights = True
    print("rank", p, "groups", [(g["wd_mult"], [names[q] for q in g["params"]]) for g in adamw.param_groups])
    d = toref.rank_dir(out, 1, PP, 0, p)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
                "model0": chunks[0].state_dict_for_save_checkpoint(),
                "model1": chunks[1].state_dict_for_save_checkpoint(),
                "optimizer": optimizer_sd, "opt_param_scheduler": sched_sd,
                "num_floating_point_operations_so_far": 0.0}, os.path.join(d, "model_optim_rng.pt"))
    if param_state is not None:
        torch.save(param_state, os.path.join(d, "distrib_optim.pt"))  # save_parameter_state's file
    dist.destroy_process_group()


def main():
    fixtures = sys.argv[1]
    model, opt, sched = oref.train_adamw()
    state = oref.global_state(model, opt.optimizer)
    sched_sd = sched.state_dict()
    group_values = {g["wd_mult"]: (g["lr"], g["weight_decay"]) for g in opt.optimizer.param_groups}
    dist.destroy_process_group()
    saved = torch.load(os.path.join(fixtures, "torch_adam", "iter_%07d" % ITERATION, "mp_rank_00",
                                    "model_optim_rng.pt"), map_location="cpu")["optimizer"]["state"]
    mine = opt.state_dict()["state"]
    for i, s in saved.items():  # the same run as the torch_adam fixture
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(s[k], mine[i][k]), (i, k)
    for k, (name, distributed) in enumerate((("torch_adam_bf16_vpp", False), ("torch_adam_distopt_vpp", True))):
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        mp.spawn(worker, args=(PP, out, 32000 + os.getpid() % 2000 + 100 * k, four_layers(state), sched_sd,
                               group_values, distributed), nprocs=PP, join=True)
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        print("wrote", out)


if __name__ == "__main__":
    main()
