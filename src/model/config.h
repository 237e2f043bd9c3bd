// The model's shape and behaviour (from the model flags), and this rank's share of it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "model/fp8.h"
#include "model/qat.h"
#include "model/ring_options.h"
#include "parallel/hybrid_cp_groups.h"

namespace gale {

// kAlibi: no embedding added to the tokens; attention adds the per-head bias m_h·(j − i)
// (AttentionProblem::alibi_slopes, --position-embedding-type alibi).
enum class PositionEmbedding { kLearnedAbsolute, kRope, kNone, kAlibi };

// --softmax-type (Megatron-Core's TransformerConfig.softmax_type; attention sinks, gpt-oss): the
// attention softmax of every standard and multi-latent attention layer (not DSA). kOffByOne adds a zero logit to each row
// (softmax_1: exp(x_i) / (1 + Σ_j exp(x_j))); kLearnable a learned logit per head, the parameter
// core_attention.softmax_offset [NH] (split over TP with the heads; AttentionProblem::softmax_offset).
enum class SoftmaxType { kVanilla, kOffByOne, kLearnable };

// Activations that backward recomputes instead of keeping from forward (MindSpeed's
// --recompute-activation-function and --recompute-norm, installed by their features): in the first
// `*_layers` layers of each model chunk (Megatron's order within the chunk; kAllLayers = every
// layer; 0 = none). The recomputation calls the same kernels on the same saved inputs, so the
// results equal the stored-activation run's.
//
// Megatron's --recompute-granularity selective --recompute-modules (every layer; `layernorm` is
// norm_layers = kAllLayers, `core_attn` needs nothing: attention probabilities are never kept):
//   mlp:            a dense layer's MLP keeps only its input (norm2's output on this rank's rows,
//                   before the sequence-parallel all-gather); backward reruns the gather, fc1 (and
//                   its LoRA branch), the activation (and fc2's LoRA branch) before going back;
//   moe_act:        the routed experts drop their activation outputs and recompute them from the
//                   kept fc1 outputs just before fc2's backward (as activation_layers does for the
//                   dense MLP);
//   shared_experts: the MoE shared expert keeps only its input and reruns its forward in backward;
//   moe:            a MoE layer keeps only its input (router, dispatch, experts and shared expert
//                   rerun in backward; the aux losses and expert-bias counts are counted by the
//                   first forward only);
//   mla_up_proj:    multi-latent attention drops its packed q/k/v rows (the up projections' outputs
//                   after RoPE) once attention has run, and rebuilds them from the kept latents in
//                   backward (model/mla_attention.h).
//   mhc:            --enable-mhc-connections (model/mhc_layer.h): the mHC layers drop the outputs
//                   Megatron's output-discarding checkpoints discard (each module's n-stream input
//                   except a recompute block's first, the aggregated sub-block inputs and the
//                   norms' outputs) and rebuild a block's at its last layer's backward, keeping the
//                   modules' mappings and the sub-blocks' outputs; blocks of mhc_layer_num layers
//                   (--mhc-recompute-layer-num; 0: the whole model chunk).
//
// MindSpeed's --moe-zero-memory (features/feature_moe_zero_memory.cc, model/moe_layer.h): what a
// MoE layer's routed experts drop in forward and rebuild in backward. kLevel0: the experts' input
// rows (the dispatched tokens, re-dispatched from the kept layer input in backward) and their
// activation outputs (recomputed from the kept fc1 outputs); kLevel1: also the fc1 outputs
// (recomputed from the re-dispatched rows) and the shared expert's state (rerun in backward).
enum class MoeZeroMemory { kOff, kLevel0, kLevel1 };

// --enable-mhc-connections (Megatron-Core's manifold-constrained hyper-connections, DeepSeek's mHC;
// model/hyper_connection.h, model/mhc_layer.h): every layer's attention and MLP each get a
// HyperConnectionModule over `streams` residual streams (--mhc-num-residual-streams), H_res projected
// by `sinkhorn_iterations` Sinkhorn-Knopp iterations (--mhc-sinkhorn-iterations), the alphas
// initialised to `init_gating_factor` (--mhc-init-gating-factor).
struct MhcConfig {
  bool enabled = false;
  int64_t streams = 4;
  int64_t sinkhorn_iterations = 20;
  float init_gating_factor = 0.01f;
};

struct RecomputePlan {
  static constexpr int64_t kAllLayers = INT64_MAX;
  int64_t activation_layers = 0;  // the MLP activation's output [T, F] (GeLU / SwiGLU of fc1's output)
  int64_t norm_layers = 0;        // both norms' outputs [T, H] (from the layer input and x_mid)
  bool mlp = false, moe_act = false, shared_experts = false, moe = false, mla_up_proj = false;
  // --moe-zero-memory; level1 only in the first moe_zero_memory_level1_layers layers of each model
  // chunk (--moe-zero-memory-num-layers), level0 in the others. (After the fields above, which
  // callers set positionally: {activation_layers, norm_layers}.)
  MoeZeroMemory moe_zero_memory = MoeZeroMemory::kOff;
  int64_t moe_zero_memory_level1_layers = kAllLayers;
  bool mhc = false;           // --recompute-modules mhc
  int64_t mhc_layer_num = 0;  // --mhc-recompute-layer-num (0: unset, one block of every layer)
};

// Megatron's --recompute-granularity full (--recompute-method, --recompute-num-layers): layers that
// keep nothing but the input of their group in forward; backward reruns the group's forward (same
// kernels, same dropout masks) before going back through it. Uniform: every layer, in groups of
// num_layers consecutive layers of the model chunk; block: each of the chunk's first num_layers
// layers on its own.
struct FullRecompute {
  enum class Method { kNone, kUniform, kBlock };
  Method method = Method::kNone;
  int64_t num_layers = 0;
  // --distribute-saved-activations: each TP rank keeps its 1/TP of a group's input (flat elements;
  // the whole input when they do not divide), all-gathered over TP before the rerun.
  bool distribute = false;
  // MindSpeed's --enable-recompute-layers-per-pp-rank (block): num_layers counts the layers of the
  // pipeline rank, spread over its `rank_chunks` virtual stages: layer i of chunk `chunk`
  // recomputes when i·rank_chunks + chunk < num_layers (MindSpeed's recompute priority).
  bool per_pp_rank = false;
  int64_t chunk = 0, rank_chunks = 1;

  // The group [first, end) of chunk-local layer i in a chunk of `chunk_layers`; first == end when
  // layer i is not recomputed.
  std::pair<int64_t, int64_t> group(int64_t i, int64_t chunk_layers) const {
    if (method == Method::kUniform && num_layers > 0) {
      const int64_t first = i / num_layers * num_layers;
      return {first, std::min(first + num_layers, chunk_layers)};
    }
    const int64_t priority = per_pp_rank ? i * rank_chunks + chunk : i;
    if (method == Method::kBlock && priority < num_layers) return {i, i + 1};
    return {i, i};
  }
};

// The load-balancing losses --moe-router-load-balancing-type can combine, in Megatron's order of
// application, with their type names and Megatron's tracker (logging) names.
enum MoeAuxKind : int { kMoeAux = 0, kMoeSeqAux = 1, kMoeGlobalAux = 2 };
inline constexpr int kMoeAuxKinds = 3;
inline constexpr const char* kMoeAuxTypes[kMoeAuxKinds] = {"aux_loss", "seq_aux_loss", "global_aux_loss"};
inline constexpr const char* kMoeAuxLossNames[kMoeAuxKinds] = {"load_balancing_loss", "seq_load_balancing_loss",
                                                               "global_load_balancing_loss"};

// Megatron-Core mixture of experts (--num-experts E): in the layers `pattern` marks, the MLP is a
// router (a bias-free linear H -> E), top-k routing and E expert MLPs (model/moe_layer.h).
struct MoeConfig {
  int64_t num_experts = 0;  // E; 0: every layer has the dense MLP
  int64_t topk = 2;         // --moe-router-topk
  int64_t ffn = 0;          // --moe-ffn-hidden-size (Fe), default --ffn-hidden-size
  // --moe-router-pre-softmax: the top-k probabilities are the softmax over all E experts; by
  // default (Megatron's) the top-k is taken on the logits and the softmax runs over those k.
  bool pre_softmax = false;
  // MindSpeed's --fix-router (for benchmarking a perfectly balanced load): the routing weights are
  // computed from the real top-k as usual, but pair j of local token row t goes to expert
  // (t·k + j) mod E instead of the one it chose (model/moe_router.h).
  bool fix_router = false;
  // Load-balancing loss coefficients by kind (--moe-router-load-balancing-type aux_loss,
  // seq_aux_loss, global_aux_loss, or a list of them, each with its --moe-aux-loss-coeff; 0: that
  // loss is off) and router z-loss coefficient (--moe-z-loss-coeff); 0 disables each. seq_aux_loss:
  // the load-balancing loss per sequence (DeepSeek's), averaged. global_aux_loss: the token counts
  // of the whole global batch so far (summed over TP×DP×CP, averaged over the step's micro-batches;
  // model/moe_router.h). Several at once add up (Megatron's list form).
  double aux_loss_coeff = 0.0;
  double seq_aux_loss_coeff = 0.0;
  double global_aux_loss_coeff = 0.0;
  double z_loss_coeff = 0.0;
  // --moe-router-score-function sigmoid (else softmax): scores = sigmoid(logits), the top-k on
  // scores (+ the expert bias), weights = the selected scores normalised to sum 1 when k > 1.
  bool sigmoid = false;
  // --moe-router-load-balancing-type sinkhorn (S-BASE, Megatron's sinkhorn_load_balancing): a
  // training forward takes the top-k of the Sinkhorn-balanced logits of the micro-batch's local
  // tokens, an evaluation forward the top-k of the scores; the scores are sigmoid(logits) when k = 1,
  // else softmax over all E, and the weights are the scores at the chosen experts (no aux loss,
  // bias, groups or scaling: model/moe_router.h).
  bool sinkhorn = false;
  // --moe-router-load-balancing-type quantile_balancing (Megatron main's QB): the experts of a
  // token are the top-k of l − qb_beta (a per-layer buffer [E]); a training forward also takes the
  // column quantile of the micro-batch's logits gathered over TP×CP (moe_qb_dual_update), and after
  // the step's backward passes qb_beta becomes qb_ema·qb_beta + (1 − qb_ema)·(the quantiles' mean
  // over the micro-batches and DP×CP), minus its mean (--moe-router-quantile-balancing-ema, default
  // 0). The weights are the score function's at the chosen experts (model/moe_router.h).
  bool quantile_balancing = false;
  double qb_ema = 0.0;
  // --moe-router-topk-scaling-factor (unset: 1): multiplies the routing weights.
  double topk_scaling_factor = 1.0;
  // --moe-router-num-groups / --moe-router-group-topk (0: no group-limited routing): experts in
  // num_groups equal groups, only the group_topk groups with the largest sums of their top
  // (k / group_topk) scores are eligible.
  int64_t num_groups = 0;
  int64_t group_topk = 0;
  // --moe-router-enable-expert-bias: a per-layer bias [E] (a buffer, no gradient) added to the
  // scores for the top-k choice only, moved by --moe-router-bias-update-rate after every step.
  bool expert_bias = false;
  double bias_update_rate = 1e-3;
  // --moe-expert-capacity-factor (0: dropless): each expert keeps at most
  // ceil(T·k/E·factor) of a micro-batch's T local tokens; --moe-token-drop-policy position keeps
  // the earliest (else the largest weights).
  double capacity_factor = 0.0;
  bool drop_by_position = false;
  // --moe-pad-expert-input-to-capacity: every expert gets exactly its capacity of rows, the
  // missing ones tokens that did not choose it, with weight 0.
  bool pad_to_capacity = false;
  // --moe-layer-freq as one flag per global layer (1: MoE); empty: every layer. Layer indices past
  // its end are the multi-token-prediction layers (ModelConfig::mtp_num_layers), which take the
  // last decoder layer's kind (Megatron builds them from the last layer's spec).
  std::vector<int> pattern;
  // --moe-shared-expert-intermediate-size (Fs, the total FFN size of the shared experts; 0: none)
  // and --moe-shared-expert-gate: every MoE layer's shared expert (model/moe_shared_expert.h).
  int64_t shared_ffn = 0;
  bool shared_gate = false;
  // --moe-shared-expert-overlap: the shared expert runs while the all-to-all dispatch of the
  // routed rows (backward: of their output gradients) is in flight; same results.
  bool shared_overlap = false;
  // --moe-input-jitter-eps (0: none): the router's input (only the router's: the experts see the
  // unjittered tokens) multiplied elementwise by noise in [1 − eps, 1 + eps) drawn from Gale's
  // Philox streams by (seed, layer, global token id, column), in training and evaluation as
  // Megatron (model/moe_router.h).
  double input_jitter_eps = 0.0;
  // --moe-router-force-load-balancing (Megatron's benchmark mode, apply_random_logits): the router's
  // logits are replaced by standard-normal values drawn from Gale's Philox streams by (seed, layer,
  // global token id, expert), in training and evaluation; their gradient passes straight through to
  // the real logits (model/moe_router.h).
  bool force_load_balancing = false;

  // The coefficient of load-balancing loss `kind` (MoeAuxKind) and whether any is on.
  double aux_coeff(int kind) const {
    return kind == kMoeAux ? aux_loss_coeff : kind == kMoeSeqAux ? seq_aux_loss_coeff : global_aux_loss_coeff;
  }
  bool any_aux_loss() const { return aux_loss_coeff > 0.0 || seq_aux_loss_coeff > 0.0 || global_aux_loss_coeff > 0.0; }

  bool enabled() const { return num_experts > 0; }
  bool is_moe_layer(int64_t layer) const {
    if (!enabled() || pattern.empty()) return enabled();
    const size_t i = std::min(static_cast<size_t>(layer), pattern.size() - 1);
    return pattern[i] != 0;
  }
};

// LoRA (MindSpeed-LLM's --lora-r, --lora-alpha, --lora-target-modules; model/lora.h): each
// targeted linear W [out, in] gains lora_A [r, in] and lora_B [out, r], and computes
// y = x·Wᵀ + (alpha / r)·(x·Aᵀ)·Bᵀ; every other parameter is frozen.
struct LoraConfig {
  int64_t r = 0;  // 0: no LoRA
  double alpha = 0.0;
  bool qkv = false, proj = false, fc1 = false, fc2 = false;  // the targeted linears
  bool in_proj = false, out_proj = false;  // a Gated DeltaNet mixer's projections (model/gated_delta_net.h)
  // --lora-modules-to-save (peft's modules_to_save): modules trained whole beside the adapters,
  // matched as peft does, by the module path or its last components (model/lora.h lora_saves_module).
  std::vector<std::string> modules_to_save;
  bool enabled() const { return r > 0 && (qkv || proj || fc1 || fc2 || in_proj || out_proj); }
  float scaling() const { return static_cast<float>(alpha / static_cast<double>(r)); }
};

// Megatron-Core's multi-latent attention (--multi-latent-attention; model/mla_attention.h): queries
// from x directly (q_lora_rank 0) or through a low-rank latent, keys and values of every head from
// one shared latent of kv_lora_rank plus a shared rotary key part of qk_pos_emb_head_dim.
struct MlaConfig {
  bool enabled = false;
  int64_t q_lora_rank = 0;           // 0: a direct query projection (Megatron's None)
  int64_t kv_lora_rank = 32;         // Ckv
  int64_t qk_head_dim = 128;         // Dn: the part of each query/key head without position embedding
  int64_t qk_pos_emb_head_dim = 64;  // R: the rotary part (the key's is shared by all heads)
  int64_t v_head_dim = 128;          // Dv
  bool qk_layernorm = false;         // --qk-layernorm: RMSNorm/LayerNorm on the two latents
  bool down_proj_fusion = false;     // --mla-down-proj-fusion (model/mla_down_proj.h)
  // RoPE of the rotary part: YaRN (--rope-type yarn, MLA's default) or plain (--rope-type rope);
  // YaRN with --rotary-scaling-factor s > 1 rescales frequencies and cos/sin (model/yarn_rope.h).
  bool yarn = true;
  double rotary_scaling_factor = 1.0;  // s
  double mscale = 1.0, mscale_all_dim = 0.0;
  // MLATransformerConfig's other YaRN fields are YarnConfig's defaults (no flags in the MLA path).

  int64_t q_head_dim() const { return qk_head_dim + qk_pos_emb_head_dim; }  // Dq = Dn + R
  // The head width the attention kernels run at: queries, keys and values zero-padded to one width.
  int64_t attention_head_dim() const { return std::max(q_head_dim(), v_head_dim); }
  // Megatron's MLA softmax scale: m(s, mscale_all_dim)² / sqrt(Dq), m(s, x) = 0.1·x·ln(s) + 1 for
  // s > 1 (whatever the rope type), else 1.
  float softmax_scale() const {
    const double m = rotary_scaling_factor <= 1.0 ? 1.0 : 0.1 * mscale_all_dim * std::log(rotary_scaling_factor) + 1.0;
    return static_cast<float>(m * m / std::sqrt(static_cast<double>(q_head_dim())));
  }
};

// YaRN RoPE of standard attention (--position-embedding-type yarn; Megatron-Core's
// YarnRotaryEmbedding in GPTModel; model/yarn_rope.h). The defaults are Megatron's (the yarn_* flags
// unset); MLA's YaRN uses the same tables with MlaConfig's factors and these defaults.
struct YarnConfig {
  bool enabled = false;
  double scaling_factor = 1.0;            // s (--rotary-scaling-factor)
  int64_t original_max_positions = 4096;  // --yarn-original-max-position-embeddings
  double beta_fast = 32.0;                // --yarn-beta-fast
  double beta_slow = 1.0;                 // --yarn-beta-slow
  double mscale = 1.0;                    // --mscale
  double mscale_all_dim = 0.0;            // --mscale-all-dim
  bool round_to_int = true;               // --[no-]yarn-correction-range-round-to-int
};

// LongRoPE of Phi-3 / Phi-3.5 (MindSpeed-LLM's --rope-scaling-type longrope; model/longrope_rope.h):
// two rotary tables, inv_freq_i = base^(−2i/R) / factor_i with the short or the long factors, cos/sin
// times that table's mscale. Which one a forward uses: LongRopeConfig::use_long.
struct LongRopeConfig {
  bool enabled = false;
  int64_t original_max_positions = 0;             // --rope-scaling-original-max-position-embeddings
  std::vector<double> short_factor, long_factor;  // --short-factor / --long-factor: one per rotary pair
  double short_mscale = 1.0, long_mscale = 1.0;   // the cos/sin scale of each table (resolved)
  // The training / evaluation forward: the long table iff --seq-length > original (MindSpeed-LLM's rule).
  bool long_without_cache = false;
};

// DeepSeek sparse attention (--experimental-attention-variant dsa; model/dsa_indexer.h): a lightning
// indexer per MLA layer picks each query's top-k keys, MLA attends only to them, and the indexer
// learns from a KL loss against the main attention (its inputs detached from the model).
struct DsaConfig {
  bool enabled = false;
  int64_t n_heads = 0;      // --dsa-indexer-n-heads (NI)
  int64_t head_dim = 0;     // --dsa-indexer-head-dim (DI ≥ --qk-pos-emb-head-dim)
  int64_t topk = 0;         // --dsa-indexer-topk (K)
  double loss_coeff = 0.0;  // --dsa-indexer-loss-coeff (0: no indexer loss; the indexer then does not learn)
  bool sparse_loss = false; // --dsa-indexer-use-sparse-loss: the KL over the selected keys only
};

// --is-hybrid-model (Megatron's MambaModel, pretrain_mamba.py): the decoder's layers follow `layers`,
// one symbol per global layer (model/hybrid_layers.h): 'M' a Mamba layer (model/mamba_mixer.h),
// '*' an attention-only, '-' an MLP-only and 'E' a MoE-only transformer layer (model/transformer_layer.h;
// MoeConfig::pattern marks the 'E' layers). The
// Mamba-2 mixer's sizes: d_inner = expand·hidden, nheads = d_inner / headdim, ngroups groups of B
// and C (each d_state wide), a causal depthwise convolution of width d_conv.
struct HybridConfig {
  bool enabled = false;
  std::string layers;
  int64_t d_state = 128;  // --mamba-state-dim
  int64_t headdim = 64;   // --mamba-head-dim
  int64_t ngroups = 8;    // --mamba-num-groups
  int64_t expand = 2;
  int64_t d_conv = 4;
  // --mamba-training-ssm-states-dtype (Megatron's None: the parameters' dtype, bf16 under --bf16, f16
  // under --fp16): the dtype in which training stores the scan's inter-chunk states, those entering
  // each chunk of chunk_size positions (Megatron's MambaMixer: 128) of the SSD algorithm; kF32 keeps
  // Gale's f32 scan (model/mamba_mixer.h).
  DType training_ssm_states = DType::kF32;
  int64_t chunk_size = 128;
  // Multi-token prediction (--hybrid-layer-pattern's block after '/', Megatron's hybrid MTP): the
  // symbols of one MTP depth's layers (M, * or -; "" without MTP). With ModelConfig::mtp_num_layers
  // D, depth k's layer j is global layer layers.size() + k·mtp.size() + j (model/gpt_model.h).
  std::string mtp;
  // The symbol of global layer `layer`: a decoder layer's, or an MTP layer's (0 past both).
  char kind(int64_t layer) const {
    const int64_t L = static_cast<int64_t>(layers.size()), P = static_cast<int64_t>(mtp.size());
    if (layer < 0) return 0;
    if (layer < L) return layers[static_cast<size_t>(layer)];
    return P > 0 ? mtp[static_cast<size_t>((layer - L) % P)] : 0;
  }
  bool is_mamba_layer(int64_t layer) const { return enabled && kind(layer) == 'M'; }
};

// Megatron's heterogeneous layers (--heterogeneous-layers-config-path / -encoded-json, the
// block_configs of a Llama-Nemotron NAS config.json; train/heterogeneous_config.h): what each
// sub-block (attention, MLP) of one layer is. kBlock: the usual sub-block with this layer's query
// groups / FFN size; kNoOp: the identity (no norm, no residual add, no parameters); kLinear: the
// residual x + dropout(norm(x)·Wᵀ (+ b)) with one W [H, H] (Megatron's ColumnParallelLinearGathered).
enum class SubBlock { kBlock, kNoOp, kLinear };
struct HeteroLayer {
  SubBlock attention = SubBlock::kBlock;
  int64_t kv_heads = 0;  // query groups of a kBlock attention
  SubBlock mlp = SubBlock::kBlock;
  int64_t ffn = 0;  // F of a kBlock MLP
};

// Megatron-Core's Gated DeltaNet linear attention (--experimental-attention-variant gdn /
// gated_delta_net; model/gated_delta_net.h): the layers whose pattern entry is 1 replace
// self-attention by the GDN mixer (--linear-attention-freq N: every N-th layer keeps full
// attention). Sizes: NK key heads and NV value heads (NV a multiple of NK) of DK and DV channels, a
// causal depthwise convolution of width K over q, k and v.
struct GdnConfig {
  bool enabled = false;
  std::vector<int> pattern;  // one entry per global layer: 1 GDN, 2 GDN2 (gdn2; not mixed with 1), 0 full attention
  int64_t conv_kernel = 4;      // --linear-conv-kernel-dim (K)
  int64_t key_head_dim = 128;   // --linear-key-head-dim (DK)
  int64_t value_head_dim = 128; // --linear-value-head-dim (DV)
  int64_t num_key_heads = 16;   // --linear-num-key-heads (NK)
  int64_t num_value_heads = 32; // --linear-num-value-heads (NV)
  bool is_gdn_layer(int64_t layer) const {
    return enabled && layer >= 0 && layer < static_cast<int64_t>(pattern.size()) &&
           pattern[static_cast<size_t>(layer)] != 0;
  }
};

// --use-mup (Megatron-Core's Maximal Update Parameterization; train/arguments_mup.cc resolves it
// as TransformerConfig.__post_init__ does). Disabled: every multiplier 1, no override. Enabled, the
// model's init_std is already the hidden weights' σ/√m (m = hidden / --mup-base-hidden-size), so the
// output projections' σ/√m/√(2L) is Megatron's mup_scaled_init_method_normal; the word and position
// embeddings and an untied output layer keep the unscaled σ (embedding_init_std).
struct MupConfig {
  bool enabled = false;
  double width_mult = 1.0;        // hidden / --mup-base-hidden-size
  float embedding_mult = 1.0f;    // the embedding's output × this (--mup-embedding-mult)
  float output_mult = 1.0f;       // the logits × this (--mup-output-mult; 1.0 resolves to 1/width_mult)
  float softmax_scale = 0.0f;     // > 0: attention's softmax scale √base_head_dim / kv_channels^power
  float embedding_init_std = 0.0f;  // > 0: the embeddings' (and untied output layer's) N(0, σ)
};

struct ModelConfig {
  int64_t num_layers = 0;         // L
  int64_t hidden = 0;             // H
  int64_t ffn = 0;                // F
  int64_t heads = 0;              // NH
  int64_t kv_heads = 0;           // KV (query groups)
  int64_t head_dim = 0;           // HD
  int64_t vocab = 0;              // V, padded
  int64_t seq_length = 0;         // S
  int64_t max_positions = 0;      // --max-position-embeddings
  bool rms_norm = false;
  float norm_eps = 1e-5f;
  bool swiglu = false;
  // --quick-geglu (Megatron main; gpt-oss): a gated MLP like SwiGLU whose gate goes through
  // quick_gelu(a) = a·σ(1.702·a) instead of SiLU (kernels/cpu/activation.h GluSpec).
  bool quick_geglu = false;
  // --glu-linear-offset: added to the gated MLP's linear half before the product (gpt-oss: 1.0).
  float glu_linear_offset = 0.0f;
  // --activation-func-clamp-value (> 0; 0: none): the gated MLP's gate is clamped from above and
  // its linear half to [−clamp, clamp] before the activation (gpt-oss: 7.0).
  float activation_clamp = 0.0f;
  bool openai_gelu = false;  // --openai-gelu: the MLP's GeLU is the tanh approximation
  // MindSpeed-LLM's --geglu / --gelu-tanh (Gemma): a gated MLP like SwiGLU whose gate goes through
  // GeLU, y = gelu(a)·b (model/geglu.h); the exact erf GeLU, or the tanh one when openai_gelu is
  // also set (--gelu-tanh sets both).
  bool geglu = false;
  // MindSpeed-LLM's --add-rmsnorm-offset: every RMSNorm scales by 1 + w (model/norm_weight.h), as
  // norm_weight_1p does, but its weights keep RMSNorm's initial value 1 (MindSpeed-LLM's init).
  bool rmsnorm_offset = false;
  // MindSpeed-LLM's --input-embeds-norm (Gemma's normalizer): the embedding's output (after its
  // dropout) × this, √hidden rounded to the training dtype; 1: none.
  float input_embeds_scale = 1.0f;
  // --embed-layernorm (MindSpeed-LLM, Bloom's word_embeddings_layernorm): the embedding's output is
  // normalised (the model's norm and epsilon; weights embedding.norm.weight/.bias) before its dropout.
  bool embed_layernorm = false;
  bool squared_relu = false;  // --squared-relu: the MLP's activation is max(x, 0)²
  // --apply-layernorm-1p: every norm weight w is stored zero-centred (initialised to 0) and the
  // norm scales by 1 + w (model/norm_weight.h); its gradient is the same as a plain weight's.
  bool norm_weight_1p = false;
  bool add_bias_linear = true;
  bool add_qkv_bias = false;
  // --qk-layernorm without MLA (Megatron-Core's q_layernorm/k_layernorm): every query and key head
  // normalised over its head_dim (norm type and eps as the layer norms) after linear_qkv, before RoPE.
  bool qk_layernorm = false;
  // --qk-l2-norm (Megatron main's L2Norm; Llama 4): every query and key head scaled by
  // rsqrt(mean(x²) + norm_eps) over its head_dim, without a weight (model/l2_norm.h), at the place of
  // the q/k layernorms (after linear_qkv, before RoPE); it replaces them (qk_layernorm is then false).
  bool qk_l2_norm = false;
  // --attention-output-gate (Megatron-Core; Qwen3-Next): linear_qkv also produces a gate per query
  // head, and attention's output is multiplied by its sigmoid before linear_proj
  // (model/attention_output_gate.h).
  bool attention_output_gate = false;
  MhcConfig mhc;  // --enable-mhc-connections
  // --qk-clip or --log-max-attention-logit: every core attention forward records its heads' largest
  // pre-softmax logit (LayerRuntime::max_attention_logits; model/qk_clip.h).
  bool track_max_attention_logit = false;
  SoftmaxType softmax_type = SoftmaxType::kVanilla;  // --softmax-type
  bool tied_embeddings = true;
  // --dist-train's forward-only sub-worlds: the embedding and the transformer layers of global index
  // below this are frozen (no gradient, no optimizer state); 0: none.
  int64_t frozen_layers = 0;
  PositionEmbedding position = PositionEmbedding::kLearnedAbsolute;
  double rotary_base = 10000.0;
  double rotary_percent = 1.0;
  double rope_scaling_factor = 0.0;  // > 0: Llama 3.1 RoPE scaling (--use-rope-scaling --rope-scaling-factor)
  bool rope_interleaved = false;     // --rotary-interleaved: pairs (2i, 2i+1) rotate (kernels/cpu/rope.h)
  double rope_position_scale = 1.0;  // RoPE angles at position p use p·scale (1 / --rotary-seq-len-interpolation-factor)
  // --no-rope-freq (Megatron-Core; Llama 4's NoPE layers): one entry per decoder layer, 1 where
  // that layer's attention skips RoPE; empty: RoPE in every layer (layer_rope).
  std::vector<int> no_rope_layers;
  // --position-embedding-type yarn: position stays kRope, the tables are YaRN's (the softmax scale
  // is unchanged: Megatron scales only cos/sin by the concentration factor outside MLA).
  YarnConfig yarn;
  LongRopeConfig longrope;  // --rope-scaling-type longrope: position stays kRope, the tables are LongRoPE's
  // --sliding-window W or --window-size W−1,0 (0: none): a windowed layer's query at position i sees
  // the keys at positions i − W + 1 .. i (AttentionProblem::window; Mistral-7B-v0.1's 4096).
  int64_t sliding_window = 0;
  // --window-attn-skip-freq (Megatron): one entry per decoder layer, 1 where that layer's attention
  // has the window, 0 where it is full causal attention; empty: every layer has it (layer_window).
  std::vector<int> window_layers;
  // Gemma-2 (MindSpeed-LLM's flags; 0 / false: off). --attn-logit-softcapping C: every attention
  // score s = scale·q·k becomes C·tanh(s / C) before the masks and the softmax
  // (AttentionProblem::softcap); --output-logit-softcapping C: the LM head's logits z become
  // C·tanh(z / C) before the cross-entropy and sampling (LmHeadProblem::logit_softcap);
  // --query-pre-attn-scalar N: softmax_scale() is 1/√N; --post-norm: every layer normalises its
  // attention output and its MLP output (weights post_attn_norm / post_mlp_layernorm, the model's norm
  // type and eps) before the bias, dropout and residual add.
  float attn_logit_softcapping = 0.0f;
  float output_logit_softcapping = 0.0f;
  int64_t query_pre_attn_scalar = 0;
  bool post_norm = false;
  float attention_dropout = 0.0f;
  float hidden_dropout = 0.0f;
  float init_std = 0.02f;
  // --init-method-xavier-uniform: every weight matrix that would be N(0, init_std) (or its scaled
  // output-layer variant) is U(−b, b) instead, b = √(6/(fan_in + fan_out)) of its global shape.
  bool init_xavier_uniform = false;
  MupConfig mup;  // --use-mup
  uint64_t seed = 1234;
  bool bf16 = false;  // --bf16: bf16 weights and GEMM inputs, f32 master weights and gradients
  // --reuse-fp32-param (with bf16): the linear layers' f32 masters stored as their bf16 copy plus
  // a 16-bit residual, the other parameters without a bf16 copy (ParamBuffer::enable_gemm_copy)
  bool reuse_fp32_param = false;
  bool fp16 = false;  // --fp16: the same with f16 (and dynamic loss scaling in the trainer)
  // --output-logit-dtype bf16: the output layer's GEMM result (the logits) rounded to bf16 before the
  // loss, and their gradient rounded to bf16 before the output layer's backward (kernels/op_table.h
  // LmHeadProblem::bf16_logits); false: f32 logits.
  bool bf16_logits = false;
  RecomputePlan recompute;
  FullRecompute full_recompute;
  MoeConfig moe;
  LoraConfig lora;
  MlaConfig mla;
  HybridConfig hybrid;  // --is-hybrid-model
  DsaConfig dsa;  // with mla.enabled
  GdnConfig gdn;  // --experimental-attention-variant gdn
  // --qat-scheme / --qat-quant-block-size (model/qat.h): MX fake-quantised linear weights.
  QatConfig qat;
  // --fp8-format and the other FP8 flags (model/fp8.h): FP8-emulated linear GEMMs. num_layers is
  // filled in by the model.
  Fp8Config fp8;
  // MindSpeed's --noop-layers: global indices (sorted) of layers that are the identity, with no
  // parameters; they keep their place in the layer numbering and in the pipeline split.
  std::vector<int64_t> noop_layers;
  // --mtp-num-layers D (0: none) and --mtp-loss-scaling-factor: DeepSeek-V3 multi-token prediction
  // after the decoder (model/gpt_model.h). The MTP layers' transformer layers are global layers
  // num_layers .. num_layers + D - 1 (dropout streams, MoE kind: MoeConfig::is_moe_layer); a hybrid
  // model's are D depths of HybridConfig::mtp's layers (mtp_layers_per_depth() each).
  int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;
  // Heterogeneous layers: one entry per decoder layer; empty: every layer as the flags say.
  std::vector<HeteroLayer> hetero;

  int64_t rot_dim() const {
    return mla.enabled ? mla.qk_pos_emb_head_dim : static_cast<int64_t>(head_dim * rotary_percent);
  }
  // What the attention kernels see: with MLA every head has its own keys and values (no groups) of
  // the padded width mla.attention_head_dim(), scaled by 1/sqrt(Dn + R); otherwise HD and KV groups.
  int64_t attention_head_dim() const { return mla.enabled ? mla.attention_head_dim() : head_dim; }
  int64_t attention_kv_heads() const { return mla.enabled ? heads : kv_heads; }
  // MLA keeps its own scale (Megatron's MLA ignores config.softmax_scale); otherwise 1/√N with
  // --query-pre-attn-scalar N, --use-mup's, or 1/√HD.
  float softmax_scale() const {
    if (mla.enabled) return mla.softmax_scale();
    if (query_pre_attn_scalar > 0) return 1.0f / std::sqrt(static_cast<float>(query_pre_attn_scalar));
    return mup.softmax_scale > 0.0f ? mup.softmax_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  // The N(0, σ) of the word / position embeddings and an untied output layer (--use-mup: unscaled).
  float embedding_init_std() const { return mup.embedding_init_std > 0.0f ? mup.embedding_init_std : init_std; }
  // Rotary tables are built with RoPE, and always with MLA (its rotary part).
  // The type GEMM inputs and the weights' GEMM copy are stored in: kBF16, kF16 or kF32.
  DType gemm_dtype() const { return bf16 ? DType::kBF16 : fp16 ? DType::kF16 : DType::kF32; }
  bool uses_rope_tables() const { return position == PositionEmbedding::kRope || mla.enabled; }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  // A gated MLP (Megatron's gated_linear_unit): fc1 holds [gate; linear half], each F rows.
  bool gated() const { return swiglu || quick_geglu || geglu; }
  int64_t fc1_out() const { return gated() ? 2 * ffn : ffn; }  // fc1 rows before TP split
  // Layer `layer`'s sub-blocks, query groups and FFN size (the model-wide ones without hetero and
  // for the MTP layers past the decoder).
  const HeteroLayer* hetero_layer(int64_t layer) const {
    return layer >= 0 && layer < static_cast<int64_t>(hetero.size()) ? &hetero[static_cast<size_t>(layer)] : nullptr;
  }
  int64_t layer_kv_heads(int64_t layer) const {
    const HeteroLayer* h = hetero_layer(layer);
    return h && h->attention == SubBlock::kBlock ? h->kv_heads : kv_heads;
  }
  int64_t layer_ffn(int64_t layer) const {
    const HeteroLayer* h = hetero_layer(layer);
    return h && h->mlp == SubBlock::kBlock ? h->ffn : ffn;
  }
  // This config with layer `layer`'s query groups and FFN size (what its sub-blocks are built with).
  ModelConfig for_layer(int64_t layer) const {
    ModelConfig l = *this;
    l.kv_heads = layer_kv_heads(layer);
    l.ffn = layer_ffn(layer);
    return l;
  }
  // Whether layer `layer` differs from the model-wide sizes (then for_layer builds it).
  bool layer_differs(int64_t layer) const { return layer_kv_heads(layer) != kv_heads || layer_ffn(layer) != ffn; }
  SubBlock attention_kind(int64_t layer) const {
    const HeteroLayer* h = hetero_layer(layer);
    return h ? h->attention : SubBlock::kBlock;
  }
  SubBlock mlp_kind(int64_t layer) const {
    const HeteroLayer* h = hetero_layer(layer);
    return h ? h->mlp : SubBlock::kBlock;
  }
  // Whether global layer `layer`'s attention applies RoPE (--no-rope-freq).
  bool layer_rope(int64_t layer) const {
    return no_rope_layers.empty() || layer >= static_cast<int64_t>(no_rope_layers.size()) ||
           no_rope_layers[static_cast<size_t>(layer)] == 0;
  }
  // The sliding window of global layer `layer`'s attention (0: none; --sliding-window / --window-size
  // and --window-attn-skip-freq).
  int64_t layer_window(int64_t layer) const {
    const bool windowed = window_layers.empty() || layer >= static_cast<int64_t>(window_layers.size()) ||
                          window_layers[static_cast<size_t>(layer)] != 0;
    return windowed ? sliding_window : 0;
  }
  // The window every attention layer has (0 when a layer has none): the band of the union of the
  // layers' masks, which is what context parallelism's adaptive layout may assume.
  int64_t common_window() const {
    return std::all_of(window_layers.begin(), window_layers.end(), [](int v) { return v != 0; }) ? sliding_window : 0;
  }
  bool is_noop_layer(int64_t layer) const {
    return std::binary_search(noop_layers.begin(), noop_layers.end(), layer);
  }
  // Layers with a MoE MLP (a --noop-layers layer has none), the MTP layers' included (Megatron
  // counts them for the auxiliary losses' mean).
  int64_t num_moe_layers() const {
    int64_t n = 0;
    for (int64_t i = 0; i < num_layers; ++i) n += moe.is_moe_layer(i) && !is_noop_layer(i) ? 1 : 0;
    for (int64_t i = num_layers; i < num_layers + mtp_num_layers * mtp_layers_per_depth(); ++i)
      n += moe.is_moe_layer(i) ? 1 : 0;
    return n;
  }
  // The layers of one MTP depth: a hybrid model's MTP pattern's (HybridConfig::mtp), else 1.
  int64_t mtp_layers_per_depth() const {
    return hybrid.enabled && !hybrid.mtp.empty() ? static_cast<int64_t>(hybrid.mtp.size()) : 1;
  }
};

// The LLaMA architecture on top of `c`'s sizes: RMSNorm, SwiGLU, RoPE, no linear biases, an untied
// output layer (what --normalization RMSNorm --swiglu --position-embedding-type rope
// --disable-bias-linear --untie-embeddings-and-output-weights select).
inline void use_llama_architecture(ModelConfig& c) {
  c.rms_norm = true;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.tied_embeddings = false;
  c.position = PositionEmbedding::kRope;
}

// Which part of the model this process holds: its tensor-parallel slice and its pipeline stage.
struct ModelPartition {
  Comm tp;                         // tensor-parallel group (size 1 without TP)
  bool sequence_parallel = false;  // activations outside attention/MLP split along S inside the TP group
  int64_t first_layer = 0;         // global index of this chunk's first layer
  int64_t num_layers = 0;          // layers in this chunk
  bool pre_process = true;         // holds the embedding (first pipeline stage)
  bool post_process = true;        // holds the final norm, output layer and loss (last stage)
  // Context-parallel group (null or size 1 without CP): its ranks hold different positions of the
  // same sequences (parallel/context_split.h); attention exchanges keys and values over it (ring
  // or all-gather) and the loss sums over it.
  Comm cp;
  // --context-parallel-algo ulysses_cp_algo: attention runs on whole sequences for 1/CP of this TP
  // rank's heads, after an all-to-all from the sequence split to a head split (and back).
  bool cp_ulysses = false;
  // --use-ulysses-allgather-kv (with cp_ulysses, one query group per TP rank): only the queries go
  // through the all-to-all; the keys and values are all-gathered over cp (MindSpeed's AllGatherComm).
  bool cp_ulysses_allgather_kv = false;
  // --cp-comm-type p2p (megatron_cp_algo): ring attention (model/ring_attention.h), the key/value
  // blocks passed around the cp group; false: all-gather of keys and values (allgather).
  bool cp_ring = false;
  // --context-parallel-algo adaptive_cp_algo (with cp_ring): every micro-batch arrives sliced with
  // an explicit layout (MicroBatch::cp_layout, parallel/adaptive_cp.h), whose empty blocks the ring skips.
  bool cp_adaptive = false;
  // --context-parallel-algo hybrid_cp_algo (parallel/hybrid_cp_groups.h): the cp group factored
  // into Ulysses sub-groups of U = --ulysses-degree-in-cp consecutive cp ranks and ring sub-groups
  // of CP/U ranks; attention runs an all-to-all within the Ulysses group (1/U of this TP rank's
  // heads, the positions of the whole group), ring attention over the ring group, and the
  // all-to-all back. Both null otherwise.
  HybridCpGroups cp_hybrid;
  // Ring attention (cp_ring, or hybrid's ring sub-group): --cp-window-size W, MindSpeed's double
  // ring (windows of W consecutive ranks of the ring group; 1: one ring), and
  // --context-parallel-kv-cache-policy with --context-parallel-cache-interval (the layers whose
  // forward keeps the key/value blocks it received for backward). model/ring_options.h.
  int64_t cp_window = 1;
  RingKvCache cp_kv_cache = RingKvCache::kNone;
  int64_t cp_cache_interval = 0;
  // Expert-parallel group (null or size 1 without EP): its ranks hold different experts of every
  // MoE layer (E/EP each, EP rank r the global experts r·E/EP ...) and exchange tokens over it
  // (model/moe_dispatch.h).
  Comm ep;
  // --moe-token-dispatcher-type allgather (else alltoall) with EP > 1 (model/moe_layer.h).
  bool ep_allgather = false;
  // --balanced-moe-experts: M = --trans-hot-expert-group-num duplicates of `ep` (same ranks, same
  // order) the hot experts' replicas are broadcast and their gradients returned on (the transfers
  // of the experts of EP rank o on duplicate o mod M; model/moe_hot_experts.h). Empty otherwise.
  std::vector<Comm> ep_hot_groups;
  // Expert-tensor-parallel group (null or size 1: whole experts): the MoE experts' fc1/fc2 are
  // split over it (--expert-tensor-parallel-size, default TP; model/moe_layer.h).
  Comm etp;
  // The group a MoE layer's tokens are split over (TP under --sequence-parallel, times CP; null or
  // size 1: none): the auxiliary losses are reduced over it (Megatron's sequence_partition_group).
  Comm moe_seq;
  // --moe-router-load-balancing-type global_aux_loss: the stage's TP×DP×CP group its token counts
  // are summed over (Megatron's tp_dp_cp_group; null or size 1: none).
  Comm moe_global_aux;

  // --tp-2d (parallel/tp2d_groups.h, model/tp2d_layer.h): the TP group as an X×Y grid, TP rank
  // r = x + X·y; tp_x holds the X ranks with this rank's y, tp_y the Y ranks with its x. The
  // transformer layers' activations are [T/X, H/Y] pieces and their linears 2-D sharded; the
  // embedding and the output layer keep the 1-D path over `tp`. Both null otherwise.
  Comm tp_x, tp_y;
  bool tp2d() const { return tp_x != nullptr; }

  int64_t tp_size() const { return tp ? tp->size() : 1; }
  int64_t tp_rank() const { return tp ? tp->rank() : 0; }
  int64_t cp_size() const { return cp ? cp->size() : 1; }
  int64_t cp_rank() const { return cp ? cp->rank() : 0; }
  int64_t ep_size() const { return ep ? ep->size() : 1; }
  int64_t ep_rank() const { return ep ? ep->rank() : 0; }
  bool hybrid_cp() const { return cp_hybrid.ulysses != nullptr; }
  // The ring options of global layer `layer` (negative: none cached, e.g. a forward without backward).
  RingOptions ring_options(int64_t layer) const {
    return {cp_window, layer < 0 ? RingKvCache::kNone : ring_kv_cache_of_layer(cp_kv_cache, cp_cache_interval, layer)};
  }
};

// The whole model on one process.
ModelPartition single_process_partition(const ModelConfig& config);

}  // namespace gale
