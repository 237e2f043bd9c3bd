// The golden fixtures parse, agree with docs/model.md's parameter table, and are internally consistent.
#include "golden/golden_fixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

namespace gale::golden {
namespace {

// docs/model.md's parameter table, written out again from the config alone.
std::vector<std::pair<std::string, Shape>> expected_parameters(const GoldenModelConfig& m) {
  const int64_t H = m.hidden_size, V = m.padded_vocab_size, F = m.ffn_hidden_size, HD = m.kv_channels;
  const int64_t qkv = ((m.attention_output_gate ? 2 : 1) * m.num_attention_heads + 2 * m.num_query_groups) * HD;
  const bool ln = m.normalization == "LayerNorm", bias = m.add_bias_linear;
  std::vector<std::pair<std::string, Shape>> p = {{"embedding.word_embeddings.weight", {V, H}}};
  if (m.position_embedding_type == "learned_absolute")
    p.push_back({"embedding.position_embeddings.weight", {m.max_position_embeddings, H}});
  for (int i = 0; i < m.num_layers; ++i) {
    std::string l = "decoder.layers." + std::to_string(i) + ".";
    p.push_back({l + "input_layernorm.weight", {H}});
    if (ln) p.push_back({l + "input_layernorm.bias", {H}});
    p.push_back({l + "self_attention.linear_qkv.weight", {qkv, H}});
    if (bias) p.push_back({l + "self_attention.linear_qkv.bias", {qkv}});
    if (m.softmax_type == "learnable") p.push_back({l + "self_attention.core_attention.softmax_offset", {m.num_attention_heads}});
    p.push_back({l + "self_attention.linear_proj.weight", {H, m.num_attention_heads * HD}});
    if (bias) p.push_back({l + "self_attention.linear_proj.bias", {H}});
    p.push_back({l + "pre_mlp_layernorm.weight", {H}});
    if (ln) p.push_back({l + "pre_mlp_layernorm.bias", {H}});
    std::vector<std::pair<std::string, int64_t>> mlps = {{l + "mlp.", F}};  // prefix, FFN size
    if (m.num_experts > 0) {  // the router, then each expert's MLP
      p.push_back({l + "mlp.router.weight", {m.num_experts, H}});
      mlps.clear();
      for (int e = 0; e < m.num_experts; ++e)
        mlps.push_back({l + "mlp.experts.local_experts." + std::to_string(e) + ".", m.moe_ffn_hidden_size});
    }
    for (const auto& [q, f] : mlps) {
      const int64_t rows = m.swiglu ? 2 * f : f;
      p.push_back({q + "linear_fc1.weight", {rows, H}});
      if (bias) p.push_back({q + "linear_fc1.bias", {rows}});
      p.push_back({q + "linear_fc2.weight", {H, f}});
      if (bias) p.push_back({q + "linear_fc2.bias", {H}});
    }
  }
  p.push_back({"decoder.final_layernorm.weight", {H}});
  if (ln) p.push_back({"decoder.final_layernorm.bias", {H}});
  if (m.untie_embeddings_and_output_weights) p.push_back({"output_layer.weight", {V, H}});
  return p;
}

GoldenFixture load_or_die(const std::string& name) {
  StatusOr<GoldenFixture> f = GoldenFixture::load(name);
  GALE_CHECK(f.ok()) << f.status().to_string();
  return std::move(f).value();
}

TEST(GoldenFixture, EveryFixtureLoadsWithTheDocumentedParameters) {
  for (const std::string& name : golden_fixture_names()) {
    SCOPED_TRACE(name);
    StatusOr<GoldenFixture> f = GoldenFixture::load(name);
    ASSERT_TRUE(f.ok()) << f.status().to_string();
    const GoldenModelConfig& m = f->model();
    EXPECT_EQ(f->name(), name);
    EXPECT_EQ(m.padded_vocab_size % m.make_vocab_size_divisible_by, 0);
    EXPECT_GE(m.padded_vocab_size, m.tokenizer_vocab_size);
    EXPECT_LT(m.padded_vocab_size - m.tokenizer_vocab_size, m.make_vocab_size_divisible_by);
    EXPECT_EQ(f->num_iterations(), f->training().train_iters);
    EXPECT_EQ(f->num_microbatches(), f->training().num_microbatches());
    EXPECT_FALSE(f->megatron_args().empty());
    auto want = expected_parameters(m);
    ASSERT_EQ(f->initial_weights().size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(f->initial_weights()[i].first, want[i].first) << i;
      EXPECT_EQ(f->initial_weights()[i].second.shape(), want[i].second) << want[i].first;
      EXPECT_EQ(f->initial_weights()[i].second.dtype(), DType::kF32);
      EXPECT_EQ(f->final_param_summaries().count(want[i].first), 1u) << want[i].first;
    }
  }
  EXPECT_EQ(GoldenFixture::load("no_such_fixture").status().code(), StatusCode::kNotFound);
}

TEST(GoldenFixture, InputsAreShiftedTokensWithMasksAndPositions) {
  for (const std::string& name : golden_fixture_names()) {
    SCOPED_TRACE(name);
    GoldenFixture f = load_or_die(name);
    const GoldenModelConfig& m = f.model();
    int64_t masked = 0;
    for (int it = 0; it < f.num_iterations(); ++it)
      for (int mb = 0; mb < f.num_microbatches(); ++mb) {
        GoldenBatch b = f.batch(it, mb);
        ASSERT_EQ(b.tokens.shape(), (Shape{f.training().micro_batch_size, m.seq_length}));
        const int64_t B = b.tokens.size(0), S = b.tokens.size(1);
        const int64_t* tok = b.tokens.data<int64_t>();
        const int64_t* lab = b.labels.data<int64_t>();
        const int64_t* pos = b.position_ids.data<int64_t>();
        const float* mask = b.loss_mask.data<float>();
        ASSERT_EQ(b.document_ids.defined(), m.reset_attention_mask);
        for (int64_t s = 0; s < B * S; ++s) {
          ASSERT_TRUE(tok[s] >= 0 && tok[s] < m.tokenizer_vocab_size) << tok[s];
          ASSERT_TRUE(mask[s] == 0.0f || mask[s] == 1.0f);
          masked += mask[s] == 0.0f;
          if (s % S != S - 1) {
            ASSERT_EQ(lab[s], tok[s + 1]) << "labels are the next tokens";
          }
        }
        for (int64_t r = 0; r < B; ++r) {  // positions restart after an EOD only with --reset-position-ids
          int64_t start = 0, doc = 0;
          for (int64_t s = 0; s < S; ++s) {
            EXPECT_EQ(pos[r * S + s], m.reset_position_ids ? s - start : s);
            if (m.reset_attention_mask) {
              EXPECT_EQ(b.document_ids.data<int64_t>()[r * S + s], doc);
            }
            if (f.eod_token() && tok[r * S + s] == *f.eod_token()) start = s + 1, ++doc;
          }
        }
      }
    // llama_alibi_docmask reads gpt_docmask's inputs.
    EXPECT_EQ(masked > 0, (name.rfind("llama", 0) == 0 && name != "llama_alibi_docmask") || name == "mixtral")
        << "only the LLaMA and Mixtral inputs have loss-mask zeros";
  }
}

TEST(GoldenFixture, ForwardLossesFollowFromTheLogits) {
  for (const std::string& name : golden_fixture_names()) {
    SCOPED_TRACE(name);
    GoldenFixture f = load_or_die(name);
    if (!f.has_forward()) continue;
    GoldenBatch b = f.batch(0, 0);
    const int64_t B = b.tokens.size(0), S = b.tokens.size(1), V = f.model().padded_vocab_size;
    ASSERT_EQ(f.logits().shape(), (Shape{B, S, V}));
    ASSERT_EQ(f.token_losses().shape(), (Shape{B, S}));
    double num = 0, den = 0;
    for (int64_t t = 0; t < B * S; ++t) {  // cross entropy = logsumexp(logits) - logits[label]
      const float* row = f.logits().data<float>() + t * V;
      double mx = row[0], sum = 0;
      for (int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(row[v]));
      for (int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - mx);
      double loss = mx + std::log(sum) - row[b.labels.data<int64_t>()[t]];
      EXPECT_NEAR(loss, f.token_losses().data<float>()[t], 2e-5) << t;
      num += f.token_losses().data<float>()[t] * b.loss_mask.data<float>()[t];
      den += b.loss_mask.data<float>()[t];
    }
    EXPECT_NEAR(num / den, f.forward_loss(), 1e-6);
    EXPECT_GT(f.forward_loss(), 0.0);
  }
}

TEST(GoldenFixture, GradientsCoverEveryParameterAndMatchTheirSummaries) {
  int full = 0;
  for (const std::string& name : golden_fixture_names()) {
    SCOPED_TRACE(name);
    GoldenFixture f = load_or_die(name);
    if (!f.has_forward()) continue;
    EXPECT_EQ(f.grad_summaries().size(), f.initial_weights().size());
    for (const auto& [pname, w] : f.initial_weights()) {
      ASSERT_EQ(f.grad_summaries().count(pname), 1u) << pname;
      EXPECT_EQ(f.grad_summaries().at(pname).numel, w.numel()) << pname;
      EXPECT_GT(f.grad_summaries().at(pname).norm, 0.0) << pname << " gets no gradient";
      if (!f.has_full_grads()) continue;
      ASSERT_EQ(f.grads().count(pname), 1u) << pname;
      const Tensor& g = f.grads().at(pname);
      EXPECT_EQ(g.shape(), w.shape());
      Status s = check_summary(g, f.grad_summaries().at(pname), 1e-6, 1e-10, pname);
      EXPECT_TRUE(s.ok()) << s.to_string();
    }
    full += f.has_full_grads();
  }
  EXPECT_EQ(full, 6);  // gpt, llama, mixtral, llama_gate, llama_sink and gpt_mup keep the full gradient tensors
}

TEST(GoldenFixture, TrainingSeriesFollowTheSchedule) {
  for (const std::string& name : golden_fixture_names()) {
    SCOPED_TRACE(name);
    GoldenFixture f = load_or_die(name);
    const GoldenSeries& s = f.train_series();
    const size_t n = static_cast<size_t>(f.training().train_iters);
    ASSERT_EQ(s.loss.size(), n);
    ASSERT_EQ(s.lr.size(), n);
    ASSERT_EQ(s.grad_norm.size(), n);
    ASSERT_EQ(s.lr_used.size(), n);
    ASSERT_EQ(s.loss_differentiated.size(), n);
    EXPECT_EQ(s.lr_used[0], f.training().lr_warmup_init);  // the first step runs at the warmup's start
    for (size_t k = 1; k < n; ++k) EXPECT_EQ(s.lr_used[k], s.lr[k - 1]);
    EXPECT_DOUBLE_EQ(s.lr[static_cast<size_t>(f.training().lr_warmup_iters) - 1], f.training().lr);
    EXPECT_DOUBLE_EQ(s.lr.back(), f.training().min_lr);
    for (size_t k = 0; k < n; ++k) EXPECT_GT(s.grad_norm[k], 0.0);
    EXPECT_LT(s.loss.back(), s.loss.front() - 0.1) << "the loss falls over the run";
    // Summaries of the final parameters moved away from the initial values (except with lr 0).
    for (const auto& [pname, w] : f.initial_weights())
      EXPECT_GT(*f.final_param_summaries().at(pname).update_norm, 0.0) << pname;
  }
}

TEST(GoldenFixture, VariantsShareTheirBaseFiles) {
  GoldenFixture llama = load_or_die("llama"), rope50 = load_or_die("llama_rope50");
  GoldenFixture gpt = load_or_die("gpt"), sgd = load_or_die("gpt_sgd"), doc = load_or_die("gpt_docmask");
  EXPECT_EQ(rope50.model().rotary_percent, 0.5);
  EXPECT_TRUE(doc.model().reset_attention_mask && doc.model().reset_position_ids);
  EXPECT_EQ(sgd.training().optimizer, "sgd");
  for (size_t i = 0; i < llama.initial_weights().size(); ++i) {
    const Tensor& a = llama.initial_weights()[i].second;
    EXPECT_EQ(std::memcmp(a.raw(), rope50.initial_weights()[i].second.raw(), a.nbytes()), 0);
  }
  EXPECT_EQ(std::memcmp(gpt.batch(3, 1).tokens.raw(), sgd.batch(3, 1).tokens.raw(), gpt.batch(3, 1).tokens.nbytes()),
            0);
  EXPECT_EQ(gpt.train_series().grad_norm[0], sgd.train_series().grad_norm[0]);  // same weights and data
  EXPECT_NE(gpt.train_series().loss[2], sgd.train_series().loss[2]);            // different optimizers
}

TEST(GoldenFixture, ComparisonHelpersReportTheWorstElement) {
  GoldenFixture f = load_or_die("gpt");
  const Tensor& g = f.grads().at("decoder.layers.1.mlp.linear_fc1.weight");
  EXPECT_TRUE(compare_tensors(g, g, 0.0, 0.0).ok());
  Tensor bumped = g.clone();
  bumped.data<float>()[17] += 1e-3f;
  Status s = compare_tensors(bumped, g, 1e-4, 1e-6, "fc1 grad");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fc1 grad: 1 of 8192 elements differ"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("worst at flat index 17"), std::string::npos) << s.message();
  const TensorSummary& summary = f.grad_summaries().at("decoder.layers.1.mlp.linear_fc1.weight");
  EXPECT_TRUE(check_summary(g, summary, 1e-6, 1e-10).ok());
  Tensor scaled = g.clone();
  for (int64_t i = 0; i < scaled.numel(); ++i) scaled.data<float>()[i] *= 1.001f;
  EXPECT_FALSE(check_summary(scaled, summary, 1e-4, 1e-10).ok());
  Tensor one_sample = g.clone();
  one_sample.data<float>()[summary.sample_index[3]] += 1e-3f;
  Status s2 = check_summary(one_sample, summary, 1e-4, 1e-8, "fc1");
  EXPECT_FALSE(s2.ok());
  EXPECT_EQ(compare_tensors(g, f.initial_weight("decoder.layers.1.mlp.linear_fc2.weight"), 1, 1).code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gale::golden
