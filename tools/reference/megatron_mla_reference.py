"""Tiny Megatron-Core multi-latent-attention GPT checkpoints, built, run and saved by Megatron's own code.

Writes tests/data/megatron/mla_<variant>/ for two variants (the fixtures of tests/train/megatron_mla_checkpoint_test.cc):
  qlora   q LoRA (q_lora_rank 16) with --qk-layernorm (q_layernorm / kv_layernorm), RMSNorm, YaRN (rope_type
          absent from args, as core_v0.12.1 records it: Megatron's MLA default 'yarn'; rotary_scaling_factor 4,
          mscale = mscale_all_dim = 0.8, max_position_embeddings 4096: core_v0.12.1's softmax scale takes
          m(s, mscale) where later Megatron (and Gale) take m(s, mscale_all_dim), and later Megatron's YaRN
          takes original_max_position_embeddings (default 4096) where core_v0.12.1 takes max_position_embeddings;
          equal values keep the fixture's meaning the same in both)
  noq     a direct query projection (linear_q_proj, q_lora_rank None), no --qk-layernorm, LayerNorm, rope_type 'rope'
each as
  tp1/         iter_0000007/mp_rank_00/model_optim_rng.pt: the legacy `torch` format (generate_state_dict's dict:
               args, checkpoint_version 3.0, iteration, model = state_dict_for_save_checkpoint())
  tp2/         iter_0000007/mp_rank_{00,01}/model_optim_rng.pt: the same weights in a 2-process TP 2 model, each
               rank's own state_dict_for_save_checkpoint()
  torch_dist/  iter_0000007/: dist_checkpointing.save of the TP 2 model's sharded_state_dict() (torch_dist)
and tests/data/megatron/mla_reference.json: per variant the tokens, labels, Megatron's logits [S, Vp] and per-token
losses of the TP 1 model, and the TP 2 model's logits difference from them.
The model is Megatron core_v0.12.1's GPTModel with get_gpt_layer_local_spec(multi_latent_attention=True) and an
MLATransformerConfig: 2 layers, hidden 32, 4 heads, kv_lora_rank 12, qk_head_dim 8, qk_pos_emb_head_dim 4,
v_head_dim 6, SwiGLU ffn 48, no biases, untied output layer, vocabulary 50 padded to 64.
The TP 2 weights are cut from the TP 1 state dict (column-parallel rows of linear_q_proj / linear_q_down_proj /
linear_q_up_proj / linear_kv_down_proj / linear_kv_up_proj, row-parallel columns of linear_proj, SwiGLU's [gate; up]
halves, vocabulary rows) and checked by running the TP 2 model: its gathered logits must equal the TP 1 ones, so a
wrong cut would fail here.
CPU shims (stated, not hidden): core_v0.12.1's local DotProductAttention takes no k_channels / v_channels (MLA's
queries/keys and values differ in width; Megatron runs MLA on Transformer Engine's attention), so the core attention
is CoreAttention below: softmax(scale * q k^T + causal mask) v with MLA's softmax_scale, nothing else;
torch.distributed.all_gather_into_tensor (unsupported by gloo) is done with all_gather; torch.cuda.current_device
is the CPU; the CUDA RNG tracker's fork is a no-op (dropout 0).
Run (PyPI torch 2.5.1 with packaging, psutil on CPU; Megatron-LM core_v0.12.1 source in MEGATRON_LM):
  MEGATRON_LM=/tmp/meg python3 tools/reference/megatron_mla_reference.py tests/data/megatron
"""
import argparse
import contextlib
import json
import math
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.environ.get("MEGATRON_LM", "/tmp/meg"))
if not torch.cuda.is_available():
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None

LAYERS, HIDDEN, HEADS, FFN, VOCAB, PADDED, SEQ = 2, 32, 4, 48, 50, 64, 8
KV_LORA, QK_HEAD, QK_POS, V_HEAD = 12, 8, 4, 6
ITERATION = 7
VARIANTS = {
    "qlora": dict(q_lora_rank=16, qk_layernorm=True, normalization="RMSNorm", rope_type=None,
                  rotary_scaling_factor=4.0, mscale=0.8, mscale_all_dim=0.8, max_position_embeddings=4096),
    "noq": dict(q_lora_rank=None, qk_layernorm=False, normalization="LayerNorm", rope_type="rope",
                rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=1.0, max_position_embeddings=16),
}
ROW_PARALLEL = ("linear_proj.weight", "linear_fc2.weight")
COLUMN_PARALLEL = ("linear_q_proj.weight", "linear_q_down_proj.weight", "linear_q_up_proj.weight",
                   "linear_kv_down_proj.weight", "linear_kv_up_proj.weight", "word_embeddings.weight",
                   "output_layer.weight")


def _all_gather_into_tensor(output, input_, group=None, async_op=False):
    parts = list(output.chunk(dist.get_world_size(group), dim=0))
    dist.all_gather(parts, input_.contiguous(), group=group)
    output.copy_(torch.cat(parts, 0))


dist.all_gather_into_tensor = _all_gather_into_tensor


def core_attention_class():
    from megatron.core.transformer.module import MegatronModule

    class CoreAttention(MegatronModule):
        """softmax(scale * q k^T, causal) v for [s, b, n, d] q/k and [s, b, n, dv] v -> [s, b, n * dv]."""

        def __init__(self, config, layer_number, attn_mask_type, attention_type, attention_dropout=None,
                     softmax_scale=None, k_channels=None, v_channels=None, cp_comm_type=None):
            super().__init__(config=config)
            self.scale = softmax_scale

        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            s = query.size(0)
            q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, n, s, d]
            scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
            causal = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(causal, float("-inf"))
            out = torch.matmul(torch.softmax(scores, dim=-1), v)  # [b, n, s, dv]
            return out.permute(2, 0, 1, 3).reshape(s, out.size(0), -1)

    return CoreAttention


def megatron_args(v, tp):
    a = argparse.Namespace(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        kv_channels=HIDDEN // HEADS, group_query_attention=False, num_query_groups=1, seq_length=16,
        max_position_embeddings=v["max_position_embeddings"], position_embedding_type="rope",
        add_position_embedding=False, rotary_base=10000, rotary_percent=1.0, rotary_interleaved=False,
        normalization=v["normalization"], norm_epsilon=1e-5, swiglu=True, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, add_qkv_bias=False, apply_layernorm_1p=False, make_vocab_size_divisible_by=32,
        padded_vocab_size=PADDED, vocab_size=VOCAB, tokenizer_type="NullTokenizer", tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None, transformer_impl="local",
        consumed_train_samples=56, consumed_valid_samples=0, skipped_train_samples=0, iteration=ITERATION,
        params_dtype=torch.float32, fp16=False, bf16=False, multi_latent_attention=True,
        q_lora_rank=v["q_lora_rank"], kv_lora_rank=KV_LORA, qk_head_dim=QK_HEAD, qk_pos_emb_head_dim=QK_POS,
        v_head_dim=V_HEAD, qk_layernorm=v["qk_layernorm"], rotary_scaling_factor=v["rotary_scaling_factor"],
        mscale=v["mscale"], mscale_all_dim=v["mscale_all_dim"])
    if v["rope_type"] is not None:  # core_v0.12.1 has no --rope-type (later Megatron records it)
        a.rope_type = v["rope_type"]
    return a


def build(v, tp):
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    config = MLATransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        normalization=v["normalization"], layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, bias_dropout_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, tensor_model_parallel_size=tp,
        pipeline_dtype=torch.float32, multi_latent_attention=True, q_lora_rank=v["q_lora_rank"],
        kv_lora_rank=KV_LORA, qk_head_dim=QK_HEAD, qk_pos_emb_head_dim=QK_POS, v_head_dim=V_HEAD,
        qk_layernorm=v["qk_layernorm"], rope_type=v["rope_type"] or "yarn", rotary_base=10000,
        rotary_scaling_factor=v["rotary_scaling_factor"], mscale=v["mscale"], mscale_all_dim=v["mscale_all_dim"],
        max_position_embeddings=v["max_position_embeddings"])
    spec = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=v["qk_layernorm"],
                                    normalization=v["normalization"])
    spec.submodules.self_attention.submodules.core_attention = core_attention_class()
    model = GPTModel(config, spec, vocab_size=PADDED, max_sequence_length=16, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    model.eval()
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return model


def init_weights(model):
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():  # larger than Megatron's 0.02 init, so the logits depend on every weight
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))


def shard(sd, tp, t):
    out = {}
    for k, x in sd.items():
        if not torch.is_tensor(x):
            out[k] = x
        elif k.endswith("linear_fc1.weight"):
            gate, up = x.chunk(2, dim=0)
            out[k] = torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]], 0).clone()
        elif k.endswith(COLUMN_PARALLEL):
            out[k] = x.chunk(tp, 0)[t].clone()
        elif k.endswith(ROW_PARALLEL):
            out[k] = x.chunk(tp, 1)[t].clone()
        else:
            out[k] = x.clone()
    return out


def forward(model, tokens, labels=None):
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        return model(tokens, torch.arange(SEQ).unsqueeze(0), mask, labels=labels)


def save_torch(root, rank_name, args, sd):
    d = os.path.join(root, "iter_%07d" % ITERATION, rank_name)
    os.makedirs(d, exist_ok=True)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd},
               os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def init_group(rank, world, port):
    from megatron.core import parallel_state
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(world, 1)


def tp1_worker(rank, name, out, port):
    init_group(0, 1, port)
    v = VARIANTS[name]
    model = build(v, 1)
    init_weights(model)
    sd = dict(model.state_dict_for_save_checkpoint())
    tokens = torch.tensor([[3, 17, 42, 8, 0, 49, 25, 11]])
    labels = torch.tensor([[17, 42, 8, 0, 49, 25, 11, 30]])
    logits = forward(model, tokens)
    losses = forward(model, tokens, labels)
    save_torch(os.path.join(out, "mla_" + name, "tp1"), "mp_rank_00", megatron_args(v, 1), sd)
    ref = {"tokens": tokens[0].tolist(), "labels": labels[0].tolist(), "loss": float(losses.mean()),
           "losses": [float(x) for x in losses[0]], "logits": [[float(x) for x in r] for r in logits[0]],
           "keys": sorted(k for k in sd if torch.is_tensor(sd[k])),
           "shapes": {k: list(sd[k].shape) for k in sorted(sd) if torch.is_tensor(sd[k])}}
    with open(os.path.join(out, "mla_%s_tp1.json" % name), "w") as f:
        json.dump(ref, f)
    dist.destroy_process_group()


def tp2_worker(rank, name, out, port):
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    init_group(rank, 2, port)
    v = VARIANTS[name]
    model = build(v, 2)
    base = os.path.join(out, "mla_" + name)
    tp1 = torch.load(os.path.join(base, "tp1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt"),
                     map_location="cpu", weights_only=False)["model"]
    model.load_state_dict(shard(tp1, 2, rank), strict=True)
    # The TP 2 model's logits (vocabulary-parallel, gathered) must be the TP 1 model's.
    ref = json.load(open(os.path.join(out, "mla_%s_tp1.json" % name)))
    local = forward(model, torch.tensor([ref["tokens"]]))
    parts = [torch.empty_like(local) for _ in range(2)]
    dist.all_gather(parts, local.contiguous())
    diff = (torch.cat(parts, -1)[0] - torch.tensor(ref["logits"])).abs().max().item()
    assert diff < 1e-5, ("TP 2 logits differ from TP 1", name, diff)
    args = megatron_args(v, 2)
    save_torch(os.path.join(base, "tp2"), "mp_rank_%02d" % rank, args, dict(model.state_dict_for_save_checkpoint()))
    ckpt = os.path.join(base, "torch_dist", "iter_%07d" % ITERATION)
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    args.ckpt_format = "torch_dist"
    st = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model.sharded_state_dict(),
          "num_floating_point_operations_so_far": 0.0}
    dist_checkpointing.save(st, ckpt, get_default_save_sharded_strategy("torch_dist"))
    dist.barrier()
    if rank == 0:
        with open(os.path.join(base, "torch_dist", "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        with open(os.path.join(out, "mla_%s_tp2.json" % name), "w") as f:
            json.dump({"tp2_logit_diff": diff}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    a = ap.parse_args()
    result = {}
    for k, name in enumerate(VARIANTS):
        shutil.rmtree(os.path.join(a.out, "mla_" + name), ignore_errors=True)
        port = 29700 + os.getpid() % 200 + 5 * k
        mp.spawn(tp1_worker, args=(name, a.out, port), nprocs=1, join=True)
        mp.spawn(tp2_worker, args=(name, a.out, port + 1), nprocs=2, join=True)
        r = json.load(open(os.path.join(a.out, "mla_%s_tp1.json" % name)))
        r.update(json.load(open(os.path.join(a.out, "mla_%s_tp2.json" % name))))
        os.remove(os.path.join(a.out, "mla_%s_tp1.json" % name))
        os.remove(os.path.join(a.out, "mla_%s_tp2.json" % name))
        result[name] = r
        print(name, "loss", r["loss"], "TP 2 logits diff", r["tp2_logit_diff"], "keys", r["keys"])
    with open(os.path.join(a.out, "mla_reference.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
