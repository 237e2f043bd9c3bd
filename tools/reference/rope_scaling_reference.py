# Llama 3 RoPE scaling: transformers' inverse frequencies for Gale's --use-rope-scaling test.
#
#   /tmp/megvenv/bin/python tools/reference/rope_scaling_reference.py   # transformers 4.51.3
#
# Writes tests/data/reference/rope/llama3_inv_freq.json: for a few (head dim, rope_theta, factor)
# cases, the inv_freq transformers computes with rope_scaling {"rope_type": "llama3", factor,
# low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192}, and without.
import json
import os

import torch
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference", "rope",
                   "llama3_inv_freq.json")
cases = []
for head_dim, theta, factor in [(128, 500000.0, 8.0), (64, 500000.0, 32.0), (16, 10000.0, 8.0)]:
    config = transformers.LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, rope_theta=theta,
                                      max_position_embeddings=131072,
                                      rope_scaling={"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 8192})
    inv, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plain, _ = ROPE_INIT_FUNCTIONS["default"](config, "cpu")
    cases.append({"head_dim": head_dim, "rope_theta": theta, "factor": factor,
                  "inv_freq": [float(x) for x in inv.tolist()], "plain_inv_freq": [float(x) for x in plain.tolist()]})
with open(OUT, "w") as f:
    json.dump({"transformers": transformers.__version__, "cases": cases}, f, indent=1)
    f.write("\n")
print(OUT, [len(c["inv_freq"]) for c in cases])
