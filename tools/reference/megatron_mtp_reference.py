"""A tiny Megatron-LM GPT checkpoint with multi-token-prediction layers, built with Megatron's own model.

Writes tests/data/megatron/mtp/ (the fixture of tests/train/megatron_mtp_checkpoint_test.cc):
  tp1/                 iter_0000007/mp_rank_00/model_optim_rng.pt + latest_checkpointed_iteration.txt "7":
                       Megatron core_v0.12.1's GPTModel (the model of megatron_ckpt_reference.py: 4 layers,
                       hidden 32, 4 heads in 2 query groups, SwiGLU, LayerNorm, RoPE, untied output layer,
                       vocabulary 50 padded to 64) with --mtp-num-layers 2 (get_gpt_mtp_block_spec, local
                       spec), state_dict_for_save_checkpoint() as Megatron saves it: mtp.layers.<k>.enorm,
                       hnorm, eh_proj, transformer_layer.*, final_layernorm and their `_extra_state` entries
  reference.json       tokens, labels and Megatron's per-depth MTP losses sum(mask * loss_k) / sum(mask)
                       (MTPLossLoggingHelper's tracker after one training-mode forward)
Run (Megatron-LM core_v0.12.1 source in MEGATRON_LM; torch >= 1.13 on CPU; `packaging` importable):
  MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 python3 tools/reference/megatron_mtp_reference.py tests/data/megatron/mtp
With `--check-gale-written DIR` instead: torch.load()s DIR's TP 1 x PP 1 rank file (a checkpoint Gale wrote
of the fixture), checks its keys, kinds and tensors equal the fixture's and that Megatron's GPTModel with the
MTP block takes it with load_state_dict(strict=True) and gives the recorded MTP losses.
"""
import argparse
import importlib.util
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("megatron_ckpt_reference", os.path.join(HERE, "megatron_ckpt_reference.py"))
base = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base)  # its torch 1.13 shims and MEGATRON_LM path

import torch  # noqa: E402

MTP_LAYERS = 2


def build_model():
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_config import TransformerConfig
    import contextlib
    import torch.distributed as dist

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
    config = TransformerConfig(
        num_layers=base.NUM_LAYERS, hidden_size=base.HIDDEN, ffn_hidden_size=base.FFN, num_attention_heads=base.HEADS,
        num_query_groups=base.GROUPS, normalization="LayerNorm", layernorm_epsilon=1e-5, gated_linear_unit=True,
        activation_func=torch.nn.functional.silu, add_bias_linear=False, hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, mtp_num_layers=MTP_LAYERS, mtp_loss_scaling_factor=0.1)
    spec = get_gpt_layer_local_spec(normalization="LayerNorm")
    model = GPTModel(config, spec, vocab_size=base.PADDED, max_sequence_length=16, position_embedding_type="rope",
                     share_embeddings_and_output_weights=False,
                     mtp_block_spec=get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False))
    g = torch.Generator().manual_seed(77)
    with torch.no_grad():  # larger than Megatron's 0.02 init, so the losses depend on every weight
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    tensor_parallel.get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()
    return model


def mtp_losses(model, tokens, labels):
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper
    MTPLossLoggingHelper.tracker.clear()
    model.train()  # the tracker is written in training forwards (dropout is 0)
    S = len(tokens)
    mask = torch.triu(torch.ones(1, 1, S, S, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        model(torch.tensor([tokens]), torch.arange(S).unsqueeze(0), mask, labels=torch.tensor([labels]))
    return [float(v) for v in MTPLossLoggingHelper.tracker["values"]]


def check_gale_written(gale_dir, fixture):
    it = open(os.path.join(gale_dir, "latest_checkpointed_iteration.txt")).read().strip()
    state = torch.load(os.path.join(gale_dir, "iter_%07d" % int(it), "mp_rank_00", "model_optim_rng.pt"))
    ref = torch.load(os.path.join(fixture, "tp1", "iter_%07d" % base.ITERATION, "mp_rank_00", "model_optim_rng.pt"))
    got, want = state["model"], ref["model"]
    assert sorted(got) == sorted(want), sorted(set(got) ^ set(want))
    for k in want:
        assert (got[k] is None and want[k] is None) or torch.equal(got[k], want[k]), k
    assert state["args"].mtp_num_layers == MTP_LAYERS, state["args"].mtp_num_layers
    model = build_model()
    model.load_state_dict(got, strict=True)
    r = json.load(open(os.path.join(fixture, "reference.json")))
    losses = mtp_losses(model, r["tokens"], r["labels"])
    assert losses == r["mtp_losses"], (losses, r["mtp_losses"])
    print("Megatron's GPTModel (MTP block) loads", gale_dir, "strictly; MTP losses", losses, "as recorded")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--check-gale-written")
    a = ap.parse_args()
    if a.check_gale_written:
        return check_gale_written(a.check_gale_written, a.out)
    model = build_model()
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, base.VOCAB, (base.SEQ + 1,), generator=g).tolist()
    inputs, labels = tokens[:-1], tokens[1:]
    losses = mtp_losses(model, inputs, labels)
    sd = model.state_dict_for_save_checkpoint()
    args = base.megatron_args(1, 1)
    args.mtp_num_layers = MTP_LAYERS
    args.mtp_loss_scaling_factor = 0.1
    d = os.path.join(a.out, "tp1", "iter_%07d" % base.ITERATION, "mp_rank_00")
    os.makedirs(d, exist_ok=True)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": base.ITERATION, "model": sd},
               os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(a.out, "tp1", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(base.ITERATION))
    with open(os.path.join(a.out, "reference.json"), "w") as f:
        json.dump({"tokens": inputs, "labels": labels, "mtp_losses": losses}, f, indent=1)
    print("wrote", a.out, "with", sum(torch.is_tensor(v) for v in sd.values()), "tensors; MTP losses", losses)


if __name__ == "__main__":
    main()
