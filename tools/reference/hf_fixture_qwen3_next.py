# The tiny Qwen3NextForCausalLM fixture (tests/data/hf/qwen3_next) for `gale convert`, from transformers 5.x.
#
#   python3 -m venv /tmp/hfyarn && /tmp/hfyarn/bin/pip install torch transformers==5.25.0 safetensors
#   /tmp/hfyarn/bin/python tools/reference/hf_fixture_qwen3_next.py     # writes tests/data/hf/qwen3_next/
#
# Qwen3-Next: layers of Gated DeltaNet linear attention (linear_attn: in_proj_qkvz grouped per key
# head [q | k | v | z], in_proj_ba grouped per key head [b | a], a depthwise causal conv1d, A_log,
# dt_bias, a gated RMSNorm with a plain weight, out_proj) and every full_attention_interval-th layer
# gated full attention (q_proj rows per head [query | gate], q_norm / k_norm, partial RoPE on the
# first partial_rotary_factor of each head); zero-centred RMSNorms (scale 1 + w) everywhere else;
# MoE blocks of Qwen2-MoE's shape (softmax top-k, renormalised with norm_topk_prob, a shared
# expert times sigmoid(shared_expert_gate)). Here: 3 layers with full_attention_interval 2 (layers
# 0 and 2 GDN, layer 1 full attention), layer 2 dense (mlp_only_layers [2]), stored in bf16 (as the
# released checkpoints). The golden logits, loss and greedy tokens are computed in float64 from those
# bf16 values by transformers' torch fallbacks (torch_chunk_gated_delta_rule, the torch causal conv;
# experts_implementation "eager"): the chunked delta rule in fp32 is 2.1e-4 off the float64 logits
# here, more than the 1e-4 the conversion tests allow, while Gale's sequential fp32 recurrence is
# within it. Writes what hf_fixture.py writes (golden.safetensors in f32).
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402


def config():
    return transformers.Qwen3NextConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                        max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
                                        partial_rotary_factor=0.25, full_attention_interval=2,
                                        linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8,
                                        linear_num_key_heads=2, linear_num_value_heads=4, decoder_sparse_step=1,
                                        mlp_only_layers=[2], moe_intermediate_size=32,
                                        shared_expert_intermediate_size=48, num_experts=4, num_experts_per_tok=2,
                                        norm_topk_prob=True, router_aux_loss_coef=0.001, tie_word_embeddings=False)


def main():
    hf_fixture.make("qwen3_next", transformers.Qwen3NextForCausalLM, config(), torch.bfloat16, None)
    d = os.path.join(hf_fixture.OUT, "qwen3_next")
    fp32 = load_file(os.path.join(d, "golden.safetensors"))
    model = transformers.Qwen3NextForCausalLM.from_pretrained(d, torch_dtype=torch.float64,
                                                              experts_implementation="eager").eval()
    tokens = fp32["tokens"]
    with torch.no_grad():
        out = model(tokens.unsqueeze(0), labels=tokens.unsqueeze(0))
    logits = out.logits[0].float().contiguous()
    print(f"qwen3_next: fp32 (chunked delta rule) vs float64 logits: {(fp32['logits'] - logits).abs().max().item():.3g}")
    golden = {"tokens": tokens, "logits": logits, "loss": out.loss.reshape(1).float(),
              "greedy": hf_fixture.greedy(model, tokens).to(torch.int64)}
    save_file(golden, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})


if __name__ == "__main__":
    main()
