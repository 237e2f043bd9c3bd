# The tiny Qwen2ForCausalLM fixture with rope_scaling yarn (tests/data/hf/qwen2_yarn), from transformers 5.x.
#
#   python3 -m venv /tmp/hfyarn && /tmp/hfyarn/bin/pip install torch transformers==5.25.0 safetensors
#   /tmp/hfyarn/bin/python tools/reference/hf_fixture_yarn.py
#
# transformers 4.40 (hf_fixture.py's other fixtures) has no YaRN for Qwen2; 5.x computes it in
# modeling_rope_utils._compute_yarn_parameters, which Gale's `gale convert` follows (factor as given,
# original_max_position_embeddings, betas, truncate, attention factor m(factor, 1)). The model is
# hf_fixture.py's qwen2 in fp32 with rope_theta 100 and rope_scaling {"type": "yarn", "factor": 4,
# "original_max_position_embeddings": 16, "beta_slow": 0.25}, so that the 8 frequencies of each
# 16-wide head are kept (i = 0), blended (1..4) and interpolated (5..7), and cos/sin carry the
# attention factor 0.1 ln 4 + 1. Writes what hf_fixture.py writes (config.json, model.safetensors,
# golden.safetensors with tokens, logits, loss and greedy).
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402


def main():
    config = transformers.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, rope_theta=100.0, tie_word_embeddings=True,
                                      use_sliding_window=False,
                                      rope_scaling={"type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 16, "beta_slow": 0.25})
    hf_fixture.make("qwen2_yarn", transformers.Qwen2ForCausalLM, config, torch.float32, None)


if __name__ == "__main__":
    main()
