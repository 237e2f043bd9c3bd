# Tiny random Qwen3ForCausalLM fixture (tests/data/hf/qwen3) for `gale convert`: hf_fixture.py's format.
#
# Qwen3 needs transformers >= 4.51, which /tmp/convvenv (4.40.2, hf_fixture.py's) lacks; the
# committed files came from /tmp/megvenv: Debian's torch 1.13 + transformers 4.51.3 (safetensors 0.8.0):
#
#   /tmp/megvenv/bin/python tools/reference/qwen3_fixture.py      # writes tests/data/hf/qwen3/
#   /tmp/megvenv/bin/python tools/reference/qwen3_fixture.py --check-export DIR   # a `gale convert` export
#
# Qwen3 is Qwen2 without q/k/v biases plus q_norm/k_norm: RMSNorm over head_dim on every query and
# key head before RoPE (Megatron-Core's q_layernorm/k_layernorm); head_dim 24 here is not
# hidden_size / num_attention_heads (16), so it needs --kv-channels.
import os
import sys
import types

import torch

# transformers 4.51 expects torch >= 2 at import time (as tools/reference/mla_reference.py):
# inert stand-ins for the names torch 1.13 lacks; the fp32 eager path uses none of them.
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

import transformers  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_fixture  # noqa: E402
from safetensors.torch import load_file  # noqa: E402


class Qwen3ForCausalLM(transformers.Qwen3ForCausalLM):
    """transformers' model, loaded without from_pretrained's accelerate path (it needs torch >= 2):
    built in fp32 from config.json, then the stored tensors widened to fp32 (the tied lm_head stays
    the embedding)."""

    @classmethod
    def from_pretrained(cls, d, torch_dtype=torch.float32, **kw):
        model = cls(transformers.Qwen3Config.from_pretrained(d))
        state = {}
        for f in sorted(os.listdir(d)):
            if f.startswith("model") and f.endswith(".safetensors"):
                state.update({k: v.to(torch_dtype) for k, v in load_file(os.path.join(d, f)).items()})
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
        return model.to(torch_dtype).eval()


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--check-export":
        transformers.AutoModelForCausalLM = Qwen3ForCausalLM  # check_export's loader
        like = os.path.join(hf_fixture.OUT, "qwen3")
        sys.exit(0 if hf_fixture.check_export(sys.argv[2], like) <= 1e-4 else 1)
    config = transformers.Qwen3Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=24,
                                      max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                      tie_word_embeddings=True, attention_bias=False, use_sliding_window=False)
    config._attn_implementation = "eager"
    hf_fixture.make("qwen3", Qwen3ForCausalLM, config, torch.bfloat16, None)


if __name__ == "__main__":
    main()
