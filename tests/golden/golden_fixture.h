// Loader for the golden fixtures of tools/reference/gpt_reference.py (tests/data/golden/<name>/).
//
// A fixture is one tiny model configuration run by an independent float64 PyTorch implementation
// of docs/model.md: its initial weights, token batches, the logits/loss/gradients of one forward and
// backward pass, and a 10-iteration training run. Tests compare Gale against it:
//
//   GALE_ASSIGN_OR_RETURN(golden::GoldenFixture f, golden::GoldenFixture::load("gpt"));
//   model.load(f.initial_weights());                              // Megatron names -> f32 tensors
//   golden::GoldenBatch b = f.batch(0, 0);                        // tokens, labels, loss_mask, ... [B, S]
//   EXPECT_TRUE(golden::compare_tensors(my_logits, f.logits(), 1e-4, 1e-5).ok());
//   for (auto& [name, g] : f.grads()) ...                         // or f.grad_summaries() for variants
//   f.train_series().loss[k], .lr[k], .grad_norm[k]               // iteration k+1's logged values
//   golden::check_summary(my_final[name], f.final_param_summaries().at(name), &f.initial_weight(name), ...)
//
// The fixture names are in golden_fixture_names(); tools/reference/README.md describes each.
// tests/golden/model_golden_test.cc runs Gale's model and trainer against all of them.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace gale::golden {

// GALE_TEST_DATA_DIR "/golden".
std::string golden_dir();
// Every committed fixture: "gpt", "llama", "llama_rope50", "gpt_docmask", "gpt_sgd", "gpt_muon",
// "llama_muon", "mixtral".
std::vector<std::string> golden_fixture_names();

// The model, in Megatron's argument names (docs/model.md glossary in comments).
struct GoldenModelConfig {
  int num_layers = 0;           // L
  int hidden_size = 0;          // H
  int num_attention_heads = 0;  // NH
  int num_query_groups = 0;     // KV (= NH without GQA)
  bool group_query_attention = false;
  int kv_channels = 0;      // HD
  int ffn_hidden_size = 0;  // F
  int seq_length = 0;       // S
  int max_position_embeddings = 0;
  int tokenizer_vocab_size = 0;  // token ids are in [0, this)
  int make_vocab_size_divisible_by = 0;
  int padded_vocab_size = 0;            // V
  std::string position_embedding_type;  // "learned_absolute", "rope" or "alibi"
  double rotary_percent = 1.0;
  double rotary_base = 10000;
  std::string normalization;  // "LayerNorm" or "RMSNorm"
  double norm_epsilon = 0;
  bool swiglu = false;
  bool add_bias_linear = true;
  bool untie_embeddings_and_output_weights = false;
  bool reset_attention_mask = false;
  bool reset_position_ids = false;
  double init_method_std = 0;
  bool attention_output_gate = false;  // --attention-output-gate: linear_qkv has NH·HD more rows
  std::string softmax_type = "vanilla";  // --softmax-type; learnable: core_attention.softmax_offset [NH]
  // Mixture of experts (0 experts: dense MLPs): every layer's MLP is a router and these experts.
  int num_experts = 0;
  int moe_router_topk = 0;
  int moe_ffn_hidden_size = 0;
  double moe_aux_loss_coeff = 0, moe_z_loss_coeff = 0;
};

struct GoldenTrainingConfig {
  std::string optimizer;  // "adam" or "sgd"
  double lr = 0, min_lr = 0, lr_warmup_init = 0;
  int lr_warmup_iters = 0, lr_decay_iters = 0;
  std::string lr_decay_style;
  double adam_beta1 = 0, adam_beta2 = 0, adam_eps = 0, sgd_momentum = 0;
  double weight_decay = 0, clip_grad = 0;
  int micro_batch_size = 0, global_batch_size = 0, train_iters = 0;
  int num_microbatches() const { return micro_batch_size ? global_batch_size / micro_batch_size : 0; }
};

// One micro-batch, each tensor [B, S]: int64 ids and positions, f32 loss mask.
// document_ids (int64) is defined only with --reset-attention-mask: token i may attend to token
// j <= i only when document_ids are equal.
struct GoldenBatch {
  Tensor tokens, labels, loss_mask, position_ids, document_ids;
};

// Float64 statistics of a reference tensor, and some of its elements (row-major flat indices).
struct TensorSummary {
  int64_t numel = 0;
  double norm = 0, sum = 0, abs_max = 0;
  std::vector<int64_t> sample_index;
  std::vector<double> sample_value;
  std::optional<double> update_norm;  // final parameters only: ||final - initial||
};

// The logged values of each training iteration (index k is iteration k+1), as Megatron's log line
// reports them: loss = global token mean, lr = rate after the step, grad_norm = before clipping.
struct GoldenSeries {
  std::vector<double> loss, lr, grad_norm;
  std::vector<double> lr_used;              // the rate the step of that iteration applied
  std::vector<double> loss_differentiated;  // mean over micro-batches of each micro-batch's masked mean
  // MoE fixtures (empty otherwise): the logged auxiliary losses of each iteration, without their
  // coefficients (Megatron's tracker: Σ over micro-batches / their number, mean over MoE layers).
  std::vector<double> load_balancing_loss, z_loss;
};

class GoldenFixture {
 public:
  // Loads golden_dir()/<name>. NotFound / DataLoss naming the file on any problem.
  static StatusOr<GoldenFixture> load(const std::string& name);
  static StatusOr<GoldenFixture> load_dir(const std::string& dir);

  const std::string& name() const { return data_->name; }
  const nlohmann::json& json() const { return data_->doc; }  // fixture.json, complete
  const GoldenModelConfig& model() const { return data_->model; }
  const GoldenTrainingConfig& training() const { return data_->training; }
  // The `gale pretrain` / pretrain_gpt.py flags of the same model and run (vocabulary flags excluded).
  const std::vector<std::string>& megatron_args() const { return data_->megatron_args; }
  std::optional<int64_t> eod_token() const { return data_->eod_token; }

  // Initial parameters (f32) by Megatron name, in the order of the table in docs/model.md.
  const std::vector<std::pair<std::string, Tensor>>& initial_weights() const { return data_->weights; }
  const Tensor& initial_weight(const std::string& name) const;  // CHECKs that it exists

  int num_iterations() const { return data_->iterations; }
  int num_microbatches() const { return data_->microbatches; }
  // Inputs of iteration `iteration` (0-based), micro-batch `micro_batch` (views into the fixture).
  GoldenBatch batch(int iteration, int micro_batch) const;

  // One forward pass of batch(0, 0) (absent for optimizer-only variants such as gpt_sgd).
  bool has_forward() const { return data_->logits.defined(); }
  const Tensor& logits() const { return data_->logits; }              // [B, S, V] f32
  const Tensor& token_losses() const { return data_->token_losses; }  // [B, S] f32
  double forward_loss() const { return data_->forward_loss; }         // sum(l * mask) / sum(mask), f64
  // Its gradients: full f32 tensors for the base configs, summaries for every config with a forward.
  bool has_full_grads() const { return !data_->grads.empty(); }
  const std::map<std::string, Tensor>& grads() const { return data_->grads; }
  const std::map<std::string, TensorSummary>& grad_summaries() const { return data_->grad_summaries; }

  const GoldenSeries& train_series() const { return data_->series; }
  // Summaries of the parameters after the last training iteration (with update_norm).
  const std::map<std::string, TensorSummary>& final_param_summaries() const { return data_->final_summaries; }

 private:
  struct Data {
    std::string name, dir;
    nlohmann::json doc;
    GoldenModelConfig model;
    GoldenTrainingConfig training;
    std::vector<std::string> megatron_args;
    std::optional<int64_t> eod_token;
    std::vector<std::pair<std::string, Tensor>> weights;
    std::map<std::string, Tensor> inputs;  // [iterations, micro-batches, B, S]
    int iterations = 0, microbatches = 0;
    Tensor logits, token_losses;
    double forward_loss = 0;
    std::map<std::string, Tensor> grads;
    std::map<std::string, TensorSummary> grad_summaries;
    GoldenSeries series;
    std::map<std::string, TensorSummary> final_summaries;
  };
  std::shared_ptr<const Data> data_;
};

// OK when every element of `actual` is within atol + rtol * |expected| of `expected` (same shape;
// f32, bf16 or f64 tensors); otherwise a one-line error naming `what`, the worst element, both
// values and how many elements are out of tolerance.
Status compare_tensors(const Tensor& actual, const Tensor& expected, double rtol, double atol,
                       const std::string& what = "tensor");

// OK when `actual` matches a reference summary: norm and sum within `rtol` (relative to the
// norm), every sampled element within atol + rtol * |value|, and, when `initial` is given and the
// summary has one, ||actual - initial|| within rtol of update_norm.
Status check_summary(const Tensor& actual, const TensorSummary& expected, double rtol, double atol,
                     const std::string& what = "tensor", const Tensor* initial = nullptr);

}  // namespace gale::golden
