#!/usr/bin/env python3
"""Golden values for Gale's multi-latent attention from Hugging Face's DeepseekV3 (float64).

An independent implementation: transformers' DeepseekV3ForCausalLM (4.51.3; its DeepseekV3Attention
is DeepSeek's MLA with q_a_proj / q_a_layernorm / q_b_proj, kv_a_proj_with_mqa / kv_a_layernorm /
kv_b_proj, o_proj and the interleaved rope layout, rope_interleave=True), with a tiny random config
whose layers all have dense MLPs (first_k_dense_replace = num_layers). Its weights are mapped to
Megatron-Core names, and the script writes the weights, a batch, the logits, the mean token loss and
the gradient of that loss for every parameter to tests/data/golden/<variant>/fixture.json, read by
tests/golden/mla_golden_test.cc. Variants: mla_deepseek (plain RoPE on the rotary part) and
mla_deepseek_yarn (YaRN: factor 4, mscale 1, mscale_all_dim 0.8, original 4096 positions, betas 32/1,
Megatron's --rotary-scaling-factor 4 --mscale 1 --mscale-all-dim 0.8).

    /tmp/megvenv/bin/python tools/reference/mla_reference.py     # both fixtures, ~3 s
"""
import json
import os
import sys
import types

import torch

# transformers 4.51 expects torch >= 2 at import time (torch.distributed.tensor, torch.compiler, the
# float8 dtypes); the Debian torch 1.13 of /tmp/megvenv has none of them and the float64 eager path
# below uses none of them: inert stand-ins, only where torch lacks the name.
try:
    import torch.distributed.tensor  # noqa: F401
except ImportError:
    sys.modules["torch.distributed.tensor"] = types.ModuleType("torch.distributed.tensor")
if not hasattr(torch, "compiler"):
    torch.compiler = types.ModuleType("torch.compiler")
    torch.compiler.is_compiling = lambda: False
    torch.compiler.disable = lambda f=None, recursive=True: f if f else (lambda g: g)
    sys.modules["torch.compiler"] = torch.compiler
for _name in ["float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "uint16", "uint32", "uint64"]:
    if not hasattr(torch, _name):
        setattr(torch, _name, None)
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

torch.set_default_dtype(torch.float64)


def make_fixture(fixture_name, seed, yarn):
    """Writes tests/data/golden/<name>/fixture.json; yarn: None or (factor, mscale, mscale_all_dim)."""
    torch.manual_seed(seed)

    L, H, NH, F, V, S, B = 2, 16, 4, 20, 40, 9, 2
    Q_LORA, KV_LORA, DN, R, DV = 10, 8, 6, 4, 5
    EPS, BASE, MAXPOS = 1e-6, 10000.0, 16

    rope_scaling, maxpos_hf, yarn_args = None, MAXPOS, []
    if yarn:
        factor, mscale, mscale_all_dim = yarn
        # HF takes the factor as max_position_embeddings / original_max_position_embeddings.
        rope_scaling = {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": 4096,
                        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": mscale, "mscale_all_dim": mscale_all_dim}
        maxpos_hf = int(4096 * factor)
        yarn_args = ["--rotary-scaling-factor", str(factor), "--mscale", str(mscale), "--mscale-all-dim",
                     str(mscale_all_dim)]
    config = DeepseekV3Config(
        vocab_size=V, hidden_size=H, intermediate_size=F, moe_intermediate_size=F, num_hidden_layers=L,
        num_attention_heads=NH, num_key_value_heads=NH, n_shared_experts=1, n_routed_experts=4,
        kv_lora_rank=KV_LORA, q_lora_rank=Q_LORA, qk_rope_head_dim=R, v_head_dim=DV, qk_nope_head_dim=DN,
        n_group=1, topk_group=1, num_experts_per_tok=2, first_k_dense_replace=L, hidden_act="silu",
        max_position_embeddings=maxpos_hf, rms_norm_eps=EPS, tie_word_embeddings=False, rope_theta=BASE,
        rope_scaling=rope_scaling, rope_interleave=True, attention_bias=False, attention_dropout=0.0)
    config._attn_implementation = "eager"
    model = DeepseekV3ForCausalLM(config).double()
    model.eval()

    # Random weights (norm weights around 1, so that they matter), independent of HF's initialisation.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))


    def megatron_params():
        """Megatron-Core name -> (HF tensor or function of HF tensors, how to map it back)."""
        out = {"embedding.word_embeddings.weight": model.model.embed_tokens.weight,
               "decoder.final_layernorm.weight": model.model.norm.weight,
               "output_layer.weight": model.lm_head.weight}
        for i, layer in enumerate(model.model.layers):
            a = layer.self_attn
            p = f"decoder.layers.{i}."
            out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
            out[p + "self_attention.linear_q_down_proj.weight"] = a.q_a_proj.weight
            out[p + "self_attention.linear_q_up_proj.layer_norm_weight"] = a.q_a_layernorm.weight
            out[p + "self_attention.linear_q_up_proj.weight"] = a.q_b_proj.weight
            out[p + "self_attention.linear_kv_down_proj.weight"] = a.kv_a_proj_with_mqa.weight
            out[p + "self_attention.linear_kv_up_proj.layer_norm_weight"] = a.kv_a_layernorm.weight
            out[p + "self_attention.linear_kv_up_proj.weight"] = a.kv_b_proj.weight
            out[p + "self_attention.linear_proj.weight"] = a.o_proj.weight
            out[p + "pre_mlp_layernorm.weight"] = layer.post_attention_layernorm.weight
            out[p + "mlp.linear_fc1.weight"] = (layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight)  # SwiGLU [gate; up]
            out[p + "mlp.linear_fc2.weight"] = layer.mlp.down_proj.weight
        return out


    def value(t):
        return torch.cat(t, 0) if isinstance(t, tuple) else t


    def grad(t):
        return torch.cat([x.grad for x in t], 0) if isinstance(t, tuple) else t.grad


    tokens = torch.randint(0, V, (B, S))
    labels = torch.randint(0, V, (B, S))
    logits = model(input_ids=tokens).logits  # [B, S, V], causal
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))  # mean over B·S tokens
    loss.backward()

    params = megatron_params()
    fixture = {
        "about": "tools/reference/mla_reference.py: HF DeepseekV3ForCausalLM (transformers 4.51.3) in float64",
        "megatron_args": [
            "--num-layers", str(L), "--hidden-size", str(H), "--num-attention-heads", str(NH), "--ffn-hidden-size", str(F),
            "--seq-length", str(S), "--max-position-embeddings", str(MAXPOS), "--micro-batch-size", str(B),
            "--multi-latent-attention", "--q-lora-rank", str(Q_LORA), "--kv-lora-rank", str(KV_LORA),
            "--qk-head-dim", str(DN), "--qk-pos-emb-head-dim", str(R), "--v-head-dim", str(DV), "--qk-layernorm",
            "--position-embedding-type", "rope", "--rotary-base", str(int(BASE)), "--normalization", "RMSNorm",
            "--norm-epsilon", str(EPS), "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
            "--attention-dropout", "0", "--hidden-dropout", "0", "--vocab-size", str(V), "--make-vocab-size-divisible-by",
            "1", "--tokenizer-type", "NullTokenizer", "--train-iters", "1", "--lr", "0.001"] + yarn_args,
        "padded_vocab_size": V,
        "tokens": tokens.tolist(),
        "labels": labels.tolist(),
        "loss": loss.item(),
        "logits": {"shape": list(logits.shape), "data": logits.detach().reshape(-1).tolist()},
        "weights": {n: {"shape": list(value(t).shape), "data": value(t).detach().reshape(-1).tolist()}
                    for n, t in params.items()},
        "grads": {n: {"shape": list(grad(t).shape), "data": grad(t).reshape(-1).tolist()} for n, t in params.items()},
    }
    out_dir = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "golden", fixture_name)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "fixture.json"), "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
    print(f"{fixture_name}: loss {loss.item():.12f}; {sum(value(t).numel() for t in params.values())} parameters")


make_fixture("mla_deepseek", 20261201, None)
make_fixture("mla_deepseek_yarn", 20261202, (4.0, 1.0, 0.8))

