#!/usr/bin/python3
"""Megatron-Core main's DeepSeek sparse attention checkpoints (legacy `torch` format) of the DeepSeek-V3.2 fixture.

    /usr/bin/python3 tools/reference/megatron_dsa_reference.py     # torch 1.13, < 5 s

Writes tests/data/megatron/dsa/{tp1,tp2}/ (iter_0000007/mp_rank_NN/model_optim_rng.pt as Megatron's
generate_state_dict: args Namespace, checkpoint_version 3.0, iteration, model) holding the weights of
tests/data/hf/deepseek_v32 (tools/reference/hf_fixture_deepseek_v32.py) under the names Megatron-Core
main's GPT model with the DSA layer spec (get_dsa_module_spec_for_backend: AbsorbedMLASelfAttention with
unfused q_layernorm / kv_layernorm and DSAttention as core_attention, which holds the DSAIndexer) gives
them, split over TP as that spec splits them:
  linear_q_down_proj, linear_kv_down_proj     duplicated (backend.linear()): whole on every rank
  linear_q_up_proj, linear_kv_up_proj         column-parallel: rows split by head
  linear_proj, mlp.linear_fc2                 row-parallel: columns split
  mlp.linear_fc1                              column-parallel SwiGLU: rank r holds [gate_r; up_r]
  core_attention.indexer.*                    duplicated (linear_wq_b, linear_wk, k_norm, linear_weights_proj)
  embedding / output_layer                    vocab-parallel rows (padded to 128)
plus `_extra_state` None entries of the linears. The model's logits are the HF fixture's
golden.safetensors (the same weights), which tests/train/megatron_dsa_checkpoint_test.cc compares.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture_deepseek_v32 as v32  # noqa: E402

ROOT = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(ROOT, "..", "..", "tests", "data", "megatron", "dsa")
ITERATION = 7
PADDED = 128


def megatron_args(c, tp):
    return argparse.Namespace(
        num_layers=c["num_hidden_layers"], hidden_size=c["hidden_size"], ffn_hidden_size=c["intermediate_size"],
        num_attention_heads=c["num_attention_heads"], kv_channels=c["hidden_size"] // c["num_attention_heads"],
        group_query_attention=False, num_query_groups=1, seq_length=c["max_position_embeddings"],
        max_position_embeddings=c["max_position_embeddings"], position_embedding_type="rope",
        add_position_embedding=False, rotary_base=10000, rotary_percent=1.0, rotary_interleaved=False,
        normalization="RMSNorm", norm_epsilon=c["rms_norm_eps"], swiglu=True, untie_embeddings_and_output_weights=True,
        add_bias_linear=False, add_qkv_bias=False, apply_layernorm_1p=False, make_vocab_size_divisible_by=32,
        padded_vocab_size=PADDED, vocab_size=c["vocab_size"], tokenizer_type="NullTokenizer",
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None,
        transformer_impl="transformer_engine", consumed_train_samples=56, consumed_valid_samples=0,
        skipped_train_samples=0, iteration=ITERATION, params_dtype=torch.float32, fp16=False, bf16=False,
        multi_latent_attention=True, q_lora_rank=c["q_lora_rank"], kv_lora_rank=c["kv_lora_rank"],
        qk_head_dim=c["qk_nope_head_dim"], qk_pos_emb_head_dim=c["qk_rope_head_dim"], v_head_dim=c["v_head_dim"],
        qk_layernorm=True, rope_type="rope", rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0,
        experimental_attention_variant="dsa", dsa_indexer_n_heads=c["index_n_heads"],
        dsa_indexer_head_dim=c["index_head_dim"], dsa_indexer_topk=c["index_topk"], dsa_indexer_loss_coeff=None,
        dsa_indexer_use_sparse_loss=False)


def whole_state_dict(c, w):
    """Megatron's names for the HF tensors `w`, unsplit."""
    pad = lambda t: torch.cat([t, torch.zeros(PADDED - t.shape[0], t.shape[1], dtype=t.dtype)])  # noqa: E731
    sd = {"embedding.word_embeddings.weight": pad(w["model.embed_tokens.weight"]),
          "decoder.final_layernorm.weight": w["model.norm.weight"],
          "output_layer.weight": pad(w["lm_head.weight"])}
    attn = {"q_a_proj": "linear_q_down_proj", "q_a_layernorm": "q_layernorm", "q_b_proj": "linear_q_up_proj",
            "kv_a_proj_with_mqa": "linear_kv_down_proj", "kv_a_layernorm": "kv_layernorm",
            "kv_b_proj": "linear_kv_up_proj", "o_proj": "linear_proj", "indexer.wq_b": "core_attention.indexer.linear_wq_b",
            "indexer.wk": "core_attention.indexer.linear_wk", "indexer.k_norm": "core_attention.indexer.k_norm",
            "indexer.weights_proj": "core_attention.indexer.linear_weights_proj"}
    for i in range(c["num_hidden_layers"]):
        h, g = f"model.layers.{i}.", f"decoder.layers.{i}."
        sd[g + "input_layernorm.weight"] = w[h + "input_layernorm.weight"]
        sd[g + "pre_mlp_layernorm.weight"] = w[h + "post_attention_layernorm.weight"]
        for src, dst in attn.items():
            for kind in ("weight", "bias"):
                if h + "self_attn." + src + "." + kind in w:
                    sd[g + "self_attention." + dst + "." + kind] = w[h + "self_attn." + src + "." + kind]
        sd[g + "mlp.linear_fc1.weight"] = (w[h + "mlp.gate_proj.weight"], w[h + "mlp.up_proj.weight"])
        sd[g + "mlp.linear_fc2.weight"] = w[h + "mlp.down_proj.weight"]
    return sd


ROWS = ("linear_q_up_proj.weight", "linear_kv_up_proj.weight", "word_embeddings.weight", "output_layer.weight")
COLUMNS = ("linear_proj.weight", "linear_fc2.weight")
LINEARS = ("linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_kv_up_proj", "linear_proj",
           "core_attention.indexer.linear_wq_b", "core_attention.indexer.linear_wk",
           "core_attention.indexer.linear_weights_proj")


def rank_state_dict(c, whole, tp, r):
    sd = {}
    for name, t in whole.items():
        if name.endswith("linear_fc1.weight"):
            gate, up = t
            sd[name] = torch.cat([gate.chunk(tp)[r], up.chunk(tp)[r]]).float().clone()
        elif name.endswith(ROWS):
            sd[name] = t.chunk(tp)[r].float().clone()
        elif name.endswith(COLUMNS):
            sd[name] = t.chunk(tp, dim=1)[r].float().clone()
        else:  # norms, down projections and the indexer: duplicated
            sd[name] = t.float().clone()
    for i in range(c["num_hidden_layers"]):
        for linear in LINEARS:
            sd[f"decoder.layers.{i}.self_attention.{linear}._extra_state"] = None
        for linear in ("linear_fc1", "linear_fc2"):
            sd[f"decoder.layers.{i}.mlp.{linear}._extra_state"] = None
    sd["output_layer._extra_state"] = None
    return sd


def save_torch(root, rank_name, args, sd):
    d = os.path.join(root, "iter_%07d" % ITERATION, rank_name)
    os.makedirs(d, exist_ok=True)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": sd},
               os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def main():
    c = v32.CONFIG
    w = v32.load_safetensors(os.path.join(v32.OUT, "model.safetensors"))
    w = {k: t.float() for k, t in w.items()}
    whole = whole_state_dict(c, w)
    for tp in (1, 2):
        for r in range(tp):
            save_torch(os.path.join(OUT, f"tp{tp}"), "mp_rank_%02d" % r, megatron_args(c, tp),
                       rank_state_dict(c, whole, tp, r))
    print(f"megatron dsa: {len(whole)} tensors at TP 1 and 2 under {os.path.normpath(OUT)}")


if __name__ == "__main__":
    main()
