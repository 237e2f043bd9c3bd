# The tiny dense DeepseekV3ForCausalLM fixture of `gale convert` (tests/data/hf/deepseek_v3_dense).
#
#   /tmp/megvenv/bin/python tools/reference/hf_fixture_deepseek_v3_dense.py                   # writes it
#   /tmp/megvenv/bin/python tools/reference/hf_fixture_deepseek_v3_dense.py --check-export DIR  # DIR from
#       `gale convert --save-model-type hf`: transformers' logits of it vs the fixture's (exit 1 above 1e-4)
#
# Same environment as hf_fixture_deepseek_v3.py (transformers 4.51.3 on torch 1.13, with its stand-ins).
# A 3-layer model with first_k_dense_replace 3 = num_hidden_layers: every layer has DeepseekV3MLP
# (intermediate_size), none has experts (transformers reads no expert key then; the saved config
# still holds DeepseekV3Config's defaults for them). MLA with a query latent, plain RoPE (no
# rope_scaling), untied embeddings. Writes config.json, model.safetensors and golden.safetensors
# (tokens, logits, loss, greedy) as hf_fixture.py does.
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture_deepseek_v3 as v3  # noqa: E402  (installs the torch 1.13 stand-ins, imports transformers)
import hf_fixture  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

NAME = "deepseek_v3_dense"


def config():
    c = transformers.DeepseekV3Config(
        vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=12, qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=6, first_k_dense_replace=3, hidden_act="silu", max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, rope_interleave=True, attention_bias=False,
        attention_dropout=0.0, tie_word_embeddings=False)
    c._attn_implementation = "eager"
    return c


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a directory written by `gale convert --save-model-type hf`")
    a = p.parse_args()
    if a.check_export:
        v3.NAME = NAME
        sys.exit(0 if v3.check_export(a.check_export) <= 1e-4 else 1)
    c = config()
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(c)
    for layer in model.model.layers:
        assert isinstance(layer.mlp, transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MLP)
    hf_fixture.perturb(model, seed=len(NAME))
    d = os.path.join(hf_fixture.OUT, NAME)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    model.save_pretrained(d, safe_serialization=True)
    tokens = torch.randint(0, c.vocab_size, (hf_fixture.SEQ,), generator=torch.Generator().manual_seed(7))
    model = transformers.DeepseekV3ForCausalLM(config())
    missing, unexpected = model.load_state_dict(hf_fixture.load_file(os.path.join(d, "model.safetensors")), strict=True)
    logits, loss = hf_fixture.golden(model, tokens)
    out = {"tokens": tokens.to(torch.int64), "logits": logits, "loss": loss,
           "greedy": hf_fixture.greedy(model, tokens).to(torch.int64)}
    hf_fixture.save_file(out, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})
    print(f"{NAME}: {sorted(os.listdir(d))} loss {loss.item():.6f} |logits| max {logits.abs().max().item():.3f}")


if __name__ == "__main__":
    main()
