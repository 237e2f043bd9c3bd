// --qk-clip / --log-max-attention-logit (model/qk_clip.h): the max pre-softmax logit and the q/k rescale
// against the float64 reference of Megatron's formulas (tools/reference/qk_clip_reference.py), the
// maxima a model records per layer and head (the same at both kernel levels), and the rescale's
// defining property on a whole model: after clipping, the same batch's largest logit of each clipped
// query group (standard attention, GQA) or head (MLA) is the threshold.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/fused_ops.h"
#include "kernels/cpu/isa.h"
#include "model/gpt_model.h"
#include "model/mla_test_config.h"
#include "model/qk_clip.h"
#include "model_test_batches.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

nlohmann::json golden() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/qk_clip/golden.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/qk_clip/golden.json";
  return nlohmann::json::parse(in);
}

void expect_close(const std::vector<float>& got, const nlohmann::json& want, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double w = want[i].get<double>();
    EXPECT_NEAR(got[i], w, rel * std::max(1.0, std::fabs(w))) << what << " [" << i << "]";
  }
}

// Standard attention with GQA (4 heads, 2 groups), causal and document masks: the per-head max
// logit of x·Wqkvᵀ, and linear_qkv after the clip (one group above the threshold, one below; the
// group above holds a head below it, rescaled by its group's factor all the same).
TEST(QkClip, StandardAttentionMatchesTheFloat64Reference) {
  const nlohmann::json g = golden()["standard"];
  const int64_t B = g["B"], S = g["S"], H = g["H"], NH = g["NH"], KV = g["KV"], HD = g["HD"];
  const int64_t rows = (NH + 2 * KV) * HD, T = S * B;
  const std::vector<float> x = testing::json_floats(g["x"]), w = testing::json_floats(g["w_qkv"]);
  std::vector<float> qkv(static_cast<size_t>(T * rows));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0.0;
      for (int64_t c = 0; c < H; ++c) s += double{x[t * H + c]} * w[r * H + c];
      qkv[t * rows + r] = static_cast<float>(s);
    }
  std::vector<int32_t> doc;
  for (const auto& d : g["doc_ids"]) doc.push_back(d.get<int32_t>());
  AttentionProblem p;
  p.B = B;
  p.Sq = p.Sk = S;
  p.NH = NH;
  p.KV = KV;
  p.HD = HD;
  p.scale = static_cast<float>(g["scale"].get<double>());
  p.q_doc_ids = p.k_doc_ids = doc.data();
  p.heads_total = NH;
  p.max_positions = S;
  std::vector<float> max_logit(static_cast<size_t>(NH), kNegInf);
  attention_max_logit_ref(p, qkv.data(), qkv_query_layout(NH, KV, HD), qkv.data(), qkv_key_layout(NH, KV, HD),
                          max_logit.data());
  expect_close(max_logit, g["max_logit"], 1e-5, "max logit");
  // Merging: a larger value already there stays; the maxima are only raised.
  std::vector<float> merged = max_logit;
  merged[1] = 1e6f;
  attention_max_logit_ref(p, qkv.data(), qkv_query_layout(NH, KV, HD), qkv.data(), qkv_key_layout(NH, KV, HD),
                          merged.data());
  EXPECT_EQ(merged[1], 1e6f);
  EXPECT_EQ(merged[0], max_logit[0]);

  QkClipOptions o;
  o.clip = true;
  o.alpha = g["alpha"];
  o.threshold = g["threshold"];
  std::vector<float> clipped = w;
  EXPECT_TRUE(qk_clip_qkv_rows(clipped.data(), H, KV, NH / KV, HD, testing::json_floats(g["max_logit"]), o));
  expect_close(clipped, g["w_qkv_clipped"], 1e-6, "linear_qkv after the clip");
  // Everything at or below the threshold: nothing changes.
  o.threshold = 1e3;
  std::vector<float> same = w;
  EXPECT_FALSE(qk_clip_qkv_rows(same.data(), H, KV, NH / KV, HD, testing::json_floats(g["max_logit"]), o));
  EXPECT_EQ(same, w);
}

// MLA: per head, the "nope" query rows by η^α, the rotary query rows by η (k_pe is shared by the
// heads), the key rows of linear_kv_up_proj by η^(1−α), the value rows unchanged.
TEST(QkClip, MlaMatchesTheFloat64Reference) {
  const nlohmann::json g = golden()["mla"];
  const int64_t Dn = g["Dn"], R = g["R"], Dv = g["Dv"], C = g["C"], Ckv = g["Ckv"];
  std::vector<float> q = testing::json_floats(g["w_q"]), kv = testing::json_floats(g["w_kv_up"]);
  QkClipOptions o;
  o.clip = true;
  o.alpha = g["alpha"];
  o.threshold = g["threshold"];
  EXPECT_TRUE(qk_clip_mla_rows(q.data(), C, kv.data(), Ckv, Dn, R, Dv, testing::json_floats(g["max_logit"]), o));
  expect_close(q, g["w_q_clipped"], 1e-6, "query projection after the clip");
  expect_close(kv, g["w_kv_up_clipped"], 1e-6, "linear_kv_up_proj after the clip");
}

// A head never seen (-inf, e.g. before the data-parallel reduction fills it in) keeps its weights.
TEST(QkClip, UnseenHeadKeepsItsWeights) {
  std::vector<float> w(static_cast<size_t>(2 * 4 * 3), 2.0f);  // 2 groups of 2 query heads, HD 1, 3 columns
  QkClipOptions o;
  o.clip = true;
  o.threshold = 1.0;
  ASSERT_TRUE(qk_clip_qkv_rows(w.data(), 3, 2, 2, 1, {kNegInf, kNegInf, 4.0f, 1.0f}, o));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(w[static_cast<size_t>(i)], 2.0f) << i;  // group 0
  for (int i = 12; i < 18; ++i) EXPECT_FLOAT_EQ(w[static_cast<size_t>(i)], 2.0f * std::sqrt(0.25f)) << i;  // queries
  for (int i = 18; i < 21; ++i) EXPECT_FLOAT_EQ(w[static_cast<size_t>(i)], 2.0f * std::sqrt(0.25f)) << i;  // key
  for (int i = 21; i < 24; ++i) EXPECT_EQ(w[static_cast<size_t>(i)], 2.0f) << i;  // value
}

ModelConfig gqa_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  use_llama_architecture(c);  // no linear_qkv bias: the logits scale exactly with the weights
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.init_std = 0.6f;
  c.track_max_attention_logit = true;
  return c;
}

OpTable fused_ops() {
  OpTable ops = reference_ops();
  GALE_CHECK_OK(install_all_fused_kernels(ops, detected_isa()));
  return ops;
}

// One training forward (and the backward that frees its state) of `mb`; the maxima it recorded.
std::map<int64_t, std::vector<float>> forward_maxima(GPTModel& model, const MicroBatch& mb) {
  testing::mean_loss(model, mb, false);
  return model.take_max_attention_logits();
}

TEST(QkClip, ModelRecordsEveryLayersHeadsAtBothLevels) {
  const ModelConfig c = gqa_config();
  const MicroBatch mb = testing::masked_batch(c, 2, 11, /*documents=*/true);
  OpTable ref = reference_ops(), fused = fused_ops();
  GPTModel a(c, single_process_partition(c), &ref), b(c, single_process_partition(c), &fused);
  a.params().initialize(5);
  b.params().initialize(5);
  const auto ma = forward_maxima(a, mb), mf = forward_maxima(b, mb);
  ASSERT_EQ(ma.size(), 2u);
  ASSERT_EQ(mf.size(), 2u);
  for (int64_t layer = 0; layer < 2; ++layer) {
    ASSERT_EQ(ma.at(layer).size(), 4u);
    for (size_t h = 0; h < 4; ++h) {
      EXPECT_TRUE(std::isfinite(ma.at(layer)[h]));
      EXPECT_NEAR(mf.at(layer)[h], ma.at(layer)[h], 1e-4 * std::fabs(ma.at(layer)[h])) << layer << " " << h;
    }
  }
  EXPECT_TRUE(a.take_max_attention_logits().empty());  // taken: reset
  // Without the config flag nothing is recorded.
  ModelConfig off = c;
  off.track_max_attention_logit = false;
  GPTModel m(off, single_process_partition(off), &ref);
  m.params().initialize(5);
  EXPECT_TRUE(forward_maxima(m, mb).empty());
}

// qk_clip_step with a threshold below the maxima of layer 0: the same batch's new maxima of layer 0
// are η·old (the query and key factors multiply to η), so each clipped unit's largest is τ.
void expect_clipped_to_threshold(const ModelConfig& c, int64_t per_unit) {
  const MicroBatch mb = testing::masked_batch(c, 2, 3, /*documents=*/false);
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(9);
  const std::vector<float> before = forward_maxima(model, mb).at(0);
  testing::mean_loss(model, mb, false);  // record again for the step
  float lowest = before[0];
  for (float m : before) lowest = std::min(lowest, m);
  QkClipOptions o;
  o.clip = true;
  o.alpha = 0.3;
  o.threshold = 0.9 * lowest;  // every unit above it
  const double logged = qk_clip_step(model, o, nullptr);
  double largest = 0.0;
  for (float m : before) largest = std::max(largest, double{m});
  EXPECT_NEAR(logged, largest, 1e-6 * largest);  // the step's max over the (one) layer
  const std::vector<float> after = forward_maxima(model, mb).at(0);
  for (size_t u = 0; u < before.size() / per_unit; ++u) {
    float unit_max = kNegInf, unit_after = kNegInf;
    for (size_t h = u * per_unit; h < (u + 1) * per_unit; ++h) {
      unit_max = std::max(unit_max, before[h]);
      unit_after = std::max(unit_after, after[h]);
      EXPECT_NEAR(after[h], before[h] * o.threshold / unit_max, 1e-4 * std::fabs(before[h])) << "head " << h;
    }
    EXPECT_NEAR(unit_after, o.threshold, 1e-4 * o.threshold) << "unit " << u;
  }
}

TEST(QkClip, StandardAttentionGroupsClipToTheThreshold) {
  ModelConfig c = gqa_config();
  c.num_layers = 1;
  expect_clipped_to_threshold(c, 2);  // query groups of 2 heads
}

TEST(QkClip, MlaHeadsClipToTheThreshold) {
  for (int64_t q_lora_rank : {0, 6}) {
    SCOPED_TRACE(q_lora_rank);
    ModelConfig c = testing::mla_config(/*llama=*/true, q_lora_rank, /*qk_layernorm=*/false, /*v_head_dim=*/3);
    c.num_layers = 1;
    c.heads = 3;
    c.kv_heads = 3;
    c.init_std = 0.6f;
    c.track_max_attention_logit = true;
    expect_clipped_to_threshold(c, 1);  // each head its own
  }
}

}  // namespace
}  // namespace gale
