# Tiny random Hugging Face models (GPT-2, Bloom, LLaMA, Qwen2, Mistral, Mixtral, Qwen2-MoE) and their logits: fixtures for
# `gale convert`.
#
# Run with a Python that has torch and transformers (the committed files came from Debian 12's
# /usr/bin/python3 3.11 + python3-torch 1.13 in a venv with transformers 4.40.2 and safetensors 0.8.0):
#
#   /usr/bin/python3 -m venv --system-site-packages /tmp/convvenv
#   /tmp/convvenv/bin/pip install transformers==4.40.2 safetensors==0.8.0
#   /tmp/convvenv/bin/python tools/reference/hf_fixture.py            # writes tests/data/hf/<name>/
#   /tmp/convvenv/bin/python tools/reference/hf_fixture.py --only mixtral   # one fixture
#   /tmp/convvenv/bin/python tools/reference/hf_fixture.py --check-export DIR --like tests/data/hf/llama
#
# Each tests/data/hf/<name>/ holds what save_pretrained writes (config.json, model.safetensors or
# model-0000k-of-0000n.safetensors + model.safetensors.index.json) and golden.safetensors:
#   tokens [S] i64  - the fixed input sequence
#   logits [S, V] f32 - the HF model's logits for it (eval mode, fp32 compute)
#   loss [1] f32    - HF's causal-LM loss with labels = tokens (mean over the S-1 shifted targets)
#   greedy [5] i64  - the 5 tokens greedy decoding appends to `tokens` (argmax, no stop token)
#   logits_gelu_new [S, V] f32 - gpt2 only: the same weights with activation_function gelu_new
# The weights are random but far from the default init (norm weights around 1, biases nonzero), so
# that a wrong mapping of any tensor changes the logits. --check-export loads a directory written by
# `gale convert --save-model-type hf` with transformers and compares its logits on the same tokens
# with the fixture's. The DeepSeek-V3 fixture needs transformers >= 4.51: tools/reference/hf_fixture_deepseek_v3.py.
import argparse
import copy
import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import save_file, load_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf")
SEQ = 12


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("bias"):
                p.copy_(0.2 * noise)
            elif p.dim() == 1:  # norm weights
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.15 * noise)


def configs():
    common = dict(attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0)
    return {
        # exact-erf GeLU ("gelu"), the GeLU Gale computes; real GPT-2 uses "gelu_new" (tanh approximation)
        "gpt2": (transformers.GPT2LMHeadModel,
                 transformers.GPT2Config(vocab_size=100, n_positions=32, n_embd=64, n_layer=2, n_head=4, n_inner=128,
                                         activation_function="gelu", layer_norm_epsilon=1e-5, **common),
                 torch.float32, None),
        # Bloom: ALiBi, word_embeddings_layernorm, fused per-head query_key_value, tanh GeLU, tied;
        # seq_length is an extra key Gale reads as the trained length. (Written with torch 2.5.1 and
        # transformers 4.46.3 from PyPI; transformers 5 needs torch >= 2.6 for Bloom.)
        "bloom": (transformers.BloomForCausalLM,
                  transformers.BloomConfig(vocab_size=100, hidden_size=48, n_layer=2, n_head=4, layer_norm_epsilon=1e-5,
                                           hidden_dropout=0.0, attention_dropout=0.0, seq_length=32),
                  torch.float32, None),
        "llama": (transformers.LlamaForCausalLM,
                  transformers.LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           rms_norm_eps=1e-6, rope_theta=1000.0, tie_word_embeddings=False),
                  torch.float32, "200KB"),
        "qwen2": (transformers.Qwen2ForCausalLM,
                  transformers.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                           rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                                           use_sliding_window=False),
                  torch.bfloat16, None),
        "mistral": (transformers.MistralForCausalLM,
                    transformers.MistralConfig(vocab_size=100, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
                                               rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=None,
                                               tie_word_embeddings=False),
                    torch.float16, None),
        # Mixtral: softmax over all experts, top-k, renormalised over the k = Megatron's default
        # (top-k of the logits, softmax over the k); 4 experts, top-2; sharded like llama.
        "mixtral": (transformers.MixtralForCausalLM,
                    transformers.MixtralConfig(vocab_size=100, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                               rms_norm_eps=1e-5, rope_theta=1000000.0, sliding_window=None,
                                               num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
                                               tie_word_embeddings=False),
                    torch.float32, "150KB"),
        # Qwen2-MoE: q/k/v biases, layer 0 dense (intermediate_size), layer 1 sparse (decoder_sparse_step
        # 2): 4 experts, top-2, softmax over all experts without renormalisation (norm_topk_prob false =
        # --moe-router-pre-softmax), a shared expert gated by sigmoid(shared_expert_gate(x)).
        "qwen2_moe": (transformers.Qwen2MoeForCausalLM,
                      transformers.Qwen2MoeConfig(vocab_size=100, hidden_size=64, intermediate_size=96,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                                  tie_word_embeddings=False, use_sliding_window=False,
                                                  decoder_sparse_step=2, moe_intermediate_size=32,
                                                  shared_expert_intermediate_size=48, num_experts=4,
                                                  num_experts_per_tok=2, norm_topk_prob=False,
                                                  router_aux_loss_coef=0.001),
                      torch.float32, None),
    }


def golden(model, tokens):
    model = model.float().eval()
    with torch.no_grad():
        out = model(tokens.unsqueeze(0), labels=tokens.unsqueeze(0))
    return out.logits[0].contiguous(), out.loss.reshape(1).float()


def greedy(model, tokens, n=5):
    ids = tokens.unsqueeze(0)
    with torch.no_grad():
        for _ in range(n):
            nxt = model(ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.reshape(1, 1)], dim=1)
    return ids[0, tokens.numel():].contiguous()


def make(name, cls, config, dtype, shard):
    torch.manual_seed(0)
    model = cls(config)
    perturb(model, seed=len(name))
    model = model.to(dtype)  # the stored precision; the golden run widens those exact values to fp32
    d = os.path.join(OUT, name)
    beam = os.path.join(d, "beam.json")  # tools/reference/beam_reference.py's output stays
    beam_text = open(beam).read() if os.path.exists(beam) else None
    shutil.rmtree(d, ignore_errors=True)
    kw = {"safe_serialization": True}
    if shard:
        kw["max_shard_size"] = shard
    model.save_pretrained(d, **kw)
    tokens = torch.randint(0, config.vocab_size, (SEQ,), generator=torch.Generator().manual_seed(7))
    # Reload in fp32, as a user would: the stored weights widen exactly, and buffers such as RoPE's
    # inv_freq are computed afresh in fp32 (model.to(bf16) would have rounded them).
    model = cls.from_pretrained(d, torch_dtype=torch.float32)
    logits, loss = golden(model, tokens)
    out = {"tokens": tokens.to(torch.int64), "logits": logits, "loss": loss,
           "greedy": greedy(model, tokens).to(torch.int64)}
    if name == "gpt2":  # the same weights with GPT-2's own tanh GeLU (Gale's --openai-gelu)
        tanh_config = copy.deepcopy(config)
        tanh_config.activation_function = "gelu_new"
        tanh_model = cls.from_pretrained(d, config=tanh_config, torch_dtype=torch.float32)
        out["logits_gelu_new"] = golden(tanh_model, tokens)[0]
    save_file(out, os.path.join(d, "golden.safetensors"), metadata={"format": "pt"})
    if beam_text is not None:
        with open(beam, "w") as f:
            f.write(beam_text)
    print(f"{name}: {sorted(os.listdir(d))} loss {loss.item():.6f} |logits| max {logits.abs().max().item():.3f}")


def check_export(export_dir, like):
    g = load_file(os.path.join(like, "golden.safetensors"))
    model = transformers.AutoModelForCausalLM.from_pretrained(export_dir, torch_dtype=torch.float32)
    logits, loss = golden(model, g["tokens"])
    v = g["logits"].shape[1]
    err = (logits[:, :v] - g["logits"]).abs().max().item()
    print(f"{export_dir}: {type(model).__name__} vocab {logits.shape[1]} max |logit diff| {err:.3g} "
          f"loss {loss.item():.6f} vs {g['loss'].item():.6f}")
    return err


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--check-export", help="a Hugging Face directory written by `gale convert`")
    p.add_argument("--like", help="the fixture directory whose golden logits it must reproduce")
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--only", help="write this one fixture (gpt2, bloom, llama, qwen2, mistral, mixtral, qwen2_moe)")
    a = p.parse_args()
    if a.check_export:
        sys.exit(0 if check_export(a.check_export, a.like) <= a.tolerance else 1)
    for name, (cls, config, dtype, shard) in configs().items():
        if a.only is None or a.only == name:
            make(name, cls, config, dtype, shard)


if __name__ == "__main__":
    main()
