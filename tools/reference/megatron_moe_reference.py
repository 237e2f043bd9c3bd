"""Tiny Megatron-Core MoE GPT checkpoints (legacy `torch` and `torch_dist` formats), built with Megatron's own model.

Writes tests/data/megatron/moe/ (the fixtures of tests/train/megatron_moe_test.cc and tests/cli/megatron_moe_cli_test.cc):
  torch_ep1/          iter_0000007/mp_rank_00/model_optim_rng.pt: SequentialMLP experts
                      (decoder.layers.i.mlp.experts.local_experts.e.linear_fc1.weight, ...), router weight and
                      expert_bias, shared expert (mlp.shared_experts.linear_fc1/fc2)
  torch_tp2ep2/       iter_0000007/mp_rank_{00,01}_{000,001}/...: the same weights at TP 2 x EP 2 (PP 1, so
                      Megatron's names are mp_rank_TT_EEE), expert TP = TP: each EP rank's file numbers its 2
                      experts from 0; the experts' fc1 (SwiGLU halves) and the shared expert split as the dense MLP
  torch_grouped_ep2/  iter_0000007/mp_rank_00_{000,001}/...: --moe-grouped-gemm without Transformer Engine:
                      Megatron's (legacy) GroupedMLP, mlp.experts.weight1 [H, El * 2 Fe] and weight2 [El * Fe, H]
  torch_te_grouped_ep2/  the layout of TEGroupedMLP's state dict (mlp.experts.linear_fc1.weight<i>, local i):
                      TE's GroupedLinear cannot be built without CUDA, so these are the SequentialMLP
                      tensors under TE's names (weight<i> of shape [out, in], as GroupedLinear registers them)
  torch_dist/         iter_0000007/{common.pt, .metadata, __0_0.distcp, metadata.json}: GPTModel.sharded_state_dict()
                      saved by dist_checkpointing.save (default torch_dist strategy, one-process gloo group):
                      global experts stacked as decoder.layers.mlp.experts.experts.linear_fc1.weight [L, E, 2 Fe, H];
                      with Megatron's FP32Optimizer state over torch SGD (momentum 0.9, every buffer 0.01 after
                      one step), optimizer.state.momentum_buffer.<model key>
  torch_dcp/          iter_0000007/{.metadata, __0_0.distcp}: --ckpt-format torch_dcp, torch.distributed.checkpoint.save
                      of generate_state_dict's dict (args, iteration, checkpoint_version, model = the plain state dict)
  reference.json      tokens, labels, Megatron's logits and per-token losses, state-dict keys and shapes
The model: 2 layers, hidden 16, 2 heads, LayerNorm, RoPE, no biases, untied output, vocabulary 50 padded
to 64, every layer MoE: 4 experts, top-2, SwiGLU expert ffn 8, sigmoid scores with an expert bias
(--moe-router-score-function sigmoid --moe-router-enable-expert-bias; the bias set non-zero so that it
changes the routing), a shared expert of 8 (no gate: Megatron has no flag for it), allgather dispatcher.
Checks: the GroupedMLP model (gg.ops.gmm done per expert on CPU) given the weight1/weight2 built from the
SequentialMLP weights gives the same logits; the torch_dist directory loaded back with
dist_checkpointing.load gives the same tensors.
Run (PyPI torch 2.5.1 with packaging on CPU; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  MEGATRON_LM=/tmp/meg python3 tools/reference/megatron_moe_reference.py tests/data/megatron/moe

With `--check-gale-written DIR` instead, torch.load()s every mp_rank_TT[_EEE]/model_optim_rng.pt of a
checkpoint Gale wrote (e.g. `gale convert --load-model-type mg --save-model-type gale` of torch_ep1/,
then `--save-model-type mg --target-tensor-parallel-size 2 --target-expert-parallel-size 2`), checks
that each file's keys and tensors are what shard() cuts from torch_ep1/ for that rank (the
`_extra_state` entries included), loads torch_ep1's tensors rebuilt from the files into Megatron's
GPTModel with load_state_dict(strict=True) and checks the logits against reference.json.
"""
import argparse
import contextlib
import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint

sys.path.insert(0, os.environ.get("MEGATRON_LM", "/tmp/meg"))
if not torch.cuda.is_available():  # RoPE's device, and the torch_dist writer's synchronize
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

NUM_LAYERS, HIDDEN, HEADS, FFN, VOCAB, PADDED, SEQ = 2, 16, 2, 32, 50, 64, 8
EXPERTS, TOPK, MOE_FFN, SHARED_FFN = 4, 2, 8, 8
ITERATION = 7


def megatron_args(tp, ep, grouped=False, fmt="torch"):
    return argparse.Namespace(
        num_layers=NUM_LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        kv_channels=HIDDEN // HEADS, group_query_attention=False, num_query_groups=1, seq_length=16,
        max_position_embeddings=16, position_embedding_type="rope", add_position_embedding=False, rotary_base=10000,
        rotary_percent=1.0, rotary_interleaved=False, normalization="LayerNorm", norm_epsilon=1e-5, swiglu=True,
        untie_embeddings_and_output_weights=True, add_bias_linear=False, add_qkv_bias=False, apply_layernorm_1p=False,
        make_vocab_size_divisible_by=32, padded_vocab_size=PADDED, vocab_size=VOCAB, tokenizer_type="NullTokenizer",
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        expert_model_parallel_size=ep, expert_tensor_parallel_size=tp, transformer_impl="local", ckpt_format=fmt,
        num_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=MOE_FFN, moe_layer_freq=1,
        moe_router_pre_softmax=False, moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
        moe_router_topk_scaling_factor=None, moe_router_num_groups=None, moe_router_group_topk=None,
        moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.0, moe_z_loss_coeff=None,
        moe_input_jitter_eps=None, moe_token_dispatcher_type="allgather", moe_grouped_gemm=grouped,
        moe_use_legacy_grouped_gemm=grouped, moe_shared_expert_intermediate_size=SHARED_FFN,
        moe_shared_expert_overlap=False, moe_router_bias_update_rate=1e-3, consumed_train_samples=56,
        consumed_valid_samples=0, skipped_train_samples=0, iteration=ITERATION, params_dtype=torch.float32,
        fp16=False, bf16=False)


def config(grouped=False):
    from megatron.core.transformer.transformer_config import TransformerConfig
    return TransformerConfig(
        num_layers=NUM_LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, num_moe_experts=EXPERTS, moe_router_topk=TOPK,
        moe_ffn_hidden_size=MOE_FFN, moe_shared_expert_intermediate_size=SHARED_FFN,
        moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True, moe_aux_loss_coeff=0.0,
        moe_token_dispatcher_type="allgather", moe_grouped_gemm=grouped, moe_router_load_balancing_type="none")


def init_group():
    from megatron.core import parallel_state
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29700 + os.getpid() % 200))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def build_model(grouped=False):
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    if grouped:  # Megatron's GroupedMLP on CPU: the grouped GEMM done expert by expert
        from megatron.core.transformer.moe import grouped_gemm_util as gg

        def gmm(x, w, tokens_per_expert, trans_b=False):
            out, start = [], 0
            for e, n in enumerate(tokens_per_expert.tolist()):
                out.append(x[start:start + n] @ (w[e].t() if trans_b else w[e]))
                start += n
            return torch.cat(out, 0)
        gg.assert_grouped_gemm_is_available = lambda: None
        gg.ops = argparse.Namespace(gmm=gmm)
    spec = get_gpt_layer_local_spec(num_experts=EXPERTS, moe_grouped_gemm=grouped, moe_use_legacy_grouped_gemm=grouped,
                                    normalization="LayerNorm")
    model = GPTModel(config(grouped), spec, vocab_size=PADDED, max_sequence_length=16, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    model.eval()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return model


def randomize(model):
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():  # larger than Megatron's 0.02 init, so the logits depend on every weight
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):  # large enough to change which experts are chosen
                b.copy_(0.5 * torch.randn(b.shape, generator=g))


def forward(model, tokens, labels=None):
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        return model(tokens, torch.arange(SEQ).unsqueeze(0), mask, labels=labels)


def expert_of(k):
    """'decoder.layers.i.mlp.experts.local_experts.e.rest' -> (i, e, rest), else None."""
    p = k.split(".")
    if len(p) > 6 and p[3:6] == ["mlp", "experts", "local_experts"]:
        return int(p[2]), int(p[6]), ".".join(p[7:])
    return None


def cut(k, v, tp, t):
    """Tensor-parallel piece t of tp of `v` (name k) as Megatron's layers split it (expert TP = TP)."""
    if not torch.is_tensor(v) or tp == 1:
        return v
    if k.endswith("linear_fc1.weight"):
        gate, up = v.chunk(2, 0)
        return torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]], 0)
    if any(k.endswith(s) for s in ("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
        return v.chunk(tp, 0)[t]
    if any(k.endswith(s) for s in ("linear_proj.weight", "linear_fc2.weight")):
        return v.chunk(tp, 1)[t]
    return v  # norms, router weight and expert_bias


def shard(sd, tp, ep, t, e, layout):
    """Rank (t, e)'s legacy state dict: its experts numbered from 0, in `layout` (sequential, grouped, te)."""
    local = EXPERTS // ep
    out, grouped = {}, {}
    for k, v in sd.items():
        x = expert_of(k)
        if x is None:
            out[k] = cut(k, v, tp, t).clone() if torch.is_tensor(v) else v
            continue
        i, g, rest = x
        if g // local != e:
            continue
        j = g - e * local
        piece = cut(rest, v, tp, t)
        if layout == "sequential":
            out["decoder.layers.%d.mlp.experts.local_experts.%d.%s" % (i, j, rest)] = (
                piece.clone() if torch.is_tensor(piece) else piece)
        elif layout == "te":
            if torch.is_tensor(piece):
                name = rest.split(".")[0]
                out["decoder.layers.%d.mlp.experts.%s.weight%d" % (i, name, j)] = piece.clone()
        elif torch.is_tensor(piece):  # GroupedMLP: weight1 and weight2, each expert's [in, out] one after the other
            grouped.setdefault((i, rest), {})[j] = piece
    for (i, rest), by_j in grouped.items():
        parts = [by_j[j].t() for j in range(local)]  # fc1 [rows, H] -> [H, rows]; fc2 [H, Fe] -> [Fe, H]
        if rest.startswith("linear_fc1"):  # [H, El * rows] whose memory is [El, H, rows] (forward: view(El, H, -1))
            out["decoder.layers.%d.mlp.experts.weight1" % i] = torch.stack(parts, 0).reshape(HIDDEN, -1).contiguous()
        else:
            out["decoder.layers.%d.mlp.experts.weight2" % i] = torch.cat(parts, 0).contiguous()
    if layout == "te":  # TE's GroupedLinear keeps one _extra_state per module
        for i in range(NUM_LAYERS):
            for name in ("linear_fc1", "linear_fc2"):
                out["decoder.layers.%d.mlp.experts.%s._extra_state" % (i, name)] = None
    return out


def save(root, tp, ep, sd, layout):
    for t in range(tp):
        for e in range(ep):
            name = "mp_rank_%02d" % t + ("_%03d" % e if ep > 1 else "")
            d = os.path.join(root, "iter_%07d" % ITERATION, name)
            os.makedirs(d, exist_ok=True)
            state = {"args": megatron_args(tp, ep, layout == "grouped"), "checkpoint_version": 3.0,
                     "iteration": ITERATION, "model": shard(sd, tp, ep, t, e, layout)}
            torch.save(state, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def save_torch_dist(root, model, sd):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    ckpt = os.path.join(root, "iter_%07d" % ITERATION)
    os.makedirs(ckpt, exist_ok=True)
    args = megatron_args(1, 1, fmt="torch_dist")
    args.optimizer, args.use_distributed_optimizer = "sgd", False
    st = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model.sharded_state_dict(),
          "num_floating_point_operations_so_far": 0.0}
    # With optimizer state, as a training run saves it: torch SGD's momentum after one step of
    # gradients 0.01 (each momentum buffer 0.01), the weights restored.
    import megatron_torch_dist_reference as dist_ref
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    opt = dist_ref.sgd_with_momentum(model, {k: v.clone() if torch.is_tensor(v) else v for k, v in sd.items()})
    st["optimizer"] = opt.sharded_state_dict(st["model"])
    # The scheduler of the tests' run (--lr 1e-4, linear decay over 8 iterations of 2 samples), 7 done.
    sched = OptimizerParamScheduler(opt.optimizer, init_lr=0.0, max_lr=1e-4, min_lr=0.0, lr_warmup_steps=0,
                                    lr_decay_steps=16, lr_decay_style="linear", start_wd=0.01, end_wd=0.01,
                                    wd_incr_steps=16, wd_incr_style="constant")
    sched.step(increment=14)
    st["opt_param_scheduler"] = sched.state_dict()
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    fresh = build_model()
    loaded = dist_checkpointing.load({"model": fresh.sharded_state_dict()}, ckpt)["model"]
    fresh.load_state_dict(loaded, strict=True)
    for k, v in fresh.state_dict().items():
        if torch.is_tensor(v):
            assert torch.equal(v, sd[k]), k
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    md = FileSystemReader(ckpt).read_metadata()
    return {k: list(v.size) for k, v in sorted(md.state_dict_metadata.items()) if isinstance(v, TensorStorageMetadata)}


def check_gale_written(gale_dir, fixtures):
    it = open(os.path.join(gale_dir, "latest_checkpointed_iteration.txt")).read().strip()
    base = os.path.join(gale_dir, "iter_%07d" % int(it))
    names = sorted(os.listdir(base))
    ref_path = os.path.join(fixtures, "torch_ep1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt")
    sd = torch.load(ref_path, map_location="cpu", weights_only=False)["model"]
    args = torch.load(os.path.join(base, names[0], "model_optim_rng.pt"), weights_only=False)["args"]
    tp, ep = args.tensor_model_parallel_size, args.expert_model_parallel_size
    assert args.pipeline_model_parallel_size == 1, "the check covers PP 1"
    assert args.num_experts == EXPERTS and args.moe_ffn_hidden_size == MOE_FFN, vars(args)
    assert len(names) == tp * ep, names
    merged = {}
    for name in names:
        parts = [int(x) for x in name.split("_")[2:]]
        t, e = parts[0], parts[1] if ep > 1 else 0
        state = torch.load(os.path.join(base, name, "model_optim_rng.pt"), map_location="cpu", weights_only=False)
        assert state["checkpoint_version"] == 3.0
        want = shard(sd, tp, ep, t, e, "sequential")
        got = state["model"]
        assert sorted(got) == sorted(want), (name, sorted(set(got) ^ set(want)))
        for k, v in want.items():
            assert (v is None and got[k] is None) or torch.equal(got[k], v), (name, k)
        print(name, "equals rank (TP %d, EP %d) of torch_ep1 as Megatron shards it:" % (t, e), len(got), "entries")
        if t == 0:
            for k, v in got.items():
                x = expert_of(k)
                if x is not None:
                    k = "decoder.layers.%d.mlp.experts.local_experts.%d.%s" % (x[0], e * (EXPERTS // ep) + x[1], x[2])
                if tp == 1 or not torch.is_tensor(v):
                    merged.setdefault(k, v)
    if tp == 1:
        init_group()
        model = build_model()
        model.load_state_dict(merged, strict=True)
        r = json.load(open(os.path.join(fixtures, "reference.json")))
        diff = (forward(model, torch.tensor([r["tokens"]]))[0] - torch.tensor(r["logits"])).abs().max().item()
        assert diff == 0.0, diff
        print("Megatron's GPTModel.load_state_dict(strict=True) accepts the merged files; logits equal reference.json")
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--check-gale-written")
    a = ap.parse_args()
    if a.check_gale_written:
        check_gale_written(a.check_gale_written, a.out)
        return
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    init_group()
    torch.manual_seed(1234)
    model = build_model()
    randomize(model)
    sd = {k: v.clone() if torch.is_tensor(v) else v for k, v in model.state_dict_for_save_checkpoint().items()}
    tokens = torch.tensor([[3, 17, 42, 8, 0, 49, 25, 11]])
    labels = torch.tensor([[17, 42, 8, 0, 49, 25, 11, 30]])
    logits = forward(model, tokens)
    losses = forward(model, tokens, labels)
    save(os.path.join(a.out, "torch_ep1"), 1, 1, sd, "sequential")
    save(os.path.join(a.out, "torch_tp2ep2"), 2, 2, sd, "sequential")
    save(os.path.join(a.out, "torch_grouped_ep2"), 1, 2, sd, "grouped")
    save(os.path.join(a.out, "torch_te_grouped_ep2"), 1, 2, sd, "te")
    # Megatron's GroupedMLP given the same weights in its layout computes the same logits.
    grouped = build_model(grouped=True)
    gsd = shard(sd, 1, 1, 0, 0, "grouped")
    grouped.load_state_dict({k: v for k, v in gsd.items() if torch.is_tensor(v) or v is None}, strict=False)
    missing = [k for k in grouped.state_dict() if k not in gsd and not k.endswith("_extra_state")]
    assert not missing, missing
    gdiff = (forward(grouped, tokens) - logits).abs().max().item()
    assert gdiff < 1e-5, gdiff
    dist_keys = save_torch_dist(os.path.join(a.out, "torch_dist"), model, sd)
    dcp = os.path.join(a.out, "torch_dcp")
    os.makedirs(os.path.join(dcp, "iter_%07d" % ITERATION))
    torch.distributed.checkpoint.save(
        state_dict={"args": megatron_args(1, 1, fmt="torch_dcp"), "checkpoint_version": 3.0, "iteration": ITERATION,
                    "model": model.state_dict_for_save_checkpoint()},
        storage_writer=torch.distributed.checkpoint.FileSystemWriter(os.path.join(dcp, "iter_%07d" % ITERATION)))
    with open(os.path.join(dcp, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    ref = {"tokens": tokens[0].tolist(), "labels": labels[0].tolist(), "vocab_size": VOCAB, "padded_vocab_size": PADDED,
           "loss": float(losses.float().mean()), "losses": [float(x) for x in losses[0]],
           "logits": [[float(x) for x in row] for row in logits[0]],
           "keys": {k: list(v.shape) for k, v in sorted(sd.items()) if torch.is_tensor(v)},
           "grouped_keys": {k: list(v.shape) for k, v in sorted(gsd.items()) if torch.is_tensor(v)},
           "torch_dist_keys": dist_keys}
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("loss", ref["loss"], "grouped logits diff", gdiff, "keys", len(ref["keys"]))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
