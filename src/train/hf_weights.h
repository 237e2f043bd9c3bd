// The tensor map between Hugging Face and Gale (Megatron-Core) parameter names and layouts (docs/formats/hf-conversion.md).
//
// HF -> Gale, per layer i (LLaMA family; GPT-2 below):
//   model.embed_tokens.weight [V, H]             -> embedding.word_embeddings.weight [Vp, H] (last row repeated)
//   model.layers.i.input_layernorm.weight        -> decoder.layers.i.input_layernorm.weight
//   self_attn.{q,k,v}_proj.{weight,bias}         -> self_attention.linear_qkv.{weight,bias}: rows regrouped per KV
//                                                   group [q heads of the group; k; v] (Megatron's layout)
//   self_attn.{q,k}_norm.weight [HD] (Qwen3)     -> self_attention.{q,k}_layernorm.weight
//   self_attn.o_proj.weight                      -> self_attention.linear_proj.weight
//   post_attention_layernorm.weight              -> pre_mlp_layernorm.weight
//   mlp.gate_proj, mlp.up_proj                   -> mlp.linear_fc1.weight = [gate; up]
//   mlp.down_proj                                -> mlp.linear_fc2.weight
//   model.norm.weight                            -> decoder.final_layernorm.weight
//   lm_head.weight (untied)                      -> output_layer.weight [Vp, H]
// Mixtral replaces the MLP of every layer by its experts (E experts, Fe = intermediate_size):
//   block_sparse_moe.gate.weight [E, H]          -> mlp.router.weight
//   block_sparse_moe.experts.j.{w1,w3} [Fe, H]   -> mlp.experts.local_experts.j.linear_fc1.weight = [w1; w3]
//   block_sparse_moe.experts.j.w2 [H, Fe]        -> mlp.experts.local_experts.j.linear_fc2.weight
// Qwen2-MoE (q/k/v biases as Qwen2) in its sparse layers (the others: the dense MLP above):
//   mlp.gate.weight [E, H]                       -> mlp.router.weight
//   mlp.experts.j.{gate,up}_proj, down_proj      -> mlp.experts.local_experts.j.linear_fc1 = [gate; up], linear_fc2
//   mlp.shared_expert.{gate,up}_proj, down_proj  -> mlp.shared_experts.linear_fc1 = [gate; up], linear_fc2
//   mlp.shared_expert_gate.weight [1, H]         -> mlp.shared_experts.gate_weight
// Qwen3-MoE (Qwen3's attention with q_norm/k_norm) in its sparse layers: Qwen2-MoE's router and experts, no
// shared expert (transformers 5.x also saves the per-expert names, though it computes with fused
// [E, 2Fe, H] / [E, H, Fe] expert tensors).
// Qwen3-Next (both ways; r = NV / NK value heads per key head): Gated DeltaNet layers
//   input_layernorm.weight                       -> self_attention.in_proj.layer_norm_weight (both 1 + w)
//   linear_attn.in_proj_qkvz [per key head: q DK; k DK; v r·DV; z r·DV], in_proj_ba [per key head: b r; a r]
//                                                -> self_attention.in_proj.weight [q; k; v; z; b; a] (Megatron's
//                                                   sections, each in head order)
//   linear_attn.conv1d.weight [C, 1, K]          -> self_attention.conv1d.weight [C, K]
//   linear_attn.{dt_bias, A_log}, out_proj       -> self_attention.{dt_bias, A_log}, out_proj.weight
//   linear_attn.norm.weight (a plain scale)      -> self_attention.out_norm.weight − 1 (zero-centred)
// gated full-attention layers
//   input_layernorm.weight                       -> self_attention.linear_qkv.layer_norm_weight
//   self_attn.q_proj [per head: query HD; gate HD], k_proj, v_proj
//                                                -> self_attention.linear_qkv.weight, per query group
//                                                   [q heads; gate heads; k; v] (--attention-output-gate)
//   self_attn.{q,k}_norm, o_proj                 -> self_attention.{q,k}_layernorm, linear_proj
// and post_attention_layernorm -> pre_mlp_layernorm (MoE layers, Qwen2-MoE's tensors) or
// mlp.linear_fc1.layer_norm_weight (dense layers); the files' mtp.* layers are left out.
// Without GDN layers (--attention-output-gate alone) Gale's layer is the plain GPT one: the two norms are
// input_layernorm.weight and pre_mlp_layernorm.weight.
// DeepSeek-V3 (MLA; tensors copied row for row, both sides store DeepSeek's layouts and rotate q_pe /
// k_pe interleaved):
//   self_attn.q_a_proj [Cq, H], q_a_layernorm [Cq], q_b_proj [NH·(Dn+R), Cq]
//                                                -> self_attention.linear_q_down_proj, linear_q_up_proj.layer_norm_weight,
//                                                   linear_q_up_proj
//   self_attn.kv_a_proj_with_mqa [Ckv+R, H] ([latent; k_pe]), kv_a_layernorm [Ckv], kv_b_proj [NH·(Dn+Dv), Ckv]
//                                                -> linear_kv_down_proj, linear_kv_up_proj.layer_norm_weight,
//                                                   linear_kv_up_proj
//   self_attn.o_proj [H, NH·Dv]                  -> self_attention.linear_proj
//   layers < first_k_dense_replace: mlp.{gate,up,down}_proj as LLaMA; the others:
//   mlp.gate.weight [E, H], mlp.gate.e_score_correction_bias [E] -> mlp.router.weight, mlp.router.expert_bias
//   mlp.experts.j.*, mlp.shared_experts.*        -> mlp.experts.local_experts.j.linear_fc1 = [gate; up], linear_fc2,
//                                                   mlp.shared_experts.linear_fc1 = [gate; up], linear_fc2
//   multi-token prediction (num_nextn_predict_layers D, --mtp-num-layers D), MTP layer k < D stored as
//   HF layer L + k (L = num_hidden_layers):
//   model.layers.{L+k}.enorm, hnorm [H]          -> mtp.layers.k.enorm.weight, hnorm.weight
//   model.layers.{L+k}.eh_proj.weight [H, 2H]    -> mtp.layers.k.eh_proj.weight (input [enorm(emb) | hnorm(h)]
//                                                   on both sides: copied as is)
//   model.layers.{L+k}.shared_head.norm.weight   -> mtp.layers.k.final_layernorm.weight
//   model.layers.{L+k}.{input_layernorm, self_attn.*, post_attention_layernorm, mlp.*}
//                                                -> mtp.layers.k.transformer_layer.* (as a MoE decoder layer)
//   model.layers.{L+k}.embed_tokens.weight, shared_head.head.weight: copies of model.embed_tokens.weight
//                                                   and lm_head.weight (Gale's MTP layers share the main
//                                                   ones): checked on import, written on export
// gpt-oss (every layer MoE; HF's experts are fused and stored [in, out], transposed relative to nn.Linear):
//   self_attn.{q,k,v}_proj.{weight,bias}         -> self_attention.linear_qkv.{weight,bias} (grouped per KV group)
//   self_attn.o_proj.{weight,bias}               -> self_attention.linear_proj.{weight,bias}
//   self_attn.sinks [NH]                         -> self_attention.core_attention.softmax_offset (--softmax-type learnable)
//   mlp.router.{weight [E, H], bias [E]}         -> mlp.router.{weight, bias} (Megatron's router bias, --add-bias-linear)
//   mlp.experts.gate_up_proj [E, H, 2Fe]         -> mlp.experts.local_experts.j.linear_fc1.weight [2Fe, H] =
//                                                   [gate; up] with gate = columns 0, 2, 4, ... of expert j's
//                                                   [H, 2Fe], up = columns 1, 3, ..., each transposed
//   mlp.experts.gate_up_proj_bias [E, 2Fe]       -> ...j.linear_fc1.bias = [even entries; odd entries]
//   mlp.experts.down_proj [E, Fe, H], down_proj_bias [E, H]
//                                                -> ...j.linear_fc2.weight [H, Fe] (transposed), linear_fc2.bias
//   input_layernorm, post_attention_layernorm    -> input_layernorm, pre_mlp_layernorm; model.norm, lm_head as LLaMA
// InternLM2 (both ways; LLaMA's block under other names):
//   model.tok_embeddings, model.norm, output     -> embedding.word_embeddings, decoder.final_layernorm, output_layer
//   attention_norm, ffn_norm                     -> input_layernorm, pre_mlp_layernorm
//   attention.wqkv [(NH + 2 KV)·HD, H]           -> self_attention.linear_qkv.weight as is (InternLM2 already
//                                                   groups it per KV group: [q heads of the group; k; v])
//   attention.wo, feed_forward.w1 / w3, w2       -> linear_proj, mlp.linear_fc1 = [w1 (gate); w3 (up)], linear_fc2
// Phi-3 (both ways; LLaMA's names otherwise):
//   self_attn.qkv_proj [q NH·HD; k KV·HD; v KV·HD] -> self_attention.linear_qkv.weight (regrouped per KV group)
//   mlp.gate_up_proj [gate F; up F]              -> mlp.linear_fc1.weight as is
// Gemma-2 (both ways; LLaMA's names, q/k/v regrouped, its four norms onto Gale's --post-norm layer):
//   input_layernorm.weight                       -> input_layernorm.weight (before the attention)
//   post_attention_layernorm.weight              -> post_attn_norm.weight (on the attention output; not
//                                                   pre_mlp_layernorm as in LLaMA)
//   pre_feedforward_layernorm.weight             -> pre_mlp_layernorm.weight (before the MLP)
//   post_feedforward_layernorm.weight            -> post_mlp_layernorm.weight (on the MLP output)
//   self_attn.{q,k}_norm.weight [HD] (Gemma-3)   -> self_attention.{q,k}_layernorm.weight (--qk-layernorm)
// Baichuan2-7B (both ways; LLaMA's names otherwise):
//   self_attn.W_pack [q H; k H; v H]             -> self_attention.linear_qkv.weight (regrouped per head)
//   lm_head (a NormHead) [V, H]                  -> output_layer.weight: each row divided by its L2 norm on the
//                                                   way in (what Baichuan's forward uses), as is on the way back
// ChatGLM3 / GLM-4 (both ways):
//   transformer.embedding.word_embeddings, transformer.encoder.final_layernorm, transformer.output_layer
//                                                -> embedding.word_embeddings, decoder.final_layernorm, output_layer
//   transformer.encoder.layers.i.input_layernorm, post_attention_layernorm -> input_layernorm, pre_mlp_layernorm
//   self_attention.query_key_value.{weight,bias} [q NH·HD; k G·HD; v G·HD] -> linear_qkv (regrouped per group)
//   self_attention.dense, mlp.dense_h_to_4h [gate; up], mlp.dense_4h_to_h -> linear_proj, linear_fc1, linear_fc2
//   transformer.rotary_pos_emb.inv_freq (unread by the forward) left out; written back as 1/10000^(2i/(HD/2))
// HF's q/k rows use the rotate-half RoPE convention, which is Gale's (docs/model.md), so q/k rows
// are copied without a permutation. GPT-2's Conv1D weights are stored [in, out] and are transposed;
// c_attn's columns [q | k | v] are regrouped per head.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "train/hf_config.h"

namespace gale {

struct NamedTensor {
  std::string name;
  Tensor tensor;  // f32, or bf16 when the mapping was asked to store bf16
};

// Reads tensor `name`, which must have exactly `shape`, as f32.
using TensorSource = std::function<StatusOr<Tensor>(const std::string& name, const Shape& shape)>;

// Gale's tensors (whole, global shapes, padded vocabulary) from the HF tensors `hf` provides.
// Each output is converted to `store` (f32 or bf16) as soon as it is made, so the outputs held at
// once take 2 bytes per parameter in bf16; only copies are made, so bf16 sources stay exact.
StatusOr<std::vector<NamedTensor>> gale_tensors_from_hf(const HfModel& m, const TensorSource& hf,
                                                        DType store = DType::kF32);

// HF's tensors (padded vocabulary rows dropped; no lm_head.weight when tied) from Gale's, in `store`.
StatusOr<std::vector<NamedTensor>> hf_tensors_from_gale(const HfModel& m, const TensorSource& gale,
                                                        DType store = DType::kF32);

// DeepSeek-V3's per-MTP-layer copies of shared tensors, {copy, original}: model.layers.{L+k}.embed_tokens.weight
// of model.embed_tokens.weight and model.layers.{L+k}.shared_head.head.weight of lm_head.weight (of
// model.embed_tokens.weight when tied), for the k < m.mtp_layers converted. gale_tensors_from_hf does
// not read them; the caller checks that each equals its original.
std::vector<std::pair<std::string, std::string>> hf_mtp_shared_copies(const HfModel& m);

// Whether an HF tensor that no mapping reads may be left behind: buffers some files carry
// (rotary_emb.inv_freq, GPT-2's attn.bias / attn.masked_bias masks), a tied lm_head.weight, Qwen3-Next's
// mtp.* layers, and
// DeepSeek-V3's MTP layers from L + m.mtp_layers to L + m.mtp_layers_in_files (left out).
bool hf_tensor_ignorable(const HfModel& m, const std::string& name);

}  // namespace gale
