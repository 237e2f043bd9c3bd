#!/usr/bin/env python3
"""Float64 reference of Megatron-LM main's MuP (--use-mup) for tests/train/mup_test.cc and the golden fixtures.

Written from Megatron-Core's formulas (TransformerConfig.__post_init__'s use_mup block,
mup_scaled_init_method_normal, LanguageModelEmbedding / LanguageModule._scale_logits,
get_mup_config_overrides), not from its code:

  m = hidden_size / mup_base_hidden_size                  (base default: hidden_size)
  softmax_scale = (sqrt(mup_base_head_dim) or 1) / kv_channels ** mup_attn_scale_power
  output multiplier: mup_output_mult, its default 1.0 becoming 1/m when m != 1
  init: hidden weights N(0, sigma/sqrt(m)); output projections N(0, sigma/sqrt(2L)/sqrt(m));
        the embedding module's weights and an untied output layer N(0, sigma)
  optimizer (m != 1), vector-like = the embedding module's parameters, the output layer, 1-D tensors:
    Adam:  the other ("hidden") parameters lr x 1/m and eps x 1/m
    SGD:   vector-like lr x m (with --decoupled-lr not the word embedding / output layer)
    other (Lion, Muon): hidden lr x 1/m, no eps; Muon's own matrices are left out

gpt_reference.py imports these functions for its MuP golden configurations (gpt_mup, gpt_mup_sgd,
llama_mup). Run alone, this script writes tests/data/reference/mup/mup.json (from the repository root):
    /tmp/venv/bin/python tools/reference/mup_reference.py      (gpt_reference.py's environment)
"""
import json
import math
import os
import sys

EMBEDDING_OR_OUTPUT = ("embedding.word_embeddings.weight", "output_layer.weight")


def width_mult(m):
    """hidden_size / mup_base_hidden_size (1 without --use-mup)."""
    if not m.get("use_mup"):
        return 1.0
    return m["hidden_size"] / m.get("mup_base_hidden_size", m["hidden_size"])


def output_mult(m):
    if not m.get("use_mup"):
        return 1.0
    om, w = m.get("mup_output_mult", 1.0), width_mult(m)
    return 1.0 / w if om == 1.0 and w != 1.0 else om


def softmax_scale(m):
    HD = m["kv_channels"]
    if not m.get("use_mup"):
        return 1.0 / math.sqrt(HD)
    base = math.sqrt(m["mup_base_head_dim"]) if m.get("mup_base_head_dim") is not None else 1.0
    return base / HD ** m.get("mup_attn_scale_power", 1.0)


def embedding_class(name):
    """The embedding module's parameters and the output layer's weight (is_embedding_parameter)."""
    return name.startswith("embedding.") or name == "output_layer.weight"


def vector_like(name, ndim):
    return embedding_class(name) or ndim <= 1


def muon_managed(name, ndim, optimizer):
    """Megatron's Muon matrices: 2-D, not the word embedding nor the output layer."""
    return "muon" in optimizer and ndim == 2 and name not in EMBEDDING_OR_OUTPUT


def lr_mult(name, ndim, m, optimizer, decoupled=False):
    """The multiplier of a parameter's max_lr and min_lr (1: the base group)."""
    w = width_mult(m)
    if w == 1.0:
        return 1.0
    keeps_decoupled = decoupled and name in EMBEDDING_OR_OUTPUT
    if optimizer == "sgd":
        return w if vector_like(name, ndim) and not keeps_decoupled else 1.0
    if vector_like(name, ndim) or muon_managed(name, ndim, optimizer) or keeps_decoupled:
        return 1.0
    return 1.0 / w


def eps_mult(name, ndim, m, optimizer):
    w = width_mult(m)
    if w == 1.0 or "adam" not in optimizer or vector_like(name, ndim) or muon_managed(name, ndim, optimizer):
        return 1.0
    return 1.0 / w


def init_std(name, kind, m):
    """The N(0, std) of a weight ("weight" or "output_weight" kind); None for norms and biases."""
    sigma = m["init_method_std"]
    if kind == "weight" and embedding_class(name):
        return sigma
    hidden = sigma / math.sqrt(width_mult(m))
    if kind == "weight":
        return hidden
    if kind == "output_weight":
        return hidden / math.sqrt(2.0 * m["num_layers"])
    return None


def main():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpt_reference as g  # parameter names, shapes and kinds (docs/model.md's table)

    # A model wide enough for sampled standard deviations (the smallest matrix has 64 x 128 elements).
    base = dict(g.COMMON_MODEL, num_layers=3, hidden_size=128, num_attention_heads=4, num_query_groups=4,
                group_query_attention=False, kv_channels=32, ffn_hidden_size=256, tokenizer_vocab_size=250,
                make_vocab_size_divisible_by=64, max_position_embeddings=64, init_method_std=0.05)
    gpt = dict(base, position_embedding_type="learned_absolute", normalization="LayerNorm", swiglu=False,
               add_bias_linear=True, untie_embeddings_and_output_weights=True)
    model = dict(gpt, use_mup=True, mup_base_hidden_size=32)
    params = [(n, list(shape), kind) for n, shape, kind in g.parameter_specs(model)]
    out = {"generator": "tools/reference/mup_reference.py",
           "model_flags": ["--num-layers", "3", "--hidden-size", "128", "--num-attention-heads", "4",
                           "--ffn-hidden-size", "256", "--max-position-embeddings", "64", "--seq-length", "16",
                           "--init-method-std", "0.05", "--untie-embeddings-and-output-weights"],
           "init": {"flags": ["--use-mup", "--mup-base-hidden-size", "32"],
                    "width_mult": width_mult(model),
                    "std": {n: init_std(n, kind, model) for n, _, kind in params if init_std(n, kind, model)}},
           "scales": [], "optimizer_groups": []}
    # Softmax scale, output multiplier and width multiplier of several flag sets (kv_channels 32).
    cases = [({}, []),
             (dict(mup_base_hidden_size=32), ["--mup-base-hidden-size", "32"]),
             (dict(mup_base_hidden_size=64, mup_output_mult=0.3), ["--mup-base-hidden-size", "64",
                                                                   "--mup-output-mult", "0.3"]),
             (dict(mup_base_head_dim=16.0, mup_attn_scale_power=0.5), ["--mup-base-head-dim", "16",
                                                                       "--mup-attn-scale-power", "0.5"]),
             (dict(mup_base_hidden_size=256, mup_base_head_dim=8.0, mup_attn_scale_power=0.75,
                   mup_embedding_mult=3.0), ["--mup-base-hidden-size", "256", "--mup-base-head-dim", "8",
                                             "--mup-attn-scale-power", "0.75", "--mup-embedding-mult", "3"])]
    for extra, flags in cases:
        mm = dict(model, mup_base_hidden_size=128, **extra) if "mup_base_hidden_size" not in extra else dict(model, **extra)
        out["scales"].append({"flags": ["--use-mup"] + flags, "width_mult": width_mult(mm),
                              "softmax_scale": softmax_scale(mm), "output_mult": output_mult(mm),
                              "embedding_mult": mm.get("mup_embedding_mult", 1.0)})
    out["scales"].append({"flags": [], "width_mult": 1.0, "softmax_scale": softmax_scale(gpt), "output_mult": 1.0,
                          "embedding_mult": 1.0})
    for optimizer in ("adam", "sgd", "lion", "muon"):
        for decoupled in (False, True):
            out["optimizer_groups"].append({
                "optimizer": optimizer, "decoupled_lr": decoupled, "flags": ["--use-mup", "--mup-base-hidden-size", "32"],
                "group_lr_mult": width_mult(model) if optimizer == "sgd" else 1.0 / width_mult(model),
                "group_eps_mult": 1.0 / width_mult(model) if "adam" in optimizer else 1.0,
                "lr_mult": {n: lr_mult(n, len(shape), model, optimizer, decoupled) for n, shape, _ in params},
                "eps_mult": {n: eps_mult(n, len(shape), model, optimizer) for n, shape, _ in params}})
    # Self-checks of the formulas against hand-computed values.
    assert width_mult(model) == 4.0 and output_mult(model) == 0.25
    assert softmax_scale(dict(model, mup_base_head_dim=16.0, mup_attn_scale_power=0.5)) == 4.0 / math.sqrt(32)
    assert init_std("decoder.layers.0.mlp.linear_fc2.weight", "output_weight", model) == 0.05 / 2 / math.sqrt(6)
    assert lr_mult("decoder.layers.0.self_attention.linear_qkv.weight", 2, model, "adam") == 0.25
    assert lr_mult("decoder.layers.0.self_attention.linear_qkv.bias", 1, model, "sgd") == 4.0
    assert lr_mult("embedding.word_embeddings.weight", 2, model, "sgd", decoupled=True) == 1.0
    assert lr_mult("embedding.position_embeddings.weight", 2, model, "sgd", decoupled=True) == 4.0
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../tests/data/reference/mup/mup.json")
    with open(os.path.normpath(path), "w") as f:
        f.write(g.compact_json(out) + "\n")
    print(f"wrote {os.path.normpath(path)}: {len(out['init']['std'])} init stds, {len(out['scales'])} scale cases, "
          f"{len(out['optimizer_groups'])} optimizer groupings")


if __name__ == "__main__":
    main()
