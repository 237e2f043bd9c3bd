# Golden output of Megatron main's report_theoretical_memory (megatron/training/theoretical_memory_usage.py,
# run as it is, its two helpers stubbed) for tests/train/theoretical_memory_test.cc.
#
#   git --git-dir /path/to/Megatron-LM/.git show HEAD:megatron/training/theoretical_memory_usage.py > /tmp/tmu.py
#   python3 tools/reference/theoretical_memory_reference.py /tmp/tmu.py > tests/data/reference/theoretical_memory.json
#
# Each case: the arguments Megatron reads (their Megatron names), the number of micro-batches, and the
# printed lines (verbose=True, as training_log calls it on rank 0) and the returned megabytes (weight and
# optimizer, activation, total).
import contextlib
import io
import json
import sys
import types

source = open(sys.argv[1]).read().replace("from .utils import is_hybrid_model, print_rank_0", "")
module = types.ModuleType("tmu")
module.is_hybrid_model = lambda args: args.is_hybrid_model
module.print_rank_0 = print
exec(compile(source, "theoretical_memory_usage.py", "exec"), module.__dict__)

BASE = dict(
    num_layers=4, hidden_size=256, ffn_hidden_size=1024, num_attention_heads=8, kv_channels=32,
    group_query_attention=False, num_query_groups=1, seq_length=512, micro_batch_size=2, padded_vocab_size=50304,
    swiglu=False, normalization="LayerNorm", untie_embeddings_and_output_weights=False, add_bias_linear=True,
    num_experts=None, moe_layer_freq=1, moe_ffn_hidden_size=None, moe_router_topk=2,
    moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False, moe_latent_size=None,
    mtp_num_layers=None, multi_latent_attention=False, q_lora_rank=None, kv_lora_rank=32, qk_head_dim=128,
    qk_pos_emb_head_dim=64, v_head_dim=128, tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
    virtual_pipeline_model_parallel_size=None, expert_tensor_parallel_size=1, expert_model_parallel_size=1,
    world_size=1, data_parallel_size=1, use_distributed_optimizer=False, sequence_parallel=False,
    recompute_granularity=None, is_hybrid_model=False)

CASES = [
    ("gpt_dense", {}, 1),
    ("llama_tp2_pp2_distopt", dict(swiglu=True, normalization="RMSNorm", group_query_attention=True,
                                   num_query_groups=2, ffn_hidden_size=688, untie_embeddings_and_output_weights=True,
                                   add_bias_linear=False, tensor_model_parallel_size=2,
                                   pipeline_model_parallel_size=2, world_size=8, data_parallel_size=2,
                                   use_distributed_optimizer=True), 1),
    ("untied_tp2_sp_selective", dict(untie_embeddings_and_output_weights=True, tensor_model_parallel_size=2,
                                     world_size=2, sequence_parallel=True, recompute_granularity="selective"), 4),
    ("moe_mtp_vpp", dict(swiglu=True, normalization="RMSNorm", num_experts=8, moe_layer_freq=[0, 1, 1, 1],
                         moe_ffn_hidden_size=128, moe_router_topk=2, moe_shared_expert_intermediate_size=256,
                         moe_shared_expert_gate=True, mtp_num_layers=1, add_bias_linear=False,
                         tensor_model_parallel_size=2, pipeline_model_parallel_size=2,
                         virtual_pipeline_model_parallel_size=2, expert_model_parallel_size=2, world_size=16,
                         data_parallel_size=4, use_distributed_optimizer=True, sequence_parallel=True,
                         recompute_granularity="selective"), 8),
    ("moe_freq2_pp2", dict(num_experts=4, moe_layer_freq=2, moe_ffn_hidden_size=512, moe_router_topk=1,
                           pipeline_model_parallel_size=2, expert_model_parallel_size=2, world_size=4,
                           data_parallel_size=2), 4),
    ("mla_q_lora", dict(multi_latent_attention=True, q_lora_rank=64, kv_lora_rank=32, qk_head_dim=32,
                        qk_pos_emb_head_dim=16, v_head_dim=32, normalization="RMSNorm", swiglu=True), 1),
    ("mla_direct_q", dict(multi_latent_attention=True, q_lora_rank=None, kv_lora_rank=32, qk_head_dim=32,
                          qk_pos_emb_head_dim=16, v_head_dim=32, normalization="RMSNorm"), 1),
    ("hybrid", dict(is_hybrid_model=True), 1),
]

out = []
for name, over, microbatches in CASES:
    args = dict(BASE)
    args.update(over)
    ns = types.SimpleNamespace(**args)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        mb = module.report_theoretical_memory(ns, num_microbatches=microbatches, verbose=True)
    lines = buf.getvalue().split("\n")
    assert lines[-1] == ""
    out.append(dict(name=name, args=args, num_microbatches=microbatches, lines=lines[:-1],
                    megabytes=list(mb) if mb is not None else None))
print(json.dumps(out, indent=1))
