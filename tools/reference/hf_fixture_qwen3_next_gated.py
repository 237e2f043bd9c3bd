# The tiny Qwen3NextForCausalLM fixture without Gated DeltaNet layers (tests/data/hf/qwen3_next_gated):
# every layer gated full attention, the target of `gale convert --save-model-type hf` for a model with
# --attention-output-gate and no --experimental-attention-variant.
#
#   /tmp/venv_gptoss/bin/python tools/reference/hf_fixture_qwen3_next_gated.py                   # writes it
#   /tmp/venv_gptoss/bin/python tools/reference/hf_fixture_qwen3_next_gated.py --check-export DIR  # DIR from
#       `gale convert --save-model-type hf`: transformers' logits of it vs the fixture's (exit 1 above 1e-4)
#
# (transformers 4.57.1 with torch 2.6.0 from PyPI, as hf_fixture_gpt_oss.py.) 2 layers, layer_types
# ["full_attention", "full_attention"]: q_proj rows per head [query | gate] (output times
# sigmoid(gate)), q_norm / k_norm, partial RoPE (partial_rotary_factor 0.25 of head_dim 16), zero-centred
# RMSNorms (1 + w); layer 0 a MoE block (4 experts top-2, norm_topk_prob, a shared expert times
# sigmoid(shared_expert_gate)), layer 1 dense (mlp_only_layers [1]); fp32, untied. Writes config.json,
# model.safetensors and golden.safetensors (tokens, logits, loss, greedy) as hf_fixture.py does.
# use_cache false: transformers 4.57.1's Qwen3NextDynamicCache looks for the last linear_attention layer
# and fails without one (5.25's cache has no such lookup); the forward itself needs no cache.
import argparse
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402

NAME = "qwen3_next_gated"


def config():
    return transformers.Qwen3NextConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                                        partial_rotary_factor=0.25,
                                        layer_types=["full_attention", "full_attention"],
                                        decoder_sparse_step=1, mlp_only_layers=[1], moe_intermediate_size=32,
                                        shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                        norm_topk_prob=True, router_aux_loss_coef=0.001, tie_word_embeddings=False,
                                        use_cache=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a directory written by `gale convert --save-model-type hf`")
    a = p.parse_args()
    if a.check_export:
        err = hf_fixture.check_export(a.check_export, os.path.join(hf_fixture.OUT, NAME))
        sys.exit(0 if err <= 1e-4 else 1)
    c = config()
    hf_fixture.make(NAME, transformers.Qwen3NextForCausalLM, c, torch.float32, None)
    model = transformers.Qwen3NextForCausalLM.from_pretrained(os.path.join(hf_fixture.OUT, NAME))
    kinds = [type(layer.self_attn).__name__ if hasattr(layer, "self_attn") else "linear" for layer in model.model.layers]
    mlps = [type(layer.mlp).__name__ for layer in model.model.layers]
    print(NAME, kinds, mlps)
    assert kinds == ["Qwen3NextAttention"] * 2 and mlps[1] == "Qwen3NextMLP" and mlps[0] != "Qwen3NextMLP"


if __name__ == "__main__":
    main()
