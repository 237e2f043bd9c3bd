# The tiny GptOssForCausalLM fixture (tests/data/hf/gpt_oss) for `gale convert`, made by transformers itself.
#
#   /usr/bin/python3 -m venv --system-site-packages /tmp/venv_gptoss
#   /tmp/venv_gptoss/bin/pip install torch==2.6.0 transformers==4.57.1 safetensors
#   /tmp/venv_gptoss/bin/python tools/reference/hf_fixture_gpt_oss.py            # writes tests/data/hf/gpt_oss/
#   /tmp/venv_gptoss/bin/python tools/reference/hf_fixture_gpt_oss.py --check-export DIR   # a `gale convert` export
#
# gpt-oss (transformers' models/gpt_oss): attention with q/k/v/o biases, GQA and head_dim 24 (not
# hidden_size / num_attention_heads), one learned sink logit per head (self_attn.sinks, appended to
# every row's softmax and dropped), layer_types alternating sliding_attention (window
# sliding_window) and full_attention, YaRN RoPE (rope_scaling with truncate false), RMSNorm, and in
# every layer a mixture of experts: a router with a bias (mlp.router.weight [E, H], .bias [E]), the
# top k of the logits softmaxed over the k, and E experts stored fused and transposed relative to
# nn.Linear: experts.gate_up_proj [E, H, 2F] whose columns interleave gate (::2) and up (1::2),
# gate_up_proj_bias [E, 2F], down_proj [E, F, H], down_proj_bias [E, H]; the expert activation is
# (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g) with g = clamp(gate, max=7) (transformers 4.55 to
# 4.57 hard-code the limit 7.0 and alpha 1.702; config.json's swiglu_limit is the original model's).
# The weights are stored in bf16 (gpt-oss's unquantized precision); the expert gate_up weights are
# large enough that the clamp at 7 is active. Writes config.json, model.safetensors and
# golden.safetensors (tokens, logits, loss, greedy: tools/reference/hf_fixture.py's layout).
# --check-export loads a `gale convert --save-model-type hf` directory in transformers and
# compares its logits on the fixture's tokens with the golden ones.
import argparse
import json
import os
import sys

import torch
import transformers
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402

NAME = "gpt_oss"


def config():
    c = transformers.GptOssConfig(vocab_size=100, hidden_size=64, intermediate_size=32, num_hidden_layers=3,
                                  num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_local_experts=4,
                                  num_experts_per_tok=2, sliding_window=4, rope_theta=10000.0,
                                  max_position_embeddings=1024, rms_norm_eps=1e-5, tie_word_embeddings=False,
                                  router_aux_loss_coef=0.9,
                                  rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                                "beta_slow": 1.0, "truncate": False,
                                                "original_max_position_embeddings": 256},
                                  swiglu_limit=7.0)
    c._attn_implementation = "eager"
    return c


def check_saved(d):
    with safe_open(os.path.join(d, "model.safetensors"), "pt") as f:
        names = set(f.keys())
        shape = f.get_slice("model.layers.0.mlp.experts.gate_up_proj").get_shape()
    for n in ("model.layers.0.self_attn.sinks", "model.layers.0.mlp.router.bias",
              "model.layers.0.mlp.experts.gate_up_proj_bias", "model.layers.0.mlp.experts.down_proj_bias",
              "model.layers.0.self_attn.o_proj.bias", "lm_head.weight"):
        assert n in names, (n, sorted(names))
    assert list(shape) == [4, 64, 64], shape
    cfg = json.load(open(os.path.join(d, "config.json")))
    print(f"{NAME}: {len(names)} tensors, layer_types {cfg['layer_types']}, swiglu_limit {cfg.get('swiglu_limit')}")


def check_clamp_active(model, tokens):
    hits = []
    handle = model.model.layers[0].post_attention_layernorm.register_forward_hook(lambda m, i, o: hits.append(o))
    with torch.no_grad():
        model(tokens.unsqueeze(0))
    handle.remove()
    x = hits[0].reshape(-1, 64)
    e = model.model.layers[0].mlp.experts
    gu = torch.einsum("th,ehf->etf", x, e.gate_up_proj) + e.gate_up_proj_bias[:, None, :]
    print(f"{NAME}: layer 0 expert pre-activations beyond the limit 7: {(gu.abs() > 7).float().mean().item():.2%}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a Hugging Face directory written by `gale convert`")
    p.add_argument("--tolerance", type=float, default=1e-4)
    a = p.parse_args()
    if a.check_export:
        err = hf_fixture.check_export(a.check_export, os.path.join(hf_fixture.OUT, NAME))
        sys.exit(0 if err <= a.tolerance else 1)
    orig = hf_fixture.perturb
    cls = transformers.GptOssForCausalLM
    # hf_fixture.make perturbs with its own seed; give it gpt-oss's perturbation (larger expert weights)
    hf_fixture.perturb = lambda model, seed: (orig(model, seed), perturb_experts(model))
    hf_fixture.make(NAME, cls, config(), torch.bfloat16, None)
    hf_fixture.perturb = orig
    d = os.path.join(hf_fixture.OUT, NAME)
    check_saved(d)
    model = cls.from_pretrained(d, torch_dtype=torch.float32, attn_implementation="eager").eval()
    g = hf_fixture.load_file(os.path.join(d, "golden.safetensors"))
    check_clamp_active(model, g["tokens"])


def perturb_experts(model):
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("experts.gate_up_proj"):  # |gate|, |up| often beyond 7: the clamps matter
                p.copy_(0.6 * torch.randn(p.shape, generator=g))


if __name__ == "__main__":
    main()
