// GPTModel: parameter registration, embedding, layer stack, head and loss, forward/backward.
#include "model/gpt_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/allocator.h"
#include "kernels/cpu/logit_softcap.h"
#include "kernels/flop_counter.h"
#include "model/core_attention.h"
#include "model/linear.h"
#include "model/lora_modules.h"
#include "model/mhc_layer.h"
#include "model/layer_shares.h"
#include "model/norm_weight.h"
#include "model/param_builders.h"
#include "model/qat.h"
#include "model/longrope_rope.h"
#include "model/yarn_rope.h"
#include "parallel/mappings.h"
#include "parallel/tp2d_mappings.h"

namespace gale {

namespace {

// --output-logit-dtype bf16 (ModelConfig::bf16_logits): logits, or their gradient, rounded to bf16 in place.
void round_logits(const ModelConfig& c, Tensor& t) {
  if (!c.bf16_logits) return;
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = bf16_to_float(float_to_bf16(p[i]));
}

// The logits as the loss and sampling see them: rounded (--output-logit-dtype bf16), then soft-capped
// (--output-logit-softcapping C: C·tanh(z / C), rounded again), as LmHeadProblem's kernels do.
void finish_logits(const ModelConfig& c, Tensor& t) {
  round_logits(c, t);
  if (c.output_logit_softcapping <= 0.0f) return;
  softcap_inplace(t.data<float>(), t.numel(), c.output_logit_softcapping);
  round_logits(c, t);
}

// What one MTP layer keeps for backward (one micro-batch).
struct MtpSaved {
  std::vector<int32_t> tokens, positions, labels;  // rolled, [S, B] order
  std::vector<float> mask;
  float dloss_scale = 0.0f;  // the per-token loss gradient is dloss_scale·mask
  Tensor e, e_stats;         // the embedding of the rolled ids [Tl, H] (enorm's input)
  Tensor emb_norm_in, emb_norm_stats;  // --embed-layernorm: the embedding norm's input and statistics for them
  Tensor h, h_stats;         // the previous hidden states [Tl, H] (hnorm's input)
  Tensor cat_full;           // eh_proj's input [T, 2H] (gathered under SP; GEMM input type)
  std::vector<LayerSaved> layers;  // one per layer of the depth (a hybrid MTP pattern's; else one)
  Tensor final_in, final_stats, y_full, lse, head_saved;
};

// Megatron's roll_tensor(shifts=-1) along the sequence of [S, B]-ordered values: position s takes
// position s + 1's value, the last position 0.
// With packed sequences (MicroBatch::packed_sequences; Megatron's _roll_tensor_packed_seq) `doc_sb`
// holds the [S, B]-ordered document ids and each document rolls on its own: its last position takes 0.
template <typename V>
void roll_left(std::vector<V>& v, int64_t S, int64_t B, const std::vector<int32_t>& doc_sb = {}) {
  const bool packed = !doc_sb.empty();
  for (int64_t s = 0; s + 1 < S; ++s)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = s * B + b, next = t + B;
      v[t] = !packed || doc_sb[t] == doc_sb[next] ? v[next] : V(0);
    }
  for (int64_t b = 0; b < B; ++b) v[(S - 1) * B + b] = V(0);
}

// [a | b] of two [rows, H] f32 tensors: [rows, 2H].
Tensor concat_columns(const Tensor& a, const Tensor& b) {
  const int64_t rows = a.size(0), H = a.size(1);
  Tensor ab = Tensor::empty({rows, 2 * H});
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* o = ab.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(pa + r * H, pa + (r + 1) * H, o + r * 2 * H);
    std::copy(pb + r * H, pb + (r + 1) * H, o + r * 2 * H + H);
  }
  return ab;
}

// The two halves of the columns of ab [rows, 2H].
void split_columns(const Tensor& ab, Tensor* a, Tensor* b) {
  const int64_t rows = ab.size(0), H = ab.size(1) / 2;
  *a = Tensor::empty({rows, H});
  *b = Tensor::empty({rows, H});
  const float* in = ab.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(in + r * 2 * H, in + r * 2 * H + H, a->data<float>() + r * H);
    std::copy(in + r * 2 * H + H, in + (r + 1) * 2 * H, b->data<float>() + r * H);
  }
}

// The global layer index of MTP depth k's layer j (ModelConfig::mtp_num_layers).
int64_t mtp_layer_index(const ModelConfig& c, int64_t k, int64_t j) {
  return c.num_layers + k * c.mtp_layers_per_depth() + j;
}

// Dropout stream of MTP layer k's embedding (the decoder's embedding uses dropout_stream(seed, -1, 0)).
uint64_t mtp_embedding_stream(uint64_t seed, int64_t k) { return dropout_stream(seed, -2 - k, 0); }

// `t` times `s` (--use-mup's embedding and output multipliers): a new tensor, or `t` itself when s is 1.
Tensor times(const Tensor& t, float s) {
  if (s == 1.0f) return t;
  Tensor out = Tensor::empty(t.shape());
  const float* in = t.data<float>();
  float* o = out.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) o[i] = in[i] * s;
  return out;
}

}  // namespace

struct GPTModel::State {
  MicroBatch mb;
  LayerRuntime rt;
  std::vector<int32_t> tokens_sb, labels_sb, positions_sb;  // [S, B] order (row t = s·B + b)
  std::vector<float> mask_sb;
  std::vector<LayerSaved> layers;
  // Head (last stage).
  Tensor final_in, final_stats, final_out_full, lse, head_saved;
  Tensor distill_grad;  // QAD / the head logits hook: d loss / d logits [T, V/TP] before the loss scale
  double lm_coef = 1.0;  // the head logits hook's factor of the cross-entropy's gradient
  Tensor emb_norm_in, emb_norm_stats;  // --embed-layernorm (first stage; the MTP stage's are in MtpSaved)
  Tensor decoder_input;                // the embedding's output, kept for the forward observer
  std::vector<MtpSaved> mtp;  // --mtp-num-layers, training forwards
  std::unique_ptr<ActivationSwap> swap;  // --swap-attention, training forwards
  std::unique_ptr<ActivationCompressor> compress;  // --compress-activation / --compress-dense
  FullRecompute full_recompute;           // the plan this micro-batch's forward followed
  Shape hidden_shape;                     // a layer input's shape [Tl, H] (the recomputed groups')
  bool recomputed = false;                // recompute() ran: backward reruns nothing
};


ModelPartition single_process_partition(const ModelConfig& config) {
  ModelPartition p;
  p.tp = make_self_communicator("tp");
  p.num_layers = config.num_layers;
  return p;
}

GPTModel::GPTModel(const ModelConfig& config, const ModelPartition& part, const OpTable* ops)
    : config_(config), part_(part), ops_(ops) {
  const ModelConfig& c = config_;
  GALE_CHECK_EQ(c.vocab % part_.tp_size(), 0);
  // A norm over H outside the layers (`name`.weight, and .bias with LayerNorm): it normalises the
  // rows this rank holds (its 1/TP with SP), so its gradient is summed over TP under SP.
  auto norm = [&](const std::string& name, int* w, int* b) {
    ParamSpec sw = make_param_spec(name + ".weight", {c.hidden}, norm_weight_init(c), 0.0f, false);
    sw.sequence_parallel = part_.sequence_parallel;
    *w = params_.add(sw);
    if (c.rms_norm) return;
    ParamSpec sb = make_param_spec(name + ".bias", {c.hidden}, InitKind::kZeros, 0.0f, false);
    sb.sequence_parallel = part_.sequence_parallel;
    *b = params_.add(sb);
  };
  if (part_.pre_process) {
    word_emb_ = params_.add(tp_split(make_param_spec("embedding.word_embeddings.weight", {c.vocab, c.hidden},
                                                     InitKind::kNormal, c.embedding_init_std(), true), part_, 0));
    if (c.position == PositionEmbedding::kLearnedAbsolute)
      pos_emb_ = params_.add(make_param_spec("embedding.position_embeddings.weight", {c.max_positions, c.hidden},
                                       InitKind::kNormal, c.embedding_init_std(), true));
    if (c.embed_layernorm) norm("embedding.norm", &emb_norm_w_, &emb_norm_b_);
  }
  for (int64_t i = 0; i < part_.num_layers; ++i)
    layers_.push_back(register_layer_params(params_, c, part_, part_.first_layer + i));
  if (part_.post_process) {
    // Megatron's MambaStack names its final norm final_norm
    norm(c.hybrid.enabled ? "decoder.final_norm" : "decoder.final_layernorm", &final_norm_w_, &final_norm_b_);
    if (c.mtp_num_layers > 0 && !part_.pre_process) {
      // The MTP layers embed the rolled ids, so a last stage without the embedding holds copies of
      // the first stage's (Megatron's mtp_process embedding; same names, so the same initial
      // values; gradients summed with the first stage's over the embedding group).
      word_emb_ = params_.add(tp_split(make_param_spec("embedding.word_embeddings.weight", {c.vocab, c.hidden},
                                                       InitKind::kNormal, c.embedding_init_std(), true), part_, 0));
      if (c.position == PositionEmbedding::kLearnedAbsolute)
        pos_emb_ = params_.add(make_param_spec("embedding.position_embeddings.weight", {c.max_positions, c.hidden},
                                               InitKind::kNormal, c.embedding_init_std(), true));
      // --embed-layernorm: a copy of the first stage's embedding norm too, so that the MTP layers' embedding
      // is normalised at every pipeline layout as at PP 1 (in the embedding group likewise).
      if (c.embed_layernorm) norm("embedding.norm", &emb_norm_w_, &emb_norm_b_);
    }
    if (!c.tied_embeddings) {
      output_w_ = params_.add(tp_split(make_param_spec("output_layer.weight", {c.vocab, c.hidden}, InitKind::kNormal,
                                                       c.embedding_init_std(), true), part_, 0));
    } else if (word_emb_ >= 0) {
      output_w_ = word_emb_;  // the first stage's embedding, or the MTP stage's copy of it
    } else {
      // The last pipeline stage holds its own copy of the tied embedding (same name, so the same
      // initial values; gradients are summed with the first stage's over the embedding group).
      output_w_ = params_.add(tp_split(make_param_spec("embedding.word_embeddings.weight", {c.vocab, c.hidden},
                                                       InitKind::kNormal, c.embedding_init_std(), true), part_, 0));
    }
  }
  if (part_.post_process && c.mtp_num_layers > 0) {
    GALE_CHECK_EQ(part_.cp_size(), 1) << "multi-token prediction with context parallelism";
    for (int64_t k = 0; k < c.mtp_num_layers; ++k) {
      const std::string prefix = str_cat("mtp.layers.", k, ".");
      MtpParamIds m;
      norm(prefix + "enorm", &m.enorm_w, &m.enorm_b);
      norm(prefix + "hnorm", &m.hnorm_w, &m.hnorm_b);
      m.eh_proj_w = params_.add(tp_split(make_param_spec(prefix + "eh_proj.weight", {c.hidden, 2 * c.hidden},
                                                         InitKind::kNormal, c.init_std, true), part_, 0));
      // A decoder layer's parameters under Megatron's names: the GPT path's submodule is saved as
      // transformer_layer, the hybrid path's HybridStack as mtp_model_layer.layers.{j}.
      const int64_t P = c.mtp_layers_per_depth();
      const bool hybrid_mtp = c.hybrid.enabled && !c.hybrid.mtp.empty();
      for (int64_t j = 0; j < P; ++j) {
        const int64_t layer = mtp_layer_index(c, k, j);
        const int first_id = params_.size();
        m.layers.push_back(register_layer_params(params_, c, part_, layer));
        const std::string to = hybrid_mtp ? str_cat(prefix, "mtp_model_layer.layers.", j, ".") : prefix + "transformer_layer.";
        for (int id = first_id; id < params_.size(); ++id)  // buffers (a router's expert_bias) included
          params_.rename_prefix(id, str_cat("decoder.layers.", layer, "."), to);
      }
      norm(prefix + "final_layernorm", &m.final_w, &m.final_b);
      mtp_.push_back(m);
    }
    mtp_losses_.assign(static_cast<size_t>(c.mtp_num_layers), 0.0);
  }
  // --init-method-xavier-uniform: Megatron passes xavier_uniform_ as both init_method and
  // output_layer_init_method, so every weight matrix initialised N(0, σ) (or the scaled σ of the
  // output projections) is Xavier-uniform instead, over its global (unsplit) shape.
  if (c.init_xavier_uniform)
    for (int id = 0; id < params_.size(); ++id) {
      const ParamSpec& s = params_.spec(id);
      if (s.init == InitKind::kNormal && s.global_shape.size() == 2)
        params_.set_init(id, InitKind::kUniform, xavier_uniform_bound(s.global_shape[0], s.global_shape[1]));
    }
  // LoRA: only the adapters (and --lora-modules-to-save's modules) train; every other base
  // parameter is frozen (no gradient, no optimizer state).
  if (c.lora.enabled())
    for (int id = 0; id < params_.size(); ++id)
      if (!is_lora_adapter(params_.spec(id).name) && !lora_saves_module(c.lora.modules_to_save, params_.spec(id).name))
        params_.freeze(id);
  // --dist-train forward-only sub-worlds: the embedding and the layers before c.frozen_layers.
  if (c.frozen_layers > 0)
    for (int id = 0; id < params_.size(); ++id) {
      const std::string& name = params_.spec(id).name;
      const std::string layers = "decoder.layers.";
      bool frozen = name.rfind("embedding.", 0) == 0;
      if (name.rfind(layers, 0) == 0) frozen = std::stoll(name.substr(layers.size())) < c.frozen_layers;
      if (frozen && params_.spec(id).trainable) params_.freeze(id);
    }
  mark_qat_params(params_, c.qat);  // --qat-scheme: the linear weights read fake-quantised
  if (c.fp8.enabled) {  // --fp8-format: FP8-emulated linear GEMMs (and the delayed recipe's state buffers)
    Fp8Config fp8 = c.fp8;
    fp8.num_layers = c.num_layers;
    add_fp8_params(params_, fp8);
  }
  params_.finalize();
  if (c.gemm_dtype() != DType::kF32) params_.enable_gemm_copy(c.gemm_dtype(), c.reuse_fp32_param);
  if (c.mla.enabled)
    rope_ = make_mla_rope_tables(c.mla, c.max_positions, c.rotary_base);  // plain RoPE or YaRN
  else if (c.yarn.enabled)
    rope_ = make_yarn_rope_tables(c.yarn, c.max_positions, c.rot_dim(), c.rotary_base);
  else if (c.longrope.enabled) {  // both tables: a forward picks one (longrope_use_long)
    rope_ = make_longrope_tables(c.longrope, false, c.max_positions, c.rot_dim(), c.rotary_base);
    rope_long_ = make_longrope_tables(c.longrope, true, c.max_positions, c.rot_dim(), c.rotary_base);
    rope_long_.interleaved = c.rope_interleaved;
  }
  else if (c.uses_rope_tables())
    rope_ = make_rope_tables(c.max_positions, c.rot_dim(), c.rotary_base, c.rope_scaling_factor, c.rope_position_scale);
  if (c.uses_rope_tables()) rope_.interleaved = c.rope_interleaved;
  if (c.position == PositionEmbedding::kAlibi) {
    GALE_CHECK(!c.mla.enabled) << "ALiBi with multi-latent attention";
    alibi_slopes_ = alibi_slopes(c.heads);  // all heads: each rank's heads read theirs at head_offset
  }
  if (c.softmax_type != SoftmaxType::kVanilla)
    GALE_CHECK(!c.dsa.enabled && !part_.tp2d())
        << "--softmax-type off-by-one / learnable with DeepSeek sparse attention or --tp-2d (refused at start-up)";
  if (c.softmax_type == SoftmaxType::kOffByOne) zero_softmax_offset_.assign(static_cast<size_t>(c.heads), 0.0f);
}

GPTModel::~GPTModel() = default;

void GPTModel::build_runtime(State& st, const MicroBatch& mb, bool training, KvCache* cache) const {
  const ModelConfig& c = config_;
  st.mb = mb;
  const int64_t B = mb.B, S = mb.S, T = S * B;
  GALE_CHECK_EQ(static_cast<int64_t>(mb.tokens.size()), T);
  if (st.mb.sample_ids.empty())
    for (int64_t b = 0; b < B; ++b) st.mb.sample_ids.push_back(b);
  st.tokens_sb.resize(T);
  st.labels_sb.resize(T);
  st.positions_sb.resize(T);
  st.mask_sb.resize(T);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) {
      int64_t t = s * B + b, i = b * S + s;
      st.tokens_sb[t] = mb.tokens[i];
      st.positions_sb[t] = mb.position_ids[i];
      if (!mb.labels.empty()) st.labels_sb[t] = mb.labels[i];
      if (!mb.loss_mask.empty()) st.mask_sb[t] = mb.loss_mask[i];
    }
  LayerRuntime& rt = st.rt;
  rt.config = &config_;
  rt.part = &part_;
  rt.ops = ops_;
  rt.rope = c.uses_rope_tables() ? &rope_ : nullptr;
  if (c.longrope.enabled)  // the training / evaluation forward: by --seq-length (forward_logits: by the positions)
    rt.rope = longrope_use_long(c.longrope, false, st.positions_sb.data(), T) ? &rope_long_ : &rope_;
  rt.mb = &st.mb;
  rt.training = training;
  rt.kv_cache = cache;
  rt.moe_losses = training ? &moe_losses_ : nullptr;
  rt.dsa_indexer_loss = training ? &dsa_indexer_loss_ : nullptr;
  rt.moe_token_counts = training ? &moe_token_counts_ : nullptr;
  rt.max_attention_logits = c.track_max_attention_logit ? &max_attention_logits_ : nullptr;
  rt.moe_aux_scale = static_cast<double>(grad_scale_) / static_cast<double>(std::max<int64_t>(1, num_microbatches_));
  rt.per_token_loss = per_token_loss_;
  rt.moe_router_aux_scale = per_token_loss_ ? static_cast<double>(grad_scale_) : rt.moe_aux_scale;
  const int64_t tp = part_.tp_size();
  // Context parallelism: S is this rank's share of the sequence; positions are global.
  const int64_t S_global = st.mb.global_length();
  rt.cp_split = ContextSplit{S_global, part_.cp_size(), part_.cp_rank(), {}};
  if (rt.cp_split.cp_size > 1) {
    GALE_CHECK(S_global == S * rt.cp_split.cp_size && static_cast<int64_t>(st.mb.seq_positions.size()) == S)
        << "context parallelism needs a micro-batch sliced for this cp rank (slice_micro_batch)";
    // adaptive_cp_algo: the positions of every rank and the empty blocks come with the micro-batch.
    GALE_CHECK(part_.cp_adaptive == static_cast<bool>(st.mb.cp_layout))
        << "adaptive_cp_algo needs micro-batches sliced with an adaptive layout, and only it";
    rt.cp_split.layout = st.mb.cp_layout;
    GALE_CHECK(!rt.cp_split.layout || rt.cp_split.local_positions() == st.mb.seq_positions)
        << "adaptive cp: the micro-batch's positions are not its layout's";
    GALE_CHECK(st.mb.document_ids.empty() || !st.mb.key_document_ids.empty())
        << "context parallelism with document ids needs the whole sequences' ids for the keys";
  } else if (cache) {
    GALE_CHECK(S_global == cache->length + S && static_cast<int64_t>(st.mb.seq_positions.size()) == S)
        << "kv cache: the micro-batch must hold the positions after the cached ones";
  } else {
    GALE_CHECK_EQ(S_global, S) << "a micro-batch sliced for context parallelism in a model without it";
  }
  // The rows this rank holds between layers: its 1/TP under SP, its chunk x of X under --tp-2d.
  const int64_t row_parts = part_.sequence_parallel ? tp : part_.tp2d() ? part_.tp_x->size() : 1;
  const int64_t row_part = part_.sequence_parallel ? part_.tp_rank() : part_.tp2d() ? part_.tp_x->rank() : 0;
  const int64_t s_local = S / row_parts;
  const int64_t s_offset = row_part * s_local;
  if (rt.rope) {
    rt.rope_positions.resize(static_cast<size_t>(B * S));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) rt.rope_positions[b * S + s] = st.mb.seq_position(s);
  }
  rt.hidden_row_ids.resize(static_cast<size_t>(s_local * B));
  for (int64_t s = 0; s < s_local; ++s)
    for (int64_t b = 0; b < B; ++b)
      rt.hidden_row_ids[s * B + b] = st.mb.sample_ids[b] * S_global + st.mb.seq_position(s_offset + s);
  AttentionProblem& ap = rt.attention;
  ap.B = B;
  ap.Sq = ap.Sk = S;
  const LayerShares shares = layer_shares(c, part_);  // this TP rank's heads (uneven: --unaligned-linear)
  ap.NH = shares.heads;
  ap.KV = shares.groups;
  // --tp-2d: rank (x, y) runs 1/Y of the query groups of chunk x (model/tp2d_layer.h), so its first
  // head is (x·Y + y)·NHl, not its TP rank's share.
  ap.head_offset = part_.tp2d() ? (part_.tp_x->rank() * part_.tp_y->size() + part_.tp_y->rank()) * shares.heads
                                : shares.head_offset;
  const bool ulysses = rt.cp_split.cp_size > 1 && part_.cp_ulysses;
  const bool hybrid = rt.cp_split.cp_size > 1 && part_.hybrid_cp();
  if (hybrid) {  // the ring block of this rank's Ulysses group, 1/U of this TP rank's heads
    const int64_t U = part_.cp_hybrid.ulysses_degree(), N = rt.cp_split.cp_size, c = part_.cp_rank();
    GALE_CHECK_EQ(U * part_.cp_hybrid.ring_degree(), N) << "hybrid cp: Ulysses x ring sub-groups";
    rt.hybrid_ulysses_split = hybrid_ulysses_split(S_global, N, U, c);
    rt.hybrid_ring_split = hybrid_ring_split(S_global, N, U, c);
    if (rt.cp_split.layout) {  // hybrid_adaptive_cp_algo: the rings' adaptive layout
      GALE_CHECK(rt.cp_split.layout->ring && rt.cp_split.layout->ring->cp_size == part_.cp_hybrid.ring_degree())
          << "hybrid adaptive cp: a micro-batch without the rings' layout";
      rt.hybrid_ring_split.layout = rt.cp_split.layout->ring;
    }
    rt.hybrid_positions = rt.hybrid_ring_split.local_positions();
    const int64_t Sb = rt.hybrid_ring_split.local_length();
    ap.Sq = Sb;
    ap.Sk = S_global;
    ap.q_positions = rt.hybrid_positions.data();
    ap.NH /= U;
    ap.KV = ulysses_kv_heads(ap.KV, U);
    ap.head_offset += (c % U) * ap.NH;
    if (!st.mb.document_ids.empty()) {
      rt.hybrid_q_doc_ids.resize(static_cast<size_t>(B * Sb));
      for (int64_t b = 0; b < B; ++b)
        for (int64_t s = 0; s < Sb; ++s)
          rt.hybrid_q_doc_ids[b * Sb + s] = st.mb.key_document_ids[b * S_global + rt.hybrid_positions[s]];
    }
  } else if (ulysses) {  // whole sequences in position order, 1/CP of this TP rank's heads
    ap.Sq = ap.Sk = S_global;
    ap.NH /= rt.cp_split.cp_size;
    ap.KV = part_.cp_ulysses_allgather_kv ? ap.KV : ulysses_kv_heads(ap.KV, rt.cp_split.cp_size);
    ap.head_offset += part_.cp_rank() * ap.NH;
  } else if (rt.cp_split.cp_size > 1 || cache) {  // queries at their global positions; keys: the sequence so far
    ap.Sk = S_global;
    ap.q_positions = st.mb.seq_positions.data();
  }
  ap.HD = c.attention_head_dim();
  ap.scale = c.softmax_scale();  // --query-pre-attn-scalar N: 1/√N
  ap.softcap = c.attn_logit_softcapping;  // --attn-logit-softcapping
  ap.causal = true;
  ap.window = c.sliding_window;  // each layer sets its own (ModelConfig::layer_window)
  ap.alibi_slopes = alibi_slopes_.empty() ? nullptr : alibi_slopes_.data();
  // --softmax-type off-by-one: a zero sink logit for every head (learnable: the layer's parameter,
  // set by the layer).
  ap.softmax_offset = zero_softmax_offset_.empty() ? nullptr : zero_softmax_offset_.data();
  if (!st.mb.document_ids.empty()) {
    ap.q_doc_ids = ulysses ? st.mb.key_document_ids.data()
                   : hybrid ? rt.hybrid_q_doc_ids.data()
                            : st.mb.document_ids.data();
    ap.k_doc_ids = rt.cp_split.cp_size > 1 ? st.mb.key_document_ids.data() : st.mb.document_ids.data();
  }
  ap.dropout_p = training ? c.attention_dropout : 0.0f;
  ap.dropout_seed = c.seed;
  ap.sample_ids = st.mb.sample_ids.data();
  ap.heads_total = c.heads;
  ap.max_positions = S_global;
}

Tensor GPTModel::embedding_forward(State& st, const int32_t* tokens, const int32_t* positions, uint64_t stream) {
  const ModelConfig& c = config_;
  const int64_t T = st.mb.B * st.mb.S, H = c.hidden;
  const int64_t Vl = c.vocab / part_.tp_size();
  Tensor x = Tensor::empty({T, H});
  ops_->embedding_forward(tokens, T, params_.param_data(word_emb_), part_.tp_rank() * Vl, Vl, H, x.data<float>());
  x = reduce_from_tp_region(x, *part_.tp);  // vocab-parallel lookup: each rank contributed its rows
  if (pos_emb_ >= 0) {
    const float* pe = params_.param_data(pos_emb_);
    float* xd = x.data<float>();
    for (int64_t t = 0; t < T; ++t) {
      const float* row = pe + static_cast<int64_t>(positions[t]) * H;
      for (int64_t i = 0; i < H; ++i) xd[t * H + i] += row[i];
    }
  }
  x = times(x, c.mup.embedding_mult);  // --use-mup: Megatron scales the summed embeddings before dropout
  if (part_.sequence_parallel) x = scatter_to_sequence_parallel_region(x, *part_.tp).clone();
  if (part_.tp2d()) x = scatter_to_2d_piece(x, *part_.tp_x, *part_.tp_y);  // [T/X, H/Y]
  if (emb_norm_w_ >= 0) {
    st.emb_norm_in = x;
    x = norm_forward(emb_norm_w_, emb_norm_b_, x, &st.emb_norm_stats);
  }
  DropoutSpec d;
  d.p = st.rt.training ? c.hidden_dropout : 0.0f;
  if (d.p > 0.0f) {
    d.seed = c.seed;
    d.stream = stream;
    d.row_ids = st.rt.hidden_row_ids.data();
    d.cols_total = H;
    d.col_offset = hidden_col_offset();
    ops_->dropout(x.data<float>(), x.data<float>(), x.size(0), x.size(1), d);
  }
  // --input-embeds-norm (Gemma's normalizer): MindSpeed-LLM scales the embedding's output (after its
  // dropout) at the start of the transformer block.
  return times(x, c.input_embeds_scale);
}

void GPTModel::embedding_backward(State& st, const int32_t* tokens, const int32_t* positions, uint64_t stream,
                                  const Tensor& d_in) {
  const ModelConfig& c = config_;
  const int64_t T = st.mb.B * st.mb.S, H = c.hidden;
  Tensor d = times(d_in, c.input_embeds_scale);  // --input-embeds-norm, backward
  if (st.rt.training && c.hidden_dropout > 0.0f) {
    DropoutSpec ds;
    ds.p = c.hidden_dropout;
    ds.seed = c.seed;
    ds.stream = stream;
    ds.row_ids = st.rt.hidden_row_ids.data();
    ds.cols_total = H;
    ds.col_offset = hidden_col_offset();
    Tensor scaled = d;
    d = Tensor::empty(scaled.shape());
    ops_->dropout(scaled.data<float>(), d.data<float>(), d.size(0), d.size(1), ds);  // backward: the same mask and scale
  }
  if (emb_norm_w_ >= 0) {
    d = norm_backward(emb_norm_w_, emb_norm_b_, d, st.emb_norm_in, st.emb_norm_stats);
    st.emb_norm_in = Tensor();
    st.emb_norm_stats = Tensor();
  }
  Tensor d_full = part_.sequence_parallel ? scatter_to_sequence_parallel_region_backward(d, *part_.tp) : d;
  if (part_.tp2d()) d_full = scatter_to_2d_piece_backward(d, *part_.tp_x, *part_.tp_y);
  d_full = times(d_full, c.mup.embedding_mult);  // --use-mup's embedding multiplier, backward
  if (pos_emb_ >= 0 && params_.spec(pos_emb_).trainable)  // frozen under LoRA: no gradient
    ops_->embedding_backward(positions, T, d_full.data<float>(), 0, c.max_positions, H,
                             params_.grad_data(pos_emb_));
  const int64_t Vl = c.vocab / part_.tp_size();
  if (params_.spec(word_emb_).trainable)
    ops_->embedding_backward(tokens, T, d_full.data<float>(), part_.tp_rank() * Vl, Vl, H,
                             params_.grad_data(word_emb_));
}

Tensor GPTModel::norm_forward(int w, int b, const Tensor& x, Tensor* stats) const {
  const ModelConfig& c = config_;
  const int64_t rows = x.size(0), H = c.hidden;
  *stats = Tensor::empty({c.rms_norm ? 1 : 2, rows});
  Tensor y = Tensor::empty({rows, H});
  ops_->norm_forward(NormSpec{c.rms_norm, c.norm_eps}, x.data<float>(), NormScale(c, params_, w).data(),
                     b >= 0 ? params_.param_data(b) : nullptr, y.data<float>(), stats->data<float>(), rows, H);
  return y;
}

Tensor GPTModel::norm_backward(int w, int b, const Tensor& dy, const Tensor& x, const Tensor& stats) {
  const ModelConfig& c = config_;
  const int64_t rows = x.size(0), H = c.hidden;
  Tensor dx = Tensor::empty({rows, H});
  ops_->norm_backward(NormSpec{c.rms_norm, c.norm_eps}, dy.data<float>(), x.data<float>(),
                      NormScale(c, params_, w).data(), stats.data<float>(), dx.data<float>(), params_.grad_data(w),
                      b >= 0 ? params_.grad_data(b) : nullptr, rows, H);
  return dx;
}

Tensor GPTModel::final_norm_forward(const Tensor& x, Tensor* stats, Tensor* local) const {
  Tensor y = norm_forward(final_norm_w_, final_norm_b_, x, stats);
  if (local) *local = y;
  return part_.sequence_parallel ? gather_from_sequence_parallel_region(y, *part_.tp) : copy_to_tp_region(y, *part_.tp);
}

double GPTModel::output_loss_forward(const Tensor& y_full, const std::vector<int32_t>& labels,
                                     const std::vector<float>& mask, float dloss_scale, Tensor* lse_out,
                                     Tensor* saved_out, std::vector<double>* sample_sums, int64_t B,
                                     std::vector<double>* token_losses) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(labels.size()), H = c.hidden;
  const int64_t tp = part_.tp_size(), Vl = c.vocab / tp;
  LmHeadProblem p{T, H, Vl, part_.tp_rank() * Vl, y_full.data<float>(), params_.param_data(output_w_),
                  labels.data(), tp == 1, nullptr, nullptr, ops_->gemm, c.bf16_logits};
  p.logit_softcap = c.output_logit_softcapping;  // --output-logit-softcapping
  // With one vocabulary slice and the loss gradient known now, a fused head may finish its
  // backward here (schedules.h's loss scale).
  std::vector<float> dloss;
  if (lse_out && tp == 1 && dloss_scale > 0.0f) {
    dloss.resize(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) dloss[t] = dloss_scale * mask[t];
    p.dloss = dloss.data();
    p.dW = params_.grad_data(output_w_);  // null when frozen (LoRA): no eager backward, no dW
  }
  Tensor stat = Tensor::empty({3, T});  // slice max, slice Σexp, target logit
  float* smax = stat.data<float>();
  float* ssum = smax + T;
  float* target = ssum + T;
  for (int64_t t = 0; t < T; ++t) {
    int32_t label = labels[t];
    GALE_CHECK(label >= 0 && label < c.vocab) << "label " << label << " outside the vocabulary of " << c.vocab;
  }
  Tensor saved;
  ops_->lm_head_loss_forward(p, smax, ssum, target, lse_out ? &saved : nullptr);
  if (tp > 1) {
    // Merge the vocabulary slices: lse = gmax + log Σ_ranks sumexp_r·exp(max_r − gmax).
    Tensor gmax = Tensor::empty({T});
    std::copy(smax, smax + T, gmax.data<float>());
    part_.tp->all_reduce(gmax.raw(), T, DType::kF32, ReduceOp::kMax);
    for (int64_t t = 0; t < T; ++t) ssum[t] *= std::exp(smax[t] - gmax.data<float>()[t]);
    std::copy(gmax.data<float>(), gmax.data<float>() + T, smax);
    part_.tp->all_reduce(ssum, 2 * T, DType::kF32, ReduceOp::kSum);  // Σexp and target logit
  }
  Tensor lse = Tensor::empty({T});
  double loss_sum = 0.0;
  if (sample_sums) sample_sums->assign(static_cast<size_t>(B), 0.0);
  if (token_losses) token_losses->assign(static_cast<size_t>(T), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    lse.data<float>()[t] = smax[t] + std::log(ssum[t]);
    double l = static_cast<double>(smax[t]) + std::log(static_cast<double>(ssum[t])) - target[t];
    loss_sum += l * mask[t];
    if (sample_sums) (*sample_sums)[static_cast<size_t>(t % B)] += l * mask[t];
    if (token_losses) (*token_losses)[static_cast<size_t>((t % B) * (T / B) + t / B)] = l;  // row s·B + b -> [b, s]
  }
  if (lse_out) {
    *lse_out = lse;
    *saved_out = saved;
  }
  return loss_sum;
}

Tensor GPTModel::output_loss_backward(const Tensor& y_full, const std::vector<int32_t>& labels,
                                      const std::vector<float>& mask, float dloss_scale, const Tensor& lse,
                                      Tensor* saved) {
  const ModelConfig& c = config_;
  const int64_t T = static_cast<int64_t>(labels.size()), H = c.hidden;
  const int64_t tp = part_.tp_size(), Vl = c.vocab / tp;
  std::vector<float> dloss(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) dloss[t] = dloss_scale * mask[t];
  LmHeadProblem p{T, H, Vl, part_.tp_rank() * Vl, y_full.data<float>(), params_.param_data(output_w_),
                  labels.data(), tp == 1, nullptr, nullptr, ops_->gemm, c.bf16_logits};
  p.logit_softcap = c.output_logit_softcapping;  // --output-logit-softcapping
  Tensor d_y = Tensor::empty({T, H});
  // dW is null for a frozen output layer (LoRA): no weight-gradient GEMM.
  ops_->lm_head_loss_backward(p, lse.data<float>(), dloss.data(), d_y.data<float>(), params_.grad_data(output_w_),
                              saved);
  return d_y;
}

void GPTModel::head_forward(State& st, const Tensor& x_in, LossSums* loss, bool keep) {
  const Tensor x = whole_hidden(x_in);  // --tp-2d: the final norm and the output layer see whole rows
  Tensor stats, y_local;
  // --use-mup: logits·α = (α·y)·Wᵀ, so the head sees α·y (its dW is then α·dlogitsᵀ·y, as Megatron's).
  Tensor y_full = times(final_norm_forward(x, &stats, &y_local), config_.mup.output_mult);
  // Σ mask of the whole micro-batch: with context parallelism summed over the cp group.
  double tokens = 0.0;
  for (float m : st.mask_sb) tokens += m;
  const double local_tokens = tokens;  // this CP rank's (the head logits hook's sums are per rank)
  if (part_.cp_size() > 1) part_.cp->all_reduce(&tokens, 1, DType::kF64, ReduceOp::kSum);
  // Per-token loss gradient, known now when the micro-batch count is: the schedule's loss scale
  // is 1 / (Σ mask · micro-batches) (1 with --calculate-per-token-loss), applied in backward.
  // QAD (set_distillation): the cross-entropy is only reported; the KL term's gradient is kept.
  const bool distill = keep && distill_.teacher != nullptr;
  // The head logits hook (offline distillation): it sees the logits and may reweight the
  // cross-entropy's gradient (lm_coef 0: not differentiated) and add its own.
  const bool hooked = logits_hook_ != nullptr;
  HeadLogitsHook::Result hooked_result;
  Tensor logits;  // this rank's vocabulary slice, when the observer or the hook wants it
  if (forward_observer_ || hooked) {
    const int64_t T = y_full.shape()[0], H = config_.hidden, Vl = config_.vocab / part_.tp_size();
    logits = Tensor::empty({T, Vl});
    ops_->gemm(false, true, T, Vl, H, 1.0f, y_full.data<float>(), H, params_.param_data(output_w_), H, 0.0f,
               logits.data<float>(), Vl);
    finish_logits(config_, logits);
  }
  if (hooked) {
    GALE_CHECK(config_.output_logit_softcapping <= 0.0f)
        << "--output-logit-softcapping with offline logits distillation: not supported yet (the hook's logit "
           "gradient does not go through the cap)";
    GALE_CHECK(distill_.teacher == nullptr && !part_.tp2d()) << "offline distillation: no QAD, no 2-D tensor parallelism";
    hooked_result = logits_hook_->training_logits(st.mb, logits, st.mask_sb, part_.tp_rank() * (config_.vocab / part_.tp_size()));
  }
  if (!keep) hooked_result.lm_coef = 1.0;  // nothing is differentiated: only report_lm_loss counts
  const bool lm_grad = keep && !distill && hooked_result.lm_coef != 0.0;
  const float scale = lm_grad && num_microbatches_ > 0
                          ? static_cast<float>(micro_batch_loss_scale(tokens, num_microbatches_, per_token_loss_) *
                                               grad_scale_ * hooked_result.lm_coef)
                          : 0.0f;
  if (forward_observer_) {  // this rank's vocabulary slice of the logits
    forward_observer_(st.mb, st.decoder_input, logits);
    st.decoder_input = Tensor();
  }
  Tensor lse, saved;
  std::vector<double> sample_sums;
  std::vector<double> token_losses;
  double loss_sum = output_loss_forward(y_full, st.labels_sb, st.mask_sb, scale, lm_grad ? &lse : nullptr,
                                        &saved, loss ? &sample_sums : nullptr, st.mb.B,
                                        loss ? &token_losses : nullptr);
  if (distill) st.distill_grad = distillation_forward(st, y_full);
  if (hooked) {
    logits_hook_->training_lm_loss(loss_sum, local_tokens);  // this CP rank's sums (before the CP all-reduce)
    if (!hooked_result.report_lm_loss) {
      loss_sum = 0.0;
      std::fill(sample_sums.begin(), sample_sums.end(), 0.0);
      std::fill(token_losses.begin(), token_losses.end(), 0.0);
    }
    st.lm_coef = hooked_result.lm_coef;
    if (keep && hooked_result.logit_grad.defined()) {  // the --fp16 loss scale now, the schedule's in backward
      st.distill_grad = hooked_result.logit_grad;
      float* g = st.distill_grad.data<float>();
      for (int64_t i = 0; i < st.distill_grad.numel(); ++i) g[i] *= grad_scale_;
    }
  }
  std::vector<double> sample_tokens;
  if (loss) {
    sample_tokens.assign(static_cast<size_t>(st.mb.B), 0.0);
    for (size_t t = 0; t < st.mask_sb.size(); ++t) sample_tokens[t % sample_tokens.size()] += st.mask_sb[t];
  }
  if (part_.cp_size() > 1) {  // the whole sequences' sums: the micro-batch's and each sample's, in one all-reduce
    std::vector<double> sums = {loss_sum};
    sums.insert(sums.end(), sample_sums.begin(), sample_sums.end());
    sums.insert(sums.end(), sample_tokens.begin(), sample_tokens.end());
    part_.cp->all_reduce(sums.data(), static_cast<int64_t>(sums.size()), DType::kF64, ReduceOp::kSum);
    loss_sum = sums[0];
    std::copy(sums.begin() + 1, sums.begin() + 1 + static_cast<int64_t>(sample_sums.size()), sample_sums.begin());
    std::copy(sums.end() - static_cast<int64_t>(sample_tokens.size()), sums.end(), sample_tokens.begin());
  }
  if (loss) {
    loss->loss_sum = loss_sum;
    loss->tokens = tokens;
    loss->sample_loss_sums = std::move(sample_sums);
    loss->sample_tokens = std::move(sample_tokens);
    loss->token_losses = std::move(token_losses);
  }
  if (keep) {
    st.final_in = x;
    st.final_stats = stats;
    st.final_out_full = y_full;
    st.lse = lse;
    st.head_saved = saved;
    // The logits saver (report_lm_loss false) replaces Megatron's compute_language_model_loss, which
    // the MTP losses use too: they are neither reported nor differentiated then. A KD student keeps
    // them at --mtp-loss-scaling-factor beside α·kd + (1 − α)·lm (Megatron's MTPLossAutoScaler).
    if (!mtp_.empty() && (!hooked || hooked_result.report_lm_loss)) mtp_forward(st, y_local);
  }
}

Tensor GPTModel::distillation_forward(const State& st, const Tensor& y_full) {
  const ModelConfig& c = config_;
  GALE_CHECK(part_.cp_size() == 1 && !part_.tp2d() && mtp_.empty())
      << "QAD distillation: no context or 2-D tensor parallelism, no MTP";
  const int64_t B = st.mb.B, S = st.mb.S, T = B * S, V = c.vocab, H = c.hidden;
  const int64_t tp = part_.tp_size(), Vl = V / tp;  // this rank's vocabulary slice [tp_rank·Vl, +Vl)
  GALE_CHECK_EQ(y_full.size(0), T);
  GALE_CHECK_EQ(distill_.teacher->config().vocab, V) << "the QAD teacher's vocabulary";
  // The student's logits [T, Vl] (row t = s·B + b): the output layer's GEMM the fused head runs.
  Tensor student = linear_forward(
      y_full, LinearWeight{params_.param_data(output_w_), nullptr, nullptr, nullptr, Vl, H, ops_->gemm});
  GALE_CHECK(c.output_logit_softcapping <= 0.0f)
      << "--output-logit-softcapping with QAD distillation: not supported yet (the KL gradient does not go "
         "through the cap)";
  round_logits(c, student);
  // The teacher's, [B, S, V] sample-major over the whole vocabulary (gathered over TP): token
  // t = s·B + b is its row b·S + s, this rank's columns from tp_rank·Vl.
  const Tensor teacher = distill_.teacher->forward_logits(st.mb, Tensor());
  std::vector<int64_t> teacher_rows(static_cast<size_t>(T));
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) teacher_rows[s * B + b] = b * S + s;
  // d (weight·KL_mb) / d kl_t = weight·mask_t (/ Σ mask with mean: the loss scale divides by it).
  double tokens = 0.0;
  for (float m : st.mask_sb) tokens += m;
  const double k = distill_.weight * (distill_.reduction == KlReduction::kSum ? tokens : 1.0);
  std::vector<float> coef(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) coef[t] = static_cast<float>(k * st.mask_sb[t]);
  std::vector<double> kl(static_cast<size_t>(T));
  Tensor d = Tensor::empty({T, Vl});
  KlAllReduce over_tp;
  if (tp > 1)
    over_tp = [this](double* data, int64_t n, bool max) {
      part_.tp->all_reduce(data, n, DType::kF64, max ? ReduceOp::kMax : ReduceOp::kSum);
    };
  logits_kl_forward_backward(student.data<float>(), teacher.data<float>() + part_.tp_rank() * Vl, T, Vl,
                             distill_.temperature, coef.data(), kl.data(), d.data<float>(), teacher_rows.data(), V,
                             over_tp);
  distill_kl_ += reduce_kl(kl, st.mask_sb, distill_.reduction);
  return d;
}

Tensor GPTModel::head_backward(State& st, float loss_scale) {
  Tensor d_y;
  // The cross-entropy's gradient (unless QAD or the head logits hook took it out), times the hook's factor.
  if (st.lse.defined())
    d_y = output_loss_backward(st.final_out_full, st.labels_sb, st.mask_sb,
                               static_cast<float>(loss_scale * st.lm_coef), st.lse, &st.head_saved);
  if (st.distill_grad.defined()) {  // QAD's KL term or the hook's logit gradient through the output layer
    float* g = st.distill_grad.data<float>();
    for (int64_t i = 0; i < st.distill_grad.numel(); ++i) g[i] *= loss_scale;
    round_logits(config_, st.distill_grad);  // the gradient of bf16 logits
    const Tensor d = linear_backward(st.distill_grad, st.final_out_full,
                                     LinearWeight{params_.param_data(output_w_), nullptr, nullptr,
                                                  params_.grad_data(output_w_), config_.vocab / part_.tp_size(),
                                                  config_.hidden, ops_->gemm});
    if (d_y.defined()) {
      float* o = d_y.data<float>();
      const float* e = d.data<float>();
      for (int64_t i = 0; i < d_y.numel(); ++i) o[i] += e[i];
    } else {
      d_y = d;
    }
    st.distill_grad = Tensor();
  }
  if (!d_y.defined()) d_y = Tensor::zeros({st.final_out_full.size(0), config_.hidden});  // no loss differentiated
  d_y = times(d_y, config_.mup.output_mult);  // --use-mup: the gradient of y through α·y
  st.final_out_full = st.lse = Tensor();
  d_y = part_.sequence_parallel ? gather_from_sequence_parallel_region_backward(d_y, *part_.tp)
                                : copy_to_tp_region_backward(d_y, *part_.tp);
  if (!st.mtp.empty()) {  // the MTP layers' gradient of the final norm's output
    const Tensor d_h0 = mtp_backward(st);
    float* d = d_y.data<float>();
    const float* e = d_h0.data<float>();
    for (int64_t i = 0; i < d_y.numel(); ++i) d[i] += e[i];
  }
  const Tensor d_x = norm_backward(final_norm_w_, final_norm_b_, d_y, st.final_in, st.final_stats);
  return part_.tp2d() ? gather_from_2d_piece_backward(d_x, *part_.tp_x, *part_.tp_y) : d_x;
}

Tensor GPTModel::whole_hidden(const Tensor& x) const {
  return part_.tp2d() ? gather_from_2d_piece(x, *part_.tp_x, *part_.tp_y) : x;
}

int64_t GPTModel::hidden_col_offset() const {
  return part_.tp2d() ? part_.tp_y->rank() * (config_.hidden / part_.tp_y->size()) : 0;
}

void GPTModel::mtp_forward(State& st, const Tensor& h0) {
  const ModelConfig& c = config_;
  const int64_t B = st.mb.B, S = st.mb.S, D = static_cast<int64_t>(mtp_.size());
  const bool sp = part_.sequence_parallel;
  Communicator& tp = *part_.tp;
  std::vector<int32_t> tokens = st.tokens_sb, positions = st.positions_sb, labels = st.labels_sb;
  std::vector<float> mask = st.mask_sb;
  std::vector<int32_t> doc_sb;  // packed sequences: each document rolls on its own ([S, B] order)
  if (st.mb.packed_sequences && !st.mb.document_ids.empty()) {
    GALE_CHECK(st.mb.key_document_ids.empty()) << "MTP over packed sequences under context parallelism";
    doc_sb.resize(static_cast<size_t>(S * B));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < S; ++s) doc_sb[s * B + b] = st.mb.document_ids[b * S + s];
  }
  // MTPLossAutoScaler: each MTP loss's gradient is the main loss's backward scale (the --fp16 loss
  // scale / micro-batches) times mtp_loss_scaling_factor / D / max(1, Σ mask_k). With
  // --calculate-per-token-loss (Megatron's process_mtp_loss in that mode) the scale is the --fp16
  // loss scale alone and the sum is multiplied by Σ mask / max(1, Σ mask_k) (this rank's mask
  // before and after the k-th roll), finalize_model_grads dividing by the global batch's tokens.
  const double backward_scale =
      per_token_loss_ ? static_cast<double>(grad_scale_)
                      : static_cast<double>(grad_scale_) / static_cast<double>(std::max<int64_t>(1, num_microbatches_));
  double original_tokens = 0.0;
  for (float v : st.mask_sb) original_tokens += v;
  st.mtp.resize(static_cast<size_t>(D));
  Tensor h = h0;
  for (int64_t k = 0; k < D; ++k) {
    const MtpParamIds& w = mtp_[static_cast<size_t>(k)];
    MtpSaved& m = st.mtp[static_cast<size_t>(k)];
    roll_left(tokens, S, B, doc_sb);
    roll_left(positions, S, B, doc_sb);
    roll_left(labels, S, B, doc_sb);
    roll_left(mask, S, B, doc_sb);
    double n = 0.0;
    for (float v : mask) n += v;
    // --embed-layernorm: the rolled ids' embedding goes through the same norm (MindSpeed-LLM's norm is
    // part of the embedding module the MTP block calls); its saved input is the depth's, not the decoder's.
    std::swap(st.emb_norm_in, m.emb_norm_in);
    std::swap(st.emb_norm_stats, m.emb_norm_stats);
    m.e = embedding_forward(st, tokens.data(), positions.data(), mtp_embedding_stream(c.seed, k));
    std::swap(st.emb_norm_in, m.emb_norm_in);
    std::swap(st.emb_norm_stats, m.emb_norm_stats);
    const Tensor en = norm_forward(w.enorm_w, w.enorm_b, m.e, &m.e_stats);
    const Tensor hn = norm_forward(w.hnorm_w, w.hnorm_b, h, &m.h_stats);
    m.h = h;
    const Tensor cat = concat_columns(en, hn);  // Megatron's order: the embedding first
    const Tensor cat_full = sp ? gather_from_sequence_parallel_region(cat, tp) : copy_to_tp_region(cat, tp);
    m.cat_full = to_gemm_input(cat_full, c.gemm_dtype());
    const LinearWeight eh_proj = linear_weight(params_, w.eh_proj_w, ops_->gemm, ops_->bf16_gemm);
    Tensor z = linear_forward(m.cat_full, eh_proj);  // [T, H/TP]
    z = gather_from_tp_region(z, tp);                // [T, H]
    if (sp) z = scatter_to_sequence_parallel_region(z, tp).clone();
    m.layers.resize(w.layers.size());
    for (size_t j = 0; j < w.layers.size(); ++j)
      z = transformer_layer_forward(st.rt, params_, w.layers[j], mtp_layer_index(c, k, static_cast<int64_t>(j)), z,
                                    &m.layers[j]);
    m.final_in = z;
    const Tensor hk = norm_forward(w.final_w, w.final_b, m.final_in, &m.final_stats);
    m.y_full = times(sp ? gather_from_sequence_parallel_region(hk, tp) : copy_to_tp_region(hk, tp),
                     c.mup.output_mult);  // --use-mup: Megatron scales the MTP logits too
    m.dloss_scale = static_cast<float>(c.mtp_loss_scaling_factor / static_cast<double>(D) / std::max(1.0, n) *
                                       (per_token_loss_ ? original_tokens : 1.0) * backward_scale);
    const double loss_sum =
        output_loss_forward(m.y_full, labels, mask, num_microbatches_ > 0 ? m.dloss_scale : 0.0f, &m.lse, &m.head_saved);
    mtp_losses_[static_cast<size_t>(k)] += n > 0.0 ? loss_sum / n : 0.0;
    m.tokens = tokens;
    m.positions = positions;
    m.labels = labels;
    m.mask = mask;
    h = hk;
  }
}

Tensor GPTModel::mtp_backward(State& st) {
  const ModelConfig& c = config_;
  const bool sp = part_.sequence_parallel;
  Communicator& tp = *part_.tp;
  Tensor dh;  // the gradient of h_k from MTP layer k + 1
  for (int64_t k = static_cast<int64_t>(mtp_.size()); k-- > 0;) {
    const MtpParamIds& w = mtp_[static_cast<size_t>(k)];
    MtpSaved& m = st.mtp[static_cast<size_t>(k)];
    Tensor d_y = times(output_loss_backward(m.y_full, m.labels, m.mask, m.dloss_scale, m.lse, &m.head_saved),
                       c.mup.output_mult);
    Tensor d_h = sp ? gather_from_sequence_parallel_region_backward(d_y, tp) : copy_to_tp_region_backward(d_y, tp);
    if (dh.defined()) {
      float* d = d_h.data<float>();
      const float* e = dh.data<float>();
      for (int64_t i = 0; i < d_h.numel(); ++i) d[i] += e[i];
    }
    const Tensor d_x = norm_backward(w.final_w, w.final_b, d_h, m.final_in, m.final_stats);
    Tensor d_z = d_x;
    for (size_t j = w.layers.size(); j-- > 0;)
      d_z = transformer_layer_backward(st.rt, params_, w.layers[j], mtp_layer_index(c, k, static_cast<int64_t>(j)),
                                       m.layers[j], d_z);
    if (sp) d_z = scatter_to_sequence_parallel_region_backward(d_z, tp);
    d_z = gather_from_tp_region_backward(d_z, tp);  // this rank's columns [T, H/TP]
    const LinearWeight eh_proj = linear_weight(params_, w.eh_proj_w, ops_->gemm, ops_->bf16_gemm);
    Tensor d_cat = linear_backward(d_z, m.cat_full, eh_proj);
    d_cat = sp ? gather_from_sequence_parallel_region_backward(d_cat, tp) : copy_to_tp_region_backward(d_cat, tp);
    Tensor d_en, d_hn;
    split_columns(d_cat, &d_en, &d_hn);
    const Tensor d_e = norm_backward(w.enorm_w, w.enorm_b, d_en, m.e, m.e_stats);
    std::swap(st.emb_norm_in, m.emb_norm_in);  // the depth's embedding-norm input (as in mtp_forward)
    std::swap(st.emb_norm_stats, m.emb_norm_stats);
    embedding_backward(st, m.tokens.data(), m.positions.data(), mtp_embedding_stream(c.seed, k), d_e);
    std::swap(st.emb_norm_in, m.emb_norm_in);
    std::swap(st.emb_norm_stats, m.emb_norm_stats);
    dh = norm_backward(w.hnorm_w, w.hnorm_b, d_hn, m.h, m.h_stats);
    m = MtpSaved();  // release
  }
  return dh;
}

std::vector<int> GPTModel::embedding_group_param_ids() const {
  if (part_.pre_process == part_.post_process) return {};  // one stage, or a middle one
  const bool mtp = config_.mtp_num_layers > 0;
  std::vector<int> ids;
  if (part_.pre_process) {
    if (config_.tied_embeddings || mtp) ids.push_back(word_emb_);
    if (mtp && pos_emb_ >= 0) ids.push_back(pos_emb_);
    if (mtp && emb_norm_w_ >= 0) ids.push_back(emb_norm_w_);  // --embed-layernorm: the norm's copy too
    if (mtp && emb_norm_b_ >= 0) ids.push_back(emb_norm_b_);
  } else if (mtp) {
    ids.push_back(word_emb_);
    if (pos_emb_ >= 0) ids.push_back(pos_emb_);
    if (emb_norm_w_ >= 0) ids.push_back(emb_norm_w_);
    if (emb_norm_b_ >= 0) ids.push_back(emb_norm_b_);
  } else if (config_.tied_embeddings) {
    ids.push_back(output_w_);
  }
  return ids;
}

std::vector<int> GPTModel::MtpParamIds::all() const {
  std::vector<int> ids;
  for (int id : {enorm_w, enorm_b, hnorm_w, hnorm_b, eh_proj_w})
    if (id >= 0) ids.push_back(id);
  for (const LayerParamIds& l : layers)
    for (int id : l.all()) ids.push_back(id);
  for (int id : {final_w, final_b})
    if (id >= 0) ids.push_back(id);
  return ids;
}

namespace {

// --automated-pipeline's measurement points (model/layer_profile.h): time and live allocator bytes.
struct ProfileMark {
  double seconds = 0.0;
  int64_t bytes = 0;
};

ProfileMark profile_mark() {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  return {std::chrono::duration<double>(now).count(), host_allocator().current_bytes()};
}

void record_forward(LayerProfiler* p, int64_t key, const ProfileMark& start, int64_t input_bytes) {
  const ProfileMark end = profile_mark();
  LayerCost& c = p->costs[key];
  c.forward_seconds += end.seconds - start.seconds;
  c.kept_bytes += end.bytes - start.bytes;
  c.input_bytes += input_bytes;
  ++c.forwards;
}

void record_backward(LayerProfiler* p, int64_t key, const ProfileMark& start) {
  LayerCost& c = p->costs[key];
  c.backward_seconds += profile_mark().seconds - start.seconds;
  ++c.backwards;
}

int64_t tensor_bytes(const Tensor& t) { return t.defined() ? t.numel() * dtype_size(t.dtype()) : 0; }

}  // namespace

Tensor GPTModel::forward(int64_t mb_id, const MicroBatch& mb, const Tensor& input, bool training, LossSums* loss,
                         const FullRecompute* full_recompute) {
  auto st = std::make_unique<State>();
  st->full_recompute = full_recompute ? *full_recompute : config_.full_recompute;
  build_runtime(*st, mb, training);
  std::vector<std::vector<int>> groups = params_needed_ ? backward_param_groups() : std::vector<std::vector<int>>{};
  auto need = [&] {  // the groups in forward order: the back of the backward order first
    if (!params_needed_) return;
    params_needed_(groups.at(groups.size() - 1));
    groups.pop_back();
  };
  if (part_.pre_process) need();
  // --automated-pipeline: this training forward's pieces are measured (not RiPipe's plans).
  LayerProfiler* const prof = training && !full_recompute && profiler_ && profiler_->recording ? profiler_ : nullptr;
  ProfileMark mark = prof ? profile_mark() : ProfileMark{};
  Tensor x = part_.pre_process
                 ? embedding_forward(*st, st->tokens_sb.data(), st->positions_sb.data(), dropout_stream(config_.seed, -1, 0))
                 : input;
  GALE_CHECK(x.defined()) << "a non-first pipeline stage needs its input activation";
  if (forward_observer_ && part_.pre_process && part_.post_process) st->decoder_input = x.clone();
  if (prof && part_.pre_process) record_forward(prof, LayerProfiler::kEmbedding, mark, 0);
  if (training) st->layers.resize(layers_.size());
  st->hidden_shape = x.shape();
  const int64_t L = static_cast<int64_t>(layers_.size());
  for (int64_t i = 0; i < L; ++i) {
    need();
    const auto [first, end] = st->full_recompute.group(i, L);
    const bool rerun = training && first < end;  // --recompute-granularity full: keep the group's input only
    if (prof) mark = profile_mark();
    const int64_t input_bytes = prof ? tensor_bytes(x) : 0;
    if (rerun && i == first) st->layers[i].x_in = keep_recompute_input(x);
    x = transformer_layer_forward(st->rt, params_, layers_[i], part_.first_layer + i, x,
                                  training && !rerun ? &st->layers[i] : nullptr);
    if (training && !rerun && swap_attention_.enabled) {
      if (!st->swap) {
        auto s = ActivationSwap::create(swap_attention_);
        GALE_CHECK(s.ok()) << s.status().message();
        st->swap = std::move(s).value();
      }
      st->swap->swap_out(i, st->layers[i]);
    }
    if (training && !rerun && smart_swap_ && smart_swap_->after_forward(mb_id, i, st->layers[i])) {
      if (!st->swap) {  // --smart-swap: a layer of its policy
        auto s = ActivationSwap::create(smart_swap_->swap_config());
        GALE_CHECK(s.ok()) << s.status().message();
        st->swap = std::move(s).value();
      }
      st->swap->swap_out(i, st->layers[i]);
    }
    if (training && !rerun && compress_.any()) {
      if (!st->compress) st->compress = std::make_unique<ActivationCompressor>(compress_);
      st->compress->compress(i, part_.first_layer + i, st->layers[i]);
    }
    if (prof) record_forward(prof, part_.first_layer + i, mark, input_bytes);
  }
  Tensor out;
  if (part_.post_process) {
    need();
    if (prof) mark = profile_mark();
    const int64_t input_bytes = prof ? tensor_bytes(x) : 0;
    head_forward(*st, x, loss, training);
    if (prof) record_forward(prof, LayerProfiler::kHead, mark, input_bytes);
  } else {
    out = x;
  }
  if (training) {
    GALE_CHECK(in_flight_.count(mb_id) == 0) << "micro-batch " << mb_id << " is already in flight";
    in_flight_[mb_id] = std::move(st);
  }
  return out;
}

void GPTModel::scale_loss_mask(int64_t mb_id, const std::vector<float>& per_sample) {
  auto it = in_flight_.find(mb_id);
  GALE_CHECK(it != in_flight_.end()) << "scale_loss_mask of micro-batch " << mb_id << " without its forward";
  GALE_CHECK(part_.post_process && mtp_.empty() && num_microbatches_ == 0)
      << "scale_loss_mask: last stage, no MTP, no eager LM-head backward";
  State& st = *it->second;
  const int64_t B = st.mb.B;
  GALE_CHECK_EQ(static_cast<int64_t>(per_sample.size()), B);
  for (size_t t = 0; t < st.mask_sb.size(); ++t) st.mask_sb[t] *= per_sample[t % static_cast<size_t>(B)];
}

void GPTModel::scale_loss_mask_tokens(int64_t mb_id, const std::vector<float>& per_token) {
  auto it = in_flight_.find(mb_id);
  GALE_CHECK(it != in_flight_.end()) << "scale_loss_mask_tokens of micro-batch " << mb_id << " without its forward";
  GALE_CHECK(part_.post_process && num_microbatches_ == 0)
      << "scale_loss_mask_tokens: last stage, no eager LM-head backward";
  State& st = *it->second;
  const int64_t B = st.mb.B, S = st.mb.S;
  GALE_CHECK_EQ(static_cast<int64_t>(per_token.size()), B * S);
  GALE_CHECK_EQ(static_cast<int64_t>(st.mask_sb.size()), B * S);
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) st.mask_sb[s * B + b] *= per_token[b * S + s];
}

Tensor GPTModel::forward_logits(const MicroBatch& mb_in, const Tensor& input, KvCache* cache) {
  GALE_CHECK(part_.post_process) << "logits exist only on the last pipeline stage";
  GALE_CHECK_EQ(part_.cp_size(), 1) << "logits of whole sequences are not computed with context parallelism";
  const ModelConfig& c = config_;
  MicroBatch mb = mb_in;
  if (cache) {  // the new positions follow the cached ones
    mb.S_global = cache->length + mb.S;
    mb.seq_positions.resize(static_cast<size_t>(mb.S));
    mb.position_ids.resize(static_cast<size_t>(mb.B * mb.S));
    for (int64_t s = 0; s < mb.S; ++s) {
      mb.seq_positions[s] = static_cast<int32_t>(cache->length + s);
      for (int64_t b = 0; b < mb.B; ++b) mb.position_ids[b * mb.S + s] = static_cast<int32_t>(cache->length + s);
    }
  }
  State st;
  build_runtime(st, mb, /*training=*/false, cache);
  if (c.longrope.enabled)  // whole sequences (cp 1) or decoding: LongRoPE's table by the total length, as HF
    st.rt.rope = longrope_use_long(c.longrope, true, st.positions_sb.data(), mb.B * mb.S) ? &rope_long_ : &rope_;
  if (params_needed_) {  // every parameter first, in forward order: nothing here to overlap with
    const std::vector<std::vector<int>> groups = backward_param_groups();
    for (auto g = groups.rbegin(); g != groups.rend(); ++g) params_needed_(*g);
  }
  Tensor x = part_.pre_process
                 ? embedding_forward(st, st.tokens_sb.data(), st.positions_sb.data(), dropout_stream(c.seed, -1, 0))
                 : input;
  for (size_t i = 0; i < layers_.size(); ++i)
    x = transformer_layer_forward(st.rt, params_, layers_[i], part_.first_layer + static_cast<int64_t>(i), x, nullptr);
  if (cache) cache->length += mb.S;
  const int64_t B = mb.B, S = mb.S, T = B * S, H = c.hidden;
  const int64_t tp = part_.tp_size(), Vl = c.vocab / tp;
  Tensor stats;
  Tensor y_full = times(final_norm_forward(whole_hidden(x), &stats), c.mup.output_mult);  // --use-mup
  Tensor local = linear_forward(y_full, LinearWeight{params_.param_data(output_w_), nullptr, nullptr, nullptr, Vl, H, ops_->gemm});
  finish_logits(c, local);
  // Gather the vocabulary slices: [TP, T, Vl] -> [B, S, V].
  Tensor slices = tp > 1 ? Tensor::empty({tp, T, Vl}) : local.view({1, T, Vl});
  if (tp > 1) part_.tp->all_gather(local.raw(), slices.raw(), local.numel(), DType::kF32);
  Tensor logits = Tensor::empty({B, S, c.vocab});
  const float* src = slices.data<float>();
  float* dst = logits.data<float>();
  for (int64_t r = 0; r < tp; ++r)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t b = 0; b < B; ++b)
        std::copy(src + (r * T + s * B + b) * Vl, src + (r * T + s * B + b + 1) * Vl, dst + (b * S + s) * c.vocab + r * Vl);
  return logits;
}

void GPTModel::forward_ragged_rows(const std::vector<int32_t>& tokens, RaggedKvBatch& batch,
                                   const std::vector<int64_t>& logit_rows, Tensor* hidden, Tensor* logits) {
  GALE_CHECK(part_.pre_process && part_.post_process && part_.tp_size() == 1 && part_.cp_size() == 1 && !part_.tp2d())
      << "ragged decoding runs the whole model on one process";
  const ModelConfig& c = config_;
  MicroBatch mb;
  mb.B = 1;
  mb.S = static_cast<int64_t>(tokens.size());
  mb.tokens = tokens;
  for (const RaggedRequest& r : batch.requests) {
    GALE_CHECK(r.rows > 0) << "ragged decoding: a request without new tokens";
    for (int64_t i = 0; i < r.rows; ++i) mb.seq_positions.push_back(static_cast<int32_t>(r.cached + i));
  }
  GALE_CHECK_EQ(static_cast<int64_t>(mb.seq_positions.size()), mb.S) << "ragged decoding: tokens and request rows";
  mb.position_ids = mb.seq_positions;
  State st;
  build_runtime(st, mb, /*training=*/false);
  st.rt.ragged_kv = &batch;
  if (c.longrope.enabled)  // decoding from a cache: LongRoPE's table by the batch's total length, as forward_logits
    st.rt.rope = longrope_use_long(c.longrope, true, st.positions_sb.data(), mb.S) ? &rope_long_ : &rope_;
  if (params_needed_) {
    const std::vector<std::vector<int>> groups = backward_param_groups();
    for (auto g = groups.rbegin(); g != groups.rend(); ++g) params_needed_(*g);
  }
  Tensor x = embedding_forward(st, st.tokens_sb.data(), st.positions_sb.data(), dropout_stream(c.seed, -1, 0));
  for (size_t i = 0; i < layers_.size(); ++i)
    x = transformer_layer_forward(st.rt, params_, layers_[i], part_.first_layer + static_cast<int64_t>(i), x, nullptr);
  Tensor stats;
  *hidden = final_norm_forward(x, &stats);  // [T, H]
  if (!logits) return;
  const int64_t n = static_cast<int64_t>(logit_rows.size()), H = c.hidden;
  Tensor picked = Tensor::empty({n, H});
  for (int64_t i = 0; i < n; ++i) {
    GALE_CHECK(logit_rows[i] >= 0 && logit_rows[i] < mb.S) << "ragged decoding: logits of row " << logit_rows[i];
    std::copy_n(hidden->data<float>() + logit_rows[i] * H, H, picked.data<float>() + i * H);
  }
  *logits = linear_forward(times(picked, c.mup.output_mult),  // --use-mup's output multiplier
                           LinearWeight{params_.param_data(output_w_), nullptr, nullptr, nullptr, c.vocab, H,
                                        ops_->gemm});
  finish_logits(c, *logits);  // --output-logit-dtype bf16
}

Tensor GPTModel::forward_logits_ragged(const std::vector<int32_t>& tokens, RaggedKvBatch& batch) {
  std::vector<int64_t> last_rows;  // each request's last new row
  int64_t row = 0;
  for (const RaggedRequest& r : batch.requests) last_rows.push_back((row += r.rows) - 1);
  Tensor hidden, logits;
  forward_ragged_rows(tokens, batch, last_rows, &hidden, &logits);
  return logits;
}

void GPTModel::mtp_single_position(int64_t k, const Tensor& h, const std::vector<int32_t>& ids,
                                   const std::vector<int32_t>& positions, Tensor* h_out, Tensor* logits) {
  GALE_CHECK(part_.pre_process && part_.post_process && part_.tp_size() == 1 && part_.cp_size() == 1 && !part_.tp2d())
      << "MTP drafts run the whole model on one process";
  GALE_CHECK(k >= 0 && k < static_cast<int64_t>(mtp_.size())) << "MTP layer " << k << " of " << mtp_.size();
  const ModelConfig& c = config_;
  const int64_t R = static_cast<int64_t>(ids.size());
  GALE_CHECK(R > 0 && static_cast<int64_t>(positions.size()) == R && h.size(0) == R && h.size(1) == c.hidden);
  // R samples of one position each: row t = s·B + b = r, and a sample's attention sees only itself.
  MicroBatch mb;
  mb.B = R;
  mb.S = 1;
  mb.tokens = ids;
  mb.position_ids = positions;
  State st;
  build_runtime(st, mb, /*training=*/false);
  if (c.longrope.enabled)  // a draft step of decoding: LongRoPE's table by the total length, as forward_logits
    st.rt.rope = longrope_use_long(c.longrope, true, st.positions_sb.data(), R) ? &rope_long_ : &rope_;
  const MtpParamIds& w = mtp_[static_cast<size_t>(k)];
  const Tensor e = embedding_forward(st, st.tokens_sb.data(), st.positions_sb.data(), mtp_embedding_stream(c.seed, k));
  Tensor e_stats, h_stats, f_stats;
  const Tensor en = norm_forward(w.enorm_w, w.enorm_b, e, &e_stats);
  const Tensor hn = norm_forward(w.hnorm_w, w.hnorm_b, h, &h_stats);
  const Tensor cat = to_gemm_input(concat_columns(en, hn), c.gemm_dtype());  // the embedding first, as in training
  const LinearWeight eh_proj = linear_weight(params_, w.eh_proj_w, ops_->gemm, ops_->bf16_gemm);
  const Tensor z = linear_forward(cat, eh_proj);  // [R, H]
  Tensor x = z;
  for (size_t j = 0; j < w.layers.size(); ++j)
    x = transformer_layer_forward(st.rt, params_, w.layers[j], mtp_layer_index(c, k, static_cast<int64_t>(j)), x, nullptr);
  *h_out = norm_forward(w.final_w, w.final_b, x, &f_stats);
  *logits = linear_forward(times(*h_out, c.mup.output_mult),  // --use-mup: Megatron scales the MTP logits too
                           LinearWeight{params_.param_data(output_w_), nullptr, nullptr, nullptr, c.vocab, c.hidden,
                                        ops_->gemm});
  finish_logits(c, *logits);  // --output-logit-dtype bf16, as the MTP heads' training logits
}

std::vector<std::pair<int64_t, MoeParamIds*>> GPTModel::enable_expert_placement() {
  std::vector<std::pair<int64_t, MoeParamIds*>> out;
  for (size_t i = 0; i < layers_.size(); ++i) {
    MoeParamIds& w = layers_[i].moe;
    if (!w.defined()) continue;
    w.placement = std::make_shared<MoePlacement>(config().moe.num_experts);
    out.emplace_back(part_.first_layer + static_cast<int64_t>(i), &w);
  }
  return out;
}

void GPTModel::reset_moe_global_aux() {
  for (LayerParamIds& w : layers_) {
    if (w.moe.global_aux) w.moe.global_aux->reset();
    if (w.moe.qb) w.moe.qb->reset();
  }
  for (auto& m : mtp_)
    for (LayerParamIds& l : m.layers) {
      if (l.moe.global_aux) l.moe.global_aux->reset();
      if (l.moe.qb) l.moe.qb->reset();
    }
}

std::pair<int, MoeQuantileBalancing*> GPTModel::moe_quantile_balancing(int64_t layer) const {
  const MoeParamIds* w = nullptr;
  if (const LayerParamIds* m = mtp_layer(layer)) {
    w = &m->moe;
  } else {
    const int64_t i = layer - part_.first_layer;
    if (i < 0 || i >= static_cast<int64_t>(layers_.size())) return {-1, nullptr};
    w = &layers_[static_cast<size_t>(i)].moe;
  }
  return {w->qb_beta, w->qb.get()};
}

int GPTModel::moe_expert_bias_id(int64_t layer) const {
  if (const LayerParamIds* m = mtp_layer(layer)) return m->moe.expert_bias;  // MTP layers: global layers num_layers ...
  const int64_t i = layer - part_.first_layer;
  if (i < 0 || i >= static_cast<int64_t>(layers_.size())) return -1;
  return layers_[static_cast<size_t>(i)].moe.expert_bias;
}

const LayerParamIds* GPTModel::mtp_layer(int64_t layer) const {
  const int64_t i = layer - config_.num_layers, P = config_.mtp_layers_per_depth();
  if (i < 0 || i >= static_cast<int64_t>(mtp_.size()) * P) return nullptr;
  return &mtp_[static_cast<size_t>(i / P)].layers[static_cast<size_t>(i % P)];
}

std::vector<std::vector<int>> GPTModel::backward_param_groups() const {
  // A layer's ids, with its routed experts' LoRA adapters (model/lora_expert.h; registered beside
  // the expert weights, found by name).
  auto layer_ids = [this](const LayerParamIds& w) {
    std::vector<int> ids = w.all();
    if (!config_.lora.enabled()) return ids;
    for (const std::vector<int>* experts : {&w.moe.fc1_w, &w.moe.fc2_w})
      for (int id : *experts)
        for (const std::string& name : {lora_a_name(params_.spec(id).name), lora_b_name(params_.spec(id).name)})
          if (const int found = params_.find(name); found >= 0) ids.push_back(found);
    return ids;
  };
  std::vector<std::vector<int>> groups;
  if (part_.post_process) {
    std::vector<int> head;
    for (int id : {final_norm_w_, final_norm_b_}) if (id >= 0) head.push_back(id);
    if (output_w_ >= 0 && output_w_ != word_emb_) head.push_back(output_w_);
    if (!part_.pre_process)  // the MTP stage's copies of the embedding (tied: the output layer too)
      for (int id : {word_emb_, pos_emb_, emb_norm_w_, emb_norm_b_}) if (id >= 0) head.push_back(id);
    for (const MtpParamIds& m : mtp_) {  // the MTP layers run with the head
      for (int id : m.all()) head.push_back(id);
      for (const LayerParamIds& l : m.layers)
        for (int id : layer_ids(l))
          if (is_lora_adapter(params_.spec(id).name) &&
              params_.spec(id).name.find(".local_experts.") != std::string::npos)
            head.push_back(id);  // the experts' adapters (the dense ones are in m.all())
    }
    groups.push_back(head);
  }
  for (size_t i = layers_.size(); i-- > 0;) groups.push_back(layer_ids(layers_[i]));
  if (part_.pre_process) {
    std::vector<int> emb;
    for (int id : {word_emb_, pos_emb_, emb_norm_w_, emb_norm_b_}) if (id >= 0) emb.push_back(id);
    groups.push_back(emb);
  }
  return groups;
}

Tensor GPTModel::keep_recompute_input(const Tensor& x) const {
  const int64_t tp = part_.tp_size(), n = x.numel();
  if (!config_.full_recompute.distribute || tp == 1 || n % tp != 0) return x;
  const int64_t part = n / tp;
  Tensor mine = Tensor::empty({part}, x.dtype());  // this rank's 1/TP of the flat elements, a copy
  const size_t es = static_cast<size_t>(dtype_size(x.dtype()));
  std::memcpy(mine.raw(), static_cast<const char*>(x.raw()) + static_cast<size_t>(part_.tp_rank() * part) * es,
              static_cast<size_t>(part) * es);
  return mine;
}

Tensor GPTModel::restore_recompute_input(const Tensor& kept, const Shape& shape) const {
  if (kept.shape() == shape) return kept;  // kept whole
  Tensor whole = Tensor::empty(shape, kept.dtype());
  GALE_CHECK_EQ(kept.numel() * part_.tp_size(), whole.numel());
  part_.tp->all_gather(kept.raw(), whole.raw(), kept.numel(), kept.dtype());
  return whole;
}

void GPTModel::recompute(int64_t mb_id) {
  auto it = in_flight_.find(mb_id);
  GALE_CHECK(it != in_flight_.end()) << "recompute of micro-batch " << mb_id << " without its forward";
  State& st = *it->second;
  if (st.recomputed) return;
  st.recomputed = true;
  const int64_t L = static_cast<int64_t>(layers_.size());
  for (int64_t i = 0; i < L; ++i) {
    const auto [first, end] = st.full_recompute.group(i, L);
    if (first == end || i != first) continue;
    FlopCountRecompute counted;  // --op-cal-tflops: counted with recompute only
    Tensor x = restore_recompute_input(st.layers[first].x_in, st.hidden_shape);
    for (int64_t j = first; j < end; ++j)
      x = transformer_layer_forward(st.rt, params_, layers_[j], part_.first_layer + j, x, &st.layers[j]);
  }
}

Tensor GPTModel::backward(int64_t mb_id, const Tensor& d_output, float loss_scale,
                          WeightGradStore* defer_weight_grads) {
  auto it = in_flight_.find(mb_id);
  GALE_CHECK(it != in_flight_.end()) << "backward of micro-batch " << mb_id << " without its forward";
  std::unique_ptr<State> st = std::move(it->second);
  in_flight_.erase(it);
  st->rt.weight_grads = defer_weight_grads;
  std::vector<std::vector<int>> groups = grad_ready_ ? backward_param_groups() : std::vector<std::vector<int>>{};
  size_t group = 0;
  auto ready = [&] {
    if (grad_ready_) grad_ready_(groups.at(group++));
  };
  Tensor d = d_output;
  LayerProfiler* const prof = profiler_ && profiler_->recording ? profiler_ : nullptr;  // --automated-pipeline
  ProfileMark mark = prof ? profile_mark() : ProfileMark{};
  if (part_.post_process) {
    d = head_backward(*st, loss_scale * grad_scale_);
    if (prof) record_backward(prof, LayerProfiler::kHead, mark);
    ready();
  }
  const int64_t L = static_cast<int64_t>(layers_.size());
  for (int64_t i = L; i-- > 0;) {
    const auto [first, end] = st->full_recompute.group(i, L);
    if (prof) mark = profile_mark();
    if (first < end && i == end - 1 && !st->recomputed) {  // rerun the group's forward from its kept input, keeping all
      FlopCountRecompute recompute;  // --op-cal-tflops: counted with recompute only
      Tensor x = restore_recompute_input(st->layers[first].x_in, d.shape());  // d has the input's shape
      for (int64_t j = first; j < end; ++j)
        x = transformer_layer_forward(st->rt, params_, layers_[j], part_.first_layer + j, x, &st->layers[j]);
    }
    if (config_.mhc.enabled && config_.recompute.mhc) {  // --recompute-modules mhc: at a block's last layer
      const auto [mhc_first, mhc_end] = mhc_recompute_block(config_.recompute, i, L);
      if (i == mhc_end - 1) mhc_recompute_block_forward(st->rt, part_.first_layer, mhc_first, mhc_end, st->layers);
    }
    if (smart_swap_) smart_swap_->before_backward(mb_id, i);  // --smart-swap: a segment boundary
    if (st->swap) {  // --swap-attention: this layer's activations back, the next one's read started
      st->swap->swap_in(i, st->layers[i]);
      if (i > 0) st->swap->prefetch(i - 1);
    }
    if (st->compress) st->compress->decompress(i, st->layers[i]);
    d = transformer_layer_backward(st->rt, params_, layers_[i], part_.first_layer + i, st->layers[i], d);
    if (prof) record_backward(prof, part_.first_layer + i, mark);
    ready();
  }
  if (st->compress) compress_stats_.add(st->compress->stats());
  if (part_.pre_process) {
    if (prof) mark = profile_mark();
    embedding_backward(*st, st->tokens_sb.data(), st->positions_sb.data(), dropout_stream(config_.seed, -1, 0), d);
    if (prof) record_backward(prof, LayerProfiler::kEmbedding, mark);
    ready();
    return Tensor();
  }
  return d;
}

}  // namespace gale
