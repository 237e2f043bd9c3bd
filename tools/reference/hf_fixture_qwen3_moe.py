# The tiny Qwen3MoeForCausalLM fixture (tests/data/hf/qwen3_moe) for `gale convert`, from transformers 5.x.
#
#   python3 -m venv /tmp/hfyarn && /tmp/hfyarn/bin/pip install torch transformers==5.25.0 safetensors
#   /tmp/hfyarn/bin/python tools/reference/hf_fixture_qwen3_moe.py            # writes tests/data/hf/qwen3_moe/
#   /tmp/hfyarn/bin/python tools/reference/hf_fixture_qwen3_moe.py --check-export DIR   # a `gale convert` export
#
# Qwen3-MoE is Qwen3's attention (no q/k/v bias; q_norm/k_norm, RMSNorm over head_dim on every query
# and key head before RoPE; head_dim 24 here is not hidden_size / num_attention_heads = 16) with
# sparse MoE blocks without a shared expert: a router mlp.gate [E, H], softmax over the E experts,
# the top k, renormalised over the k (norm_topk_prob true, as Qwen3-30B-A3B / 235B-A22B; Megatron's
# default routing), and E SwiGLU experts. Layer 1 is dense (mlp_only_layers [1]: Qwen3MoeMLP with
# intermediate_size), layers 0 and 2 sparse. transformers 5.x computes with fused expert tensors
# (experts.gate_up_proj [E, 2F, H], experts.down_proj [E, H, F]) but save_pretrained writes the
# Hub's per-expert names (mlp.experts.j.{gate,up,down}_proj.weight): this script checks that the
# saved file holds those, and that config.json names the expert count num_local_experts (5.x's
# attribute map; the Hub's configs say num_experts). Writes what hf_fixture.py writes (config.json,
# model.safetensors, golden.safetensors with tokens, logits, loss and greedy).
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402

NAME = "qwen3_moe"


def config():
    return transformers.Qwen3MoeConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                       max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                       tie_word_embeddings=False, use_sliding_window=False, decoder_sparse_step=1,
                                       mlp_only_layers=[1], moe_intermediate_size=32, num_experts=4,
                                       num_experts_per_tok=2, norm_topk_prob=True, router_aux_loss_coef=0.001)


def check_saved_layout(d):
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.mlp.experts.3.gate_proj.weight" in names, sorted(names)
    assert not any("gate_up_proj" in n for n in names), "transformers wrote fused experts"
    assert "model.layers.1.mlp.gate_proj.weight" in names  # the dense layer
    cfg = json.load(open(os.path.join(d, "config.json")))
    print(f"{NAME}: per-expert tensor names; config.json expert count key(s): "
          f"{[k for k in ('num_experts', 'num_local_experts') if k in cfg]}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a Hugging Face directory written by `gale convert`")
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    if a.check_export:
        err = hf_fixture.check_export(a.check_export, os.path.join(hf_fixture.OUT, NAME))
        sys.exit(0 if err <= a.tolerance else 1)
    hf_fixture.make(NAME, transformers.Qwen3MoeForCausalLM, config(), torch.float32, None)
    check_saved_layout(os.path.join(hf_fixture.OUT, NAME))


if __name__ == "__main__":
    main()
