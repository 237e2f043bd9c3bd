// The GPT model (Megatron-Core GPTModel): embedding, transformer layers, final norm, output layer
// and cross-entropy loss, with explicit forward and backward per micro-batch.
//
// One GPTModel is one model chunk: all layers with one process, or one pipeline stage's layers
// (the embedding only on the first stage, the head and loss only on the last). Activations
// between chunks are [Tl, H] (T = S·B tokens, row t = s·B + b; Tl = T/TP with sequence
// parallelism; S is this rank's share of the sequence with context parallelism, see
// model/micro_batch.h). Several micro-batches may be in flight at once (pipeline schedules): forward
// stores the saved state of micro-batch `mb_id` and backward(mb_id) consumes it.
//
// Multi-token prediction (--mtp-num-layers D, Megatron-Core's MultiTokenPredictionBlock, DeepSeek-V3;
// no context parallelism): in training forwards the last stage runs D MTP layers
// after the decoder's final norm. With h_0 the final norm's output and ids, positions, labels and
// loss mask rolled left by one more position per layer (Megatron's roll_tensor: the last position
// gets id 0, label 0, mask 0), MTP layer k = 1..D ("mtp.layers.{k-1}.") computes
//   e_k = embedding(ids_k, positions_k)  (the shared embedding, its dropout included, and with
//         --embed-layernorm its norm: MindSpeed-LLM's PP 1 behaviour, kept at every layout)
//   z_k = eh_proj([enorm(e_k), hnorm(h_{k-1})])  (concatenated along H: embedding first; eh_proj
//         [H, 2H] without bias, column-parallel with its output gathered over TP)
//   h_k = final_layernorm(transformer_layer(z_k))  (a layer like the decoder's: global layer index
//         num_layers + k - 1, MoE when the last decoder layer is; a hybrid model's MTP depth runs
//         its pattern's layers instead, HybridConfig::mtp, "mtp.layers.{k-1}.mtp_model_layer.layers.{j}.",
//         global layers num_layers + (k - 1)·P + j for the P symbols j of the pattern after '/')
//   ℓ_k = cross-entropy of the shared output layer's logits of h_k against labels_k,
//         L_k = Σ mask_k·ℓ_k / max(1, Σ mask_k)
// and backward adds the gradient of (mtp_loss_scaling_factor / D)·Σ_k L_k, times grad_scale() /
// num_microbatches (Megatron's MTPLossAutoScaler), to the LM loss's; the LM loss itself (LossSums)
// is unchanged. Evaluation forwards skip the MTP layers. With pipeline parallelism the MTP layers are
// on the last stage (the last virtual chunk), which then holds a copy of the first stage's embedding
// (embedding_group_param_ids; with --embed-layernorm of its norm too) and embeds the rolled ids itself.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "kernels/op_table.h"
#include "model/activation_compress.h"
#include "model/activation_swap.h"
#include "model/smart_swap.h"
#include "model/config.h"
#include "model/head_logits_hook.h"
#include "model/layer_profile.h"
#include "model/logits_kl.h"
#include "model/micro_batch.h"
#include "model/params.h"
#include "model/transformer_layer.h"
#include "model/weight_grad_store.h"

namespace gale {

class GPTModel {
 public:
  GPTModel(const ModelConfig& config, const ModelPartition& part, const OpTable* ops);
  ~GPTModel();
  GPTModel(const GPTModel&) = delete;
  GPTModel& operator=(const GPTModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelPartition& partition() const { return part_; }
  // The transformer layers of this chunk (noop layers included).
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  ParamBuffer& params() { return params_; }
  const ParamBuffer& params() const { return params_; }
  // The op table the model calls (features may swap it before training starts).
  void set_ops(const OpTable* ops) { ops_ = ops; }
  const OpTable& ops() const { return *ops_; }

  // Σ ℓ·mask and Σ mask over this micro-batch's tokens (last stage only); with context
  // parallelism over the whole sequences (summed over the cp group), on every cp rank.
  struct LossSums {
    double loss_sum = 0.0;
    double tokens = 0.0;
    // Σ ℓ·mask of each sample [B] (sample order of the MicroBatch): the negated sum of the
    // log-probabilities of its masked labels (DPO, train/dpo.h); with context parallelism over the
    // whole sequences, on every cp rank (one all-reduce with loss_sum).
    std::vector<double> sample_loss_sums;
    // Σ mask of each sample [B] (its label count), over the whole sequences likewise.
    std::vector<double> sample_tokens;
    // Each token's loss ℓ = −log p(label) [B, S] sample-major, masked or not (GRPO's per-token
    // log-probabilities, train/grpo.h); this rank's positions (no context parallelism).
    std::vector<double> token_losses;
  };

  // Forward of one micro-batch. `input` is the previous stage's output [Tl, H] (ignored on the
  // first stage). Returns this chunk's output [Tl, H]; on the last stage returns an empty tensor
  // and fills `loss`. With `training` the state for backward(mb_id) is kept (and dropout is on).
  // `full_recompute` (training; null: the configured ModelConfig::full_recompute) replaces the
  // full-recompute plan for this micro-batch only (the RiPipe schedules: keep everything, or only
  // the chunk input with all layers one group); backward and recompute() follow it.
  Tensor forward(int64_t mb_id, const MicroBatch& mb, const Tensor& input, bool training, LossSums* loss,
                 const FullRecompute* full_recompute = nullptr);

  // Reruns now, from their kept inputs, the forwards of the layer groups micro-batch `mb_id`
  // recomputes (--recompute-granularity full, or the plan forward was given), keeping their
  // activations, so that its backward reruns nothing: MindSpeed's RiPipe schedules run it ahead
  // of the backward, while the gradient is still on its way. Same kernels and dropout masks as the
  // backward-triggered rerun, so the gradients are bit-identical. A no-op when there is nothing to
  // rerun or it already ran.
  void recompute(int64_t mb_id);

  // Backward of micro-batch `mb_id`. On the last stage the gradient of the loss with respect to
  // token t's loss is loss_scale·grad_scale()·mask[t] (Megatron: 1 / (Σ mask · num_microbatches),
  // times the loss scale), and
  // `d_output` is ignored; on other stages `d_output` [Tl, H] is the next stage's input gradient.
  // Accumulates parameter gradients; returns the gradient of `input` (empty on the first stage).
  // With `defer_weight_grads` (--dualpipev-dw-detach) the dense transformer layers' linear weight
  // gradients are queued there (model/weight_grad_store.h) and accumulate when the caller pops them;
  // every other gradient accumulates now.
  Tensor backward(int64_t mb_id, const Tensor& d_output, float loss_scale,
                  WeightGradStore* defer_weight_grads = nullptr);

  // DPO (train/dpo.h): multiplies the loss mask of in-flight training micro-batch `mb_id` by
  // per_sample[b] for each sample b, so that backward(mb_id, {}, 1) starts every token t of sample
  // b from the per-token loss gradient grad_scale()·per_sample[b]·mask[t]. Needs the forward to have
  // run with set_num_microbatches(0) (no eager fused LM-head backward), no MTP layers; last stage
  // only. With context parallelism each cp rank scales its own positions.
  void scale_loss_mask(int64_t mb_id, const std::vector<float>& per_sample);
  // GRPO (train/grpo.h): the same with one factor per token, per_token [B, S] sample-major, so that
  // backward(mb_id, {}, 1) starts token (b, s) from grad_scale()·per_token[b·S + s]·mask. Same
  // conditions, but MTP layers may be there: their losses keep the mask of the forward (their
  // backward scale is grad_scale() at the forward); with context parallelism S and s are this
  // rank's positions of the micro-batch.
  void scale_loss_mask_tokens(int64_t mb_id, const std::vector<float>& per_token);

  // Evaluation forward returning the logits [B, S, V] over the whole (padded) vocabulary, in
  // sample-major order (for generation and golden tests). Last stage only; nothing is kept.
  // With `cache` (model/kv_cache.h; no context parallelism): mb holds only the next mb.S tokens of
  // each sample, which come after cache->length cached positions (their position ids are set
  // here); their keys and values join the cache and cache->length advances by mb.S.
  Tensor forward_logits(const MicroBatch& mb, const Tensor& input, KvCache* cache = nullptr);

  // Ragged decoding of several requests at once (model/kv_cache.h RaggedKvBatch; the whole model on
  // one process): `tokens` are the requests' new tokens, request r's rows after request r − 1's, at
  // positions cached .. cached + rows − 1 of their own sequences. Every linear layer runs over all
  // the rows together; attention runs per request against its blocks, which gain the new keys and
  // values. Returns the logits [R, V] of each request's last new row (the next-token prediction);
  // the caller advances each request's `cached` by its rows. A request's logits are those of
  // forward_logits with a KvCache holding the same positions (tests/train/inference_engine_test.cc).
  Tensor forward_logits_ragged(const std::vector<int32_t>& tokens, RaggedKvBatch& batch);
  // Speculative decoding (--num-speculative-tokens, train/inference_engine.h): the ragged forward's
  // final-norm output of EVERY row [T, H] (the MTP layers' h_0) and, when `logits` is not null, the
  // logits [n, V] of the n rows `logit_rows` (indices into the T rows, in that order).
  void forward_ragged_rows(const std::vector<int32_t>& tokens, RaggedKvBatch& batch,
                           const std::vector<int64_t>& logit_rows, Tensor* hidden, Tensor* logits);
  // The MTP layers built (--mtp-num-layers; 0 without).
  int64_t num_mtp_layers() const { return static_cast<int64_t>(mtp_.size()); }
  // One draft of MTP layer k (0-based) for R requests at once, each a sequence of ONE position
  // (Megatron's forward_single_position: no KV cache, the position attends to itself): row r takes
  // the previous depth's h [R, H] (the decoder's final-norm output for k = 0), token ids[r] at
  // position positions[r]; *h_out gets h_k [R, H] (its final layernorm's output), *logits the
  // shared output layer's [R, V]. Whole model on one process.
  void mtp_single_position(int64_t k, const Tensor& h, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& positions, Tensor* h_out, Tensor* logits);

  // Called during backward with the ids of parameters whose gradient contribution from the
  // micro-batch being back-propagated is complete (after the head, after each layer, after the
  // embedding), so data-parallel reduction of a bucket can start while backward continues
  // (--overlap-grad-reduce). Unset: nothing is called.
  using GradReadyFn = std::function<void(const std::vector<int>& param_ids)>;
  void set_grad_ready_fn(GradReadyFn fn) { grad_ready_ = std::move(fn); }
  // Parameter ids of global-order groups as backward completes them (for bucket planning):
  // head (last stage), each layer from last to first, embedding (first stage).
  std::vector<std::vector<int>> backward_param_groups() const;

  // Called during forward (and forward_logits) with the ids of the parameters about to be read —
  // the embedding's, each layer's, the head's, in forward order (backward_param_groups reversed) —
  // so that the distributed optimizer's parameter all-gather of a bucket can finish just before
  // its first use (--overlap-param-gather). Unset: nothing is called.
  using ParamsNeededFn = std::function<void(const std::vector<int>& param_ids)>;
  void set_params_needed_fn(ParamsNeededFn fn) { params_needed_ = std::move(fn); }
  // The number of micro-batches of the current iteration, set by the schedule before the first
  // forward. With it the last stage knows each micro-batch's loss gradient (Megatron's
  // 1 / (Σ mask · num_microbatches)) already at forward time, so a fused LM head may finish its
  // backward inside forward (no logits kept). 0 (the default) disables that.
  void set_num_microbatches(int64_t n) { num_microbatches_ = n; }
  // --fp16's loss scale (optim/grad_scaler.h), set by the trainer before each training iteration:
  // every loss gradient backward starts from (the LM loss's per-token scale and the MoE auxiliary
  // losses' coefficients) is multiplied by it, so every parameter gradient comes out multiplied by
  // it. 1 (the default) changes nothing.
  void set_grad_scale(float s) { grad_scale_ = s; }
  // --calculate-per-token-loss: every micro-batch's loss gradient starts from scale 1 (its summed
  // token loss; micro_batch_loss_scale), as the schedules' backward and the eager fused LM head
  // use it. Off (the default): Megatron's 1 / (Σ mask · num_microbatches).
  void set_per_token_loss(bool on) { per_token_loss_ = on; }
  // --config-logger-dir (train/config_logger.h, Megatron's input_and_logits dump): called by every
  // forward of a last stage (training and evaluation; not forward_logits) with the micro-batch, the
  // embedding's output after its dropout (this rank's rows [Tl, H] in [S, B] order; undefined
  // unless the stage is also the first) and this rank's logits [T, V/TP] ([S, B] rows) from the output layer's f32
  // weights — an extra GEMM, done only while an observer is set.
  using ForwardObserver = std::function<void(const MicroBatch& mb, const Tensor& decoder_input, const Tensor& logits)>;
  void set_forward_observer(ForwardObserver fn) { forward_observer_ = std::move(fn); }
  // --swap-attention / --swap-layer-input (model/activation_swap.h): training forwards write each
  // layer's attention activations and/or its input to a file and backward reads them back, one
  // layer ahead. Off by default.
  void set_swap_attention(const SwapAttentionConfig& c) { swap_attention_ = c; }
  // --smart-swap (model/smart_swap.h; not owned, outlives the model's training): told where each
  // training forward's layers end and backward's begin, it decides which layers are swapped out
  // (through the same ActivationSwap as --swap-attention). Null (the default): off.
  void set_smart_swap(SmartSwap* s) { smart_swap_ = s; }
  // --automated-pipeline (model/layer_profile.h; not owned, outlives the model's training): while
  // its `recording` is set, training forwards and backwards add each piece's (embedding, layer,
  // head) wall time and kept bytes to it. Null (the default): off. Not with recompute plans.
  void set_layer_profiler(LayerProfiler* p) { profiler_ = p; }
  // --compress-activation / --compress-dense (model/activation_compress.h): training forwards keep
  // the selected layers' saved activations losslessly compressed until their backward. Off by
  // default. activation_compress_stats(): what was compressed, summed over the backwards so far.
  void set_activation_compress(const ActivationCompressConfig& c) { compress_ = c; }
  const CompressStats& activation_compress_stats() const { return compress_stats_; }
  bool per_token_loss() const { return per_token_loss_; }
  float grad_scale() const { return grad_scale_; }

  // Σ over the MoE layers of this chunk and the training micro-batches since the last call of each
  // layer's auxiliary losses (without coefficients; model/moe_layer.h); resets the sums.
  MoeAuxLosses take_moe_losses() {
    const MoeAuxLosses l = moe_losses_;
    moe_losses_ = MoeAuxLosses{};
    return l;
  }

  // Σ over the DSA layers of this chunk and the training micro-batches since the last call of the
  // indexer loss (coefficient included; model/dsa_indexer.h); resets the sum.
  double take_dsa_indexer_loss() {
    const double l = dsa_indexer_loss_;
    dsa_indexer_loss_ = 0.0;
    return l;
  }

  // QAD (MindSpeed's --qad-enable, features/feature_qad.cc): a frozen teacher model whose logits
  // the student's are distilled towards. With a teacher set, every training forward of this chunk
  // (the whole model) also runs the teacher's forward_logits on the same micro-batch
  // (evaluation mode: no dropout, nothing kept, no gradients), and the objective differentiated is
  // weight · KL_mb (model/logits_kl.h: τ² · KL(teacher ‖ student) per token, reduced over the
  // micro-batch's loss mask by `reduction`) instead of the cross-entropy, which is still computed
  // and reported (LossSums) for logging only (MindSpeed's KL-only QAD). Backward scales that
  // gradient by the schedule's loss scale: with "mean" it is 1 / (Σ mask · num_microbatches), i.e.
  // each micro-batch's term 1 / num_microbatches; with "sum" the Σ mask is multiplied back in.
  // Under --qat-scheme the student's logits come from its fake-quantised weights, the teacher's
  // from plain ones (its config has no QAT). Evaluation forwards are unchanged (cross-entropy).
  // Under tensor parallelism each rank holds its vocabulary slice of the student's logits and takes
  // the same columns of the teacher's (whose forward_logits gathers the whole vocabulary); the KL's
  // row maxima, exponential sums and per-token sums are all-reduced over TP (model/logits_kl.h), so
  // every TP rank has the whole-vocabulary KL. Set on the chunk with the head (the last pipeline
  // stage's); the teacher is a whole model (every layer, the embedding and the head) with this
  // rank's TP group. No context or 2-D tensor parallelism, no MTP (GALE_CHECKed; the feature
  // refuses the flags first).
  struct Distillation {
    GPTModel* teacher = nullptr;  // nullptr: no distillation
    double temperature = 1.0;     // --kl-temperature
    double weight = 1.0;          // --kl-loss-weight
    KlReduction reduction = KlReduction::kMean;  // --kl-loss-reduction
  };
  void set_distillation(const Distillation& d) { distill_ = d; }
  // Σ over the training micro-batches since the last call of KL_mb (reduced, without the weight:
  // MindSpeed's "kl loss" metric); resets the sum.
  double take_distillation_kl() {
    const double l = distill_kl_;
    distill_kl_ = 0.0;
    return l;
  }

  // Megatron main's offline distillation (--logits-save-dir / --logits-load-dir,
  // train/logits_kd_hooks.h; not owned, outlives training): every training forward of this chunk's
  // head hands it the logits and follows its Result (model/head_logits_hook.h). Null (the default):
  // off. Not with QAD, MTP, context or 2-D tensor parallelism (GALE_CHECKed; pretrain refuses first).
  void set_head_logits_hook(HeadLogitsHook* h) { logits_hook_ = h; }
  HeadLogitsHook* head_logits_hook() const { return logits_hook_; }

  // --moe-router-enable-expert-bias: per MoE layer of this chunk (global index) the (token,
  // expert) pairs each expert kept in the training forwards since the last call ([E]); resets them.
  std::map<int64_t, std::vector<int64_t>> take_moe_token_counts() {
    std::map<int64_t, std::vector<int64_t>> n;
    n.swap(moe_token_counts_);
    return n;
  }
  // --qk-clip / --log-max-attention-logit (config.track_max_attention_logit): per transformer layer of
  // this chunk (global index; the MTP layers' too) the largest pre-softmax logit of each of this TP
  // rank's heads over every forward since the last call ([NHl], -inf where none was seen); resets them.
  std::map<int64_t, std::vector<float>> take_max_attention_logits() {
    std::map<int64_t, std::vector<float>> m;
    m.swap(max_attention_logits_);
    return m;
  }
  // The ids of this chunk's transformer layers' parameters (layer i is global layer part.first_layer + i).
  const std::vector<LayerParamIds>& layer_param_ids() const { return layers_; }
  // --enable-expert-placement: gives each MoE transformer layer of this chunk (not the MTP layers)
  // a placement, the identity (model/expert_placement.h), and returns (global layer, its ids).
  std::vector<std::pair<int64_t, MoeParamIds*>> enable_expert_placement();
  // Zeroes every MoE layer's (and MTP layer's) global_aux_loss token counts and quantile_balancing
  // quantile sums: before a step's passes.
  void reset_moe_global_aux();
  // The expert-bias buffer of global layer `layer` (-1: none on this chunk); the MTP layers are
  // global layers num_layers ... num_layers + D - 1.
  int moe_expert_bias_id(int64_t layer) const;
  // quantile_balancing: the qb_beta buffer of global layer `layer` and its step's quantile sums
  // ({-1, null}: none on this chunk); MTP layers as above.
  std::pair<int, MoeQuantileBalancing*> moe_quantile_balancing(int64_t layer) const;

  // --mtp-num-layers: per MTP layer, Σ over the training micro-batches since the last call of L_k
  // (its loss-mask mean cross-entropy; Megatron's MTPLossLoggingHelper tracker); resets the sums.
  // Empty without MTP layers on this chunk.
  std::vector<double> take_mtp_losses() {
    std::vector<double> l = mtp_losses_;
    std::fill(mtp_losses_.begin(), mtp_losses_.end(), 0.0);
    return l;
  }

  // Number of micro-batches whose forward state is held.
  size_t in_flight() const { return in_flight_.size(); }

  // Ids of the embedding parameters (-1 when absent on this chunk). On a last pipeline stage with
  // MTP layers the embedding ids are its copies of the first stage's (the output weight too when tied).
  int word_embedding_id() const { return word_emb_; }
  int position_embedding_id() const { return pos_emb_; }
  int output_weight_id() const { return output_w_; }
  // The parameters whose gradients are summed over the embedding group (the first and last
  // pipeline stage, Megatron's _allreduce_word_embedding_grads), in the same order on both: on the
  // first stage the word embedding when tied or with MTP layers (and then the learned position
  // embedding, which Megatron's MTP refuses; Gale keeps its copy equal too), on the last stage its
  // copies (tied without MTP: the output weight). Empty on one-stage models and middle stages.
  // On the last stage they are copies: not saved, not counted in the gradient norm.
  std::vector<int> embedding_group_param_ids() const;

 private:
  struct State;
  void build_runtime(State& st, const MicroBatch& mb, bool training, KvCache* cache = nullptr) const;
  // The embedding of `tokens` at `positions` ([S, B] order), its dropout from stream `stream`.
  Tensor embedding_forward(State& st, const int32_t* tokens, const int32_t* positions, uint64_t stream);
  void embedding_backward(State& st, const int32_t* tokens, const int32_t* positions, uint64_t stream,
                          const Tensor& d);
  // Norm of x [rows, H] with weight w and bias b (-1: none); fills *stats.
  Tensor norm_forward(int w, int b, const Tensor& x, Tensor* stats) const;
  Tensor norm_backward(int w, int b, const Tensor& dy, const Tensor& x, const Tensor& stats);
  // Σ ℓ·mask of the output layer's cross-entropy of y_full [T, H] against `labels` (merged over
  // the vocabulary slices). `dloss_scale` > 0: the per-token loss gradient is dloss_scale·mask and
  // a fused head may finish its backward now. With `lse` non-null the state for backward is kept.
  // `sample_sums` (optional, B entries): Σ ℓ·mask of each sample (token t = s·B + b);
  // `token_losses` (optional, [B, S] sample-major): every token's ℓ.
  double output_loss_forward(const Tensor& y_full, const std::vector<int32_t>& labels,
                             const std::vector<float>& mask, float dloss_scale, Tensor* lse, Tensor* saved,
                             std::vector<double>* sample_sums = nullptr, int64_t B = 1,
                             std::vector<double>* token_losses = nullptr);
  // Its backward for per-token loss gradient dloss_scale·mask: returns d y_full [T, H].
  Tensor output_loss_backward(const Tensor& y_full, const std::vector<int32_t>& labels,
                              const std::vector<float>& mask, float dloss_scale, const Tensor& lse, Tensor* saved);
  // The MTP layers' forward from h_0 [Tl, H] (training: state kept) and backward (returns d h_0).
  void mtp_forward(State& st, const Tensor& h0);
  Tensor mtp_backward(State& st);
  // Final norm of x [Tl, H], gathered to [T, H] for the column-parallel output layer; *local (when
  // given) gets the norm's output before the gather [Tl, H].
  Tensor final_norm_forward(const Tensor& x, Tensor* stats, Tensor* local = nullptr) const;
  // --tp-2d: the whole [T, H] of a layer piece [T/X, H/Y] (x itself otherwise), and the first
  // column of this rank's piece (0 otherwise; hidden dropout's column offset).
  Tensor whole_hidden(const Tensor& x) const;
  int64_t hidden_col_offset() const;
  void head_forward(State& st, const Tensor& x, LossSums* loss, bool keep);
  Tensor head_backward(State& st, float loss_scale);
  // QAD: the teacher's logits for st.mb, the KL term (added to distill_kl_) and the per-logit
  // gradient of weight·KL_mb before the schedule's loss scale [T, V] (set_distillation).
  Tensor distillation_forward(const State& st, const Tensor& y_full);
  // --recompute-granularity full: the group input x as kept (with --distribute-saved-activations
  // this TP rank's 1/TP of its flat elements), and back to `shape` (an all-gather over TP).
  Tensor keep_recompute_input(const Tensor& x) const;
  Tensor restore_recompute_input(const Tensor& kept, const Shape& shape) const;

  ModelConfig config_;
  ModelPartition part_;
  const OpTable* ops_;
  ParamBuffer params_;
  RopeTables rope_;       // with LongRoPE: the short factors' table
  RopeTables rope_long_;  // LongRoPE's long factors' table (empty otherwise; model/longrope_rope.h)
  std::vector<float> alibi_slopes_;  // --position-embedding-type alibi: the slopes of all c.heads heads
  std::vector<float> zero_softmax_offset_;  // --softmax-type off-by-one: c.heads zero sink logits
  int word_emb_ = -1, pos_emb_ = -1, final_norm_w_ = -1, final_norm_b_ = -1, output_w_ = -1;
  int emb_norm_w_ = -1, emb_norm_b_ = -1;  // --embed-layernorm (first stage; with MTP the last stage's copy)
  std::vector<LayerParamIds> layers_;
  // --mtp-num-layers: each MTP layer's parameters (last stage).
  struct MtpParamIds {
    int enorm_w = -1, enorm_b = -1, hnorm_w = -1, hnorm_b = -1, eh_proj_w = -1, final_w = -1, final_b = -1;
    std::vector<LayerParamIds> layers;  // the depth's layers: one, or a hybrid MTP pattern's
    std::vector<int> all() const;
  };
  // MTP layer `layer` (a global index past the decoder's), or null.
  const LayerParamIds* mtp_layer(int64_t layer) const;
  std::vector<MtpParamIds> mtp_;
  std::vector<double> mtp_losses_;
  std::map<int64_t, std::unique_ptr<State>> in_flight_;
  GradReadyFn grad_ready_;
  ParamsNeededFn params_needed_;
  ForwardObserver forward_observer_;
  int64_t num_microbatches_ = 0;
  float grad_scale_ = 1.0f;
  bool per_token_loss_ = false;
  SwapAttentionConfig swap_attention_;
  SmartSwap* smart_swap_ = nullptr;
  LayerProfiler* profiler_ = nullptr;
  ActivationCompressConfig compress_;
  CompressStats compress_stats_;
  mutable MoeAuxLosses moe_losses_;  // build_runtime hands layers a pointer to it
  mutable double dsa_indexer_loss_ = 0.0;  // likewise
  Distillation distill_;      // QAD: the teacher and the KL options
  double distill_kl_ = 0.0;   // Σ KL_mb since take_distillation_kl
  HeadLogitsHook* logits_hook_ = nullptr;  // offline distillation (set_head_logits_hook)
  mutable std::map<int64_t, std::vector<int64_t>> moe_token_counts_;  // and to this
  mutable std::map<int64_t, std::vector<float>> max_attention_logits_;  // and to this (every forward)
};

}  // namespace gale
