"""Tiny Megatron-LM GPT checkpoints in Megatron's legacy `torch` format, built with Megatron's own model.

Writes tests/data/megatron/ (the fixtures of tests/ckpt/megatron_* and tests/cli/convert_megatron_*):
  tp1/                      iter_0000007/mp_rank_00/model_optim_rng.pt, latest_checkpointed_iteration.txt "7"
  tp2pp2/                   iter_0000007/mp_rank_{00,01}_{000,001}/model_optim_rng.pt: the same weights as
                            Megatron shards them at TP 2, PP 2
  pp2vp2/                   iter_0000007/mp_rank_00_{000,001}/model_optim_rng.pt: PP 2 with 2 virtual
                            pipeline chunks ('model0', 'model1'; Megatron's interleaved layer order:
                            chunk 0 holds layers 0 | 1, chunk 1 layers 2 | 3 on stages 0 | 1)
  reference.json            tokens, labels, Megatron's logits and per-token losses for the tp1 weights
Run (Megatron-LM core_v0.12.1 source in MEGATRON_LM; torch >= 1.13 on CPU):
  MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 python3 tools/reference/megatron_ckpt_reference.py tests/data/megatron
  (Debian's torch 1.13 lacks torch.distributed._coalescing_manager, which Megatron imports but the
  CPU forward never calls: the script stubs it; PYTORCH_JIT=0 keeps torch 1.13's TorchScript away
  from Megatron's jit-decorated helpers.)
The model is Megatron's GPTModel with its local (non-Transformer-Engine) layer spec, built on CPU in a
one-process gloo group: 4 layers, hidden 32, 4 heads in 2 query groups, SwiGLU ffn 48, LayerNorm (torch 1.13 has no RMSNorm for Megatron's local spec),
RoPE, no biases, untied output layer, vocabulary 50 padded to 64. The checkpoint dicts are what
Megatron's generate_state_dict puts in them (args, checkpoint_version 3.0, iteration, model =
state_dict_for_save_checkpoint()); the TP2/PP2 shards are cut from the TP1 state dict the way
Megatron's layers split their parameters (column-parallel rows, row-parallel columns, SwiGLU's fc1
[gate; up] halves per rank, vocabulary rows), with each pipeline stage numbering its layers from 0.

With `--check-gale-written DIR` instead, torch.load()s every model_optim_rng.pt under DIR (a
checkpoint Gale wrote, e.g. `gale convert --load-model-type mg --save-model-type gale` of tp1/ and
back with `--save-model-type mg --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2`),
checks its weights against tp1/ after undoing the sharding, loads them into Megatron's GPTModel
with load_state_dict(strict=True) and checks the logits against reference.json.
"""
import argparse
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

if not hasattr(dist, "_coalescing_manager"):
    dist._coalescing_manager = None  # imported by Megatron's DDP buffer module, unused here
_new_group = dist.new_group


def _new_group_compat(*args, **kwargs):  # torch 1.13's new_group lacks use_local_synchronization
    kwargs.pop("use_local_synchronization", None)
    kwargs.pop("group_desc", None)
    return _new_group(*args, **kwargs)


dist.new_group = _new_group_compat
if not torch.cuda.is_available():  # Megatron's RoPE moves its frequencies to the current CUDA device
    torch.cuda.current_device = lambda: "cpu"
sys.path.insert(0, os.environ.get("MEGATRON_LM", "/tmp/meg"))

NUM_LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB, PADDED, SEQ = 4, 32, 4, 2, 48, 50, 64, 8
ITERATION = 7


def megatron_args(tp, pp):
    return argparse.Namespace(
        num_layers=NUM_LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        kv_channels=HIDDEN // HEADS, group_query_attention=True, num_query_groups=GROUPS,
        seq_length=16, max_position_embeddings=16, position_embedding_type="rope", add_position_embedding=False,
        rotary_base=10000, rotary_percent=1.0, rotary_interleaved=False, normalization="LayerNorm",
        norm_epsilon=1e-5, swiglu=True, untie_embeddings_and_output_weights=True, add_bias_linear=False,
        add_qkv_bias=False, apply_layernorm_1p=False, make_vocab_size_divisible_by=32, padded_vocab_size=PADDED,
        vocab_size=VOCAB, tokenizer_type="NullTokenizer", tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=None, transformer_impl="local",
        ckpt_format="torch", consumed_train_samples=56, consumed_valid_samples=0, skipped_train_samples=0,
        iteration=ITERATION, params_dtype=torch.float32, fp16=False, bf16=False)


def build_model():
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(1234)
    config = TransformerConfig(
        num_layers=NUM_LAYERS, hidden_size=HIDDEN, ffn_hidden_size=FFN, num_attention_heads=HEADS,
        num_query_groups=GROUPS, normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False)
    model = GPTModel(config, get_gpt_layer_local_spec(normalization="LayerNorm"), vocab_size=PADDED,
                     max_sequence_length=16, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False)
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():  # larger than Megatron's 0.02 init, so the logits depend on every weight
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    model.eval()
    # Dropout is 0; the CUDA RNG tracker Megatron forks around attention dropout has no CPU states.
    from megatron.core import tensor_parallel
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return model


def shard(sd, tp, pp, t, p):
    """Rank (t, p)'s legacy state dict, cut from the TP1/PP1 `sd` as Megatron's layers split it."""
    per_stage = NUM_LAYERS // pp
    out = {}
    for k, v in sd.items():
        if k.startswith("decoder.layers."):
            i = int(k.split(".")[2])
            if i // per_stage != p:
                continue
            k = "decoder.layers.%d.%s" % (i - p * per_stage, k.split(".", 3)[3])
        elif k.startswith("embedding.") and p != 0:
            continue
        elif (k.startswith("output_layer.") or k.startswith("decoder.final_layernorm")) and p != pp - 1:
            continue
        if not torch.is_tensor(v):
            pass  # `_extra_state` (None): every rank has it
        elif k.endswith("linear_fc1.weight"):
            gate, up = v.chunk(2, dim=0)
            v = torch.cat([gate.chunk(tp, 0)[t], up.chunk(tp, 0)[t]], 0)
        elif any(k.endswith(s) for s in ("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
            v = v.chunk(tp, 0)[t]
        elif any(k.endswith(s) for s in ("linear_proj.weight", "linear_fc2.weight")):
            v = v.chunk(tp, 1)[t]
        out[k] = v.clone() if torch.is_tensor(v) else v
    return out


def save_virtual(root, pp, vp, sd):
    """PP `pp` x `vp` virtual chunks at TP 1: chunk v of stage p holds global layers (v * pp + p) * n ..."""
    n = NUM_LAYERS // (pp * vp)
    for p in range(pp):
        d = os.path.join(root, "iter_%07d" % ITERATION, "mp_rank_00_%03d" % p)
        os.makedirs(d, exist_ok=True)
        args = megatron_args(1, pp)
        args.virtual_pipeline_model_parallel_size = vp
        state = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION}
        for v in range(vp):
            first = (v * pp + p) * n
            chunk = {}
            for k, t in sd.items():
                if k.startswith("decoder.layers."):
                    i = int(k.split(".")[2])
                    if first <= i < first + n:
                        chunk["decoder.layers.%d.%s" % (i - first, k.split(".", 3)[3])] = t
                elif k.startswith("embedding.") and p == 0 and v == 0:
                    chunk[k] = t
                elif not k.startswith(("decoder.layers.", "embedding.")) and p == pp - 1 and v == vp - 1:
                    chunk[k] = t
            state["model%d" % v] = chunk
        torch.save(state, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def save(root, tp, pp, sd):
    os.makedirs(root, exist_ok=True)
    for p in range(pp):
        for t in range(tp):
            name = "mp_rank_%02d" % t if pp == 1 else "mp_rank_%02d_%03d" % (t, p)
            d = os.path.join(root, "iter_%07d" % ITERATION, name)
            os.makedirs(d, exist_ok=True)
            state = {"args": megatron_args(tp, pp), "checkpoint_version": 3.0, "iteration": ITERATION,
                     "model": shard(sd, tp, pp, t, p)}
            torch.save(state, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def unshard(files):
    """{(t, p): state dict} -> the TP1/PP1 state dict (inverse of shard)."""
    tp = 1 + max(t for t, _ in files)
    pp = 1 + max(p for _, p in files)
    per_stage = NUM_LAYERS // pp
    out = {}
    for p in range(pp):
        keys = files[(0, p)].keys()
        for k in keys:
            parts = [files[(t, p)][k] for t in range(tp)]
            if not torch.is_tensor(parts[0]):
                v = parts[0]
            elif k.endswith("linear_fc1.weight"):
                halves = [x.chunk(2, 0) for x in parts]
                v = torch.cat([h[0] for h in halves] + [h[1] for h in halves], 0)
            elif any(k.endswith(s) for s in ("linear_qkv.weight", "word_embeddings.weight", "output_layer.weight")):
                v = torch.cat(parts, 0)
            elif any(k.endswith(s) for s in ("linear_proj.weight", "linear_fc2.weight")):
                v = torch.cat(parts, 1)
            else:
                v = parts[0]
            if k.startswith("decoder.layers."):
                i = int(k.split(".")[2]) + p * per_stage
                k = "decoder.layers.%d.%s" % (i, k.split(".", 3)[3])
            out[k] = v
    return out


def check_gale_written(gale_dir, fixtures):
    it = open(os.path.join(gale_dir, "latest_checkpointed_iteration.txt")).read().strip()
    base = os.path.join(gale_dir, "iter_%07d" % int(it))
    files = {}
    for name in sorted(os.listdir(base)):
        parts = name.split("_")
        t = int(parts[2])
        p = int(parts[3]) if len(parts) > 3 else 0
        state = torch.load(os.path.join(base, name, "model_optim_rng.pt"), map_location="cpu")
        assert state["checkpoint_version"] == 3.0, state["checkpoint_version"]
        assert state["args"].tensor_model_parallel_size == 1 + max(
            int(n.split("_")[2]) for n in os.listdir(base)), "tensor_model_parallel_size"
        files[(t, p)] = state["model"]
        print(name, "iteration", state["iteration"], "keys", len(state["model"]))
    ref = torch.load(os.path.join(fixtures, "tp1", "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt"))["model"]
    got = unshard(files)
    assert sorted(got) == sorted(ref), (sorted(set(got) ^ set(ref)))
    for k in ref:
        assert (got[k] is None and ref[k] is None) or torch.equal(got[k], ref[k]), k
    print("torch.load accepts", gale_dir, "and its", len(ref), "tensors equal the tp1 fixture's")
    # Megatron's own model takes the merged state dict strictly (as load_checkpoint's
    # load_state_dict does) and reproduces the recorded logits.
    model = build_model()
    model.load_state_dict(got, strict=True)
    r = json.load(open(os.path.join(fixtures, "reference.json")))
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        logits = model(torch.tensor([r["tokens"]]), torch.arange(SEQ).unsqueeze(0), mask)
    diff = (logits[0] - torch.tensor(r["logits"])).abs().max().item()
    assert diff == 0.0, diff
    print("Megatron's GPTModel.load_state_dict(strict=True) accepts it; logits equal reference.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--check-gale-written")
    a = ap.parse_args()
    if a.check_gale_written:
        check_gale_written(a.check_gale_written, a.out)
        return
    model = build_model()
    # As Megatron saves it: with the `_extra_state` entries (None) of its parallel linear layers.
    sd = dict(model.state_dict_for_save_checkpoint())
    tokens = torch.tensor([[3, 17, 42, 8, 0, 49, 25, 11]])
    labels = torch.tensor([[17, 42, 8, 0, 49, 25, 11, 30]])
    mask = torch.triu(torch.ones(1, 1, SEQ, SEQ, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        pos = torch.arange(SEQ).unsqueeze(0)
        logits = model(tokens, pos, mask)
        losses = model(tokens, pos, mask, labels=labels)
    save(os.path.join(a.out, "tp1"), 1, 1, sd)
    save(os.path.join(a.out, "tp2pp2"), 2, 2, sd)
    save_virtual(os.path.join(a.out, "pp2vp2"), 2, 2, sd)
    ref = {"tokens": tokens[0].tolist(), "labels": labels[0].tolist(), "vocab_size": VOCAB,
           "padded_vocab_size": PADDED, "loss": float(losses.float().mean()),
           "losses": [float(x) for x in losses[0]], "logits": [[float(x) for x in row] for row in logits[0]],
           "keys": sorted(k for k in sd if torch.is_tensor(sd[k])),
           "extra_state_keys": sorted(k for k in sd if not torch.is_tensor(sd[k]))}
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
    print("loss", ref["loss"], "keys", len(sd), "extra state", ref["extra_state_keys"][:6])


if __name__ == "__main__":
    main()
