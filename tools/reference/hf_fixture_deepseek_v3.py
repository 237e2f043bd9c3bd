# The tiny DeepseekV3ForCausalLM fixture of `gale convert` (tests/data/hf/deepseek_v3), from transformers 4.51.
#
#   /tmp/megvenv/bin/python tools/reference/hf_fixture_deepseek_v3.py                   # writes the fixture
#   /tmp/megvenv/bin/python tools/reference/hf_fixture_deepseek_v3.py --check-export DIR  # DIR from
#       `gale convert --save-model-type hf`: transformers' logits of it vs the fixture's (exit 1 above 1e-4)
#
# transformers 4.40 (hf_fixture.py's other fixtures) has no DeepSeek-V3, so this one runs with
# /tmp/megvenv (transformers 4.51.3 on Debian's torch 1.13; the inert stand-ins below fill the torch
# names 4.51 imports but the fp32 eager path never uses, as tools/reference/mla_reference.py does).
# It writes what hf_fixture.py writes (config.json, model.safetensors, golden.safetensors with tokens,
# logits, loss and greedy) for a 3-layer model: layer 0 dense (first_k_dense_replace 1), layers 1-2
# with 8 routed experts in 2 groups (topk_group 1, top-2: HF's group score, the sum of the top 2 of
# a group, is Megatron's sum of the top k/topk_group), one shared expert, sigmoid scores with a
# nonzero e_score_correction_bias, routed_scaling_factor 2.5, MLA with a query latent and YaRN
# (factor 4 = 16384 / 4096 positions, mscale 1, mscale_all_dim 0.8, betas 32 / 1). The script
# checks that the correction bias changes the chosen experts of some tokens, so a converter that
# dropped it would miss the golden logits.
import argparse
import json
import os
import sys
import types

import torch

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import transformers  # noqa: E402
import hf_fixture  # noqa: E402

NAME = "deepseek_v3"


def config():
    c = transformers.DeepseekV3Config(
        vocab_size=100, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8,
        qk_rope_head_dim=4, v_head_dim=6, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=2,
        n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=1,
        hidden_act="silu", max_position_embeddings=16384, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8},
        rope_interleave=True, attention_bias=False, attention_dropout=0.0, tie_word_embeddings=False)
    c._attn_implementation = "eager"
    return c


def bias_changes_routing(model, tokens):
    """Whether some token of `tokens` picks other experts in some MoE layer without the correction bias."""
    changed = 0
    hooks = []

    def hook(router, inputs, output):
        nonlocal changed
        saved = router.e_score_correction_bias.clone()
        router.e_score_correction_bias.zero_()
        without, _ = router.forward(inputs[0])  # forward, not __call__: no hook recursion
        router.e_score_correction_bias.copy_(saved)
        changed += int((output[0].sort(-1)[0] != without.sort(-1)[0]).any(-1).sum())

    for layer in model.model.layers[1:]:
        hooks.append(layer.mlp.gate.register_forward_hook(hook))
    with torch.no_grad():
        model(tokens.unsqueeze(0))
    for h in hooks:
        h.remove()
    return changed


def check_export(d):
    """transformers' logits of the DeepSeek-V3 in `d` (config.json + model.safetensors) on the fixture's
    tokens, against the fixture's; returns the largest difference. (from_pretrained needs torch >= 2.)"""
    keys = json.load(open(os.path.join(d, "config.json")))
    keys.pop("architectures", None)
    c = transformers.DeepseekV3Config(**keys)
    c._attn_implementation = "eager"
    model = transformers.DeepseekV3ForCausalLM(c)
    model.load_state_dict(hf_fixture.load_file(os.path.join(d, "model.safetensors")),
                          strict=not c.tie_word_embeddings)
    g = hf_fixture.load_file(os.path.join(hf_fixture.OUT, NAME, "golden.safetensors"))
    logits, loss = hf_fixture.golden(model, g["tokens"])
    err = (logits - g["logits"]).abs().max().item()
    print(f"{d}: max |logit diff| {err:.3g}, loss {loss.item():.6f} vs {g['loss'].item():.6f}")
    return err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a directory written by `gale convert --save-model-type hf`")
    a = p.parse_args()
    if a.check_export:
        sys.exit(0 if check_export(a.check_export) <= 1e-4 else 1)
    c = config()
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(c)
    hf_fixture.perturb(model, seed=len(NAME))
    g = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            # sigmoid scores lie in (0, 1); biases of ±0.15 reorder close experts without making any
            # σ + b negative (HF masks the groups it drops with 0, Megatron with -inf: the same
            # choice while every σ + b is positive)
            layer.mlp.gate.e_score_correction_bias.copy_(0.15 * torch.randn(c.n_routed_experts, generator=g))
    d = os.path.join(hf_fixture.OUT, NAME)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    model.save_pretrained(d, safe_serialization=True)
    tokens = torch.randint(0, c.vocab_size, (hf_fixture.SEQ,), generator=torch.Generator().manual_seed(7))
    # Reloaded from the saved file (from_pretrained needs torch >= 2): what a reader of it computes.
    model = transformers.DeepseekV3ForCausalLM(config())
    missing, unexpected = model.load_state_dict(hf_fixture.load_file(os.path.join(d, "model.safetensors")), strict=False)
    if unexpected or any(not k.endswith("lm_head.weight") or c.tie_word_embeddings is False for k in missing):
        sys.exit(f"model.safetensors does not hold the model: missing {missing}, unexpected {unexpected}")
    changed = bias_changes_routing(model, tokens)
    if changed == 0:
        sys.exit("the correction bias changes no routing decision: pick another seed")
    logits, loss = hf_fixture.golden(model, tokens)
    out = {"tokens": tokens.to(torch.int64), "logits": logits, "loss": loss,
           "greedy": hf_fixture.greedy(model, tokens).to(torch.int64)}
    hf_fixture.save_file(out, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})
    print(f"{NAME}: {sorted(os.listdir(d))} loss {loss.item():.6f} |logits| max {logits.abs().max().item():.3f}; "
          f"the correction bias changes {changed} (token, layer) routing choices")


if __name__ == "__main__":
    main()
