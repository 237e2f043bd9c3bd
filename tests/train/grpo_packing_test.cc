// GRPO sequence packing: the bins of Megatron-LM main's own packer and distribution
// (tests/data/reference/grpo_packing/fixture.json, tools/reference/grpo_packing_reference.py), the
// rollouts' loss masks, advantages, position and document ids in them, a packed forward's
// log-probabilities equal to each rollout's own row's, per-position advantages in the loss, and the
// option checks.
#include "train/grpo_packing.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model/hybrid_layers.h"
#include "model/model_test_batches.h"
#include "train/grpo.h"

namespace gale {
namespace {

nlohmann::json fixture() {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/grpo_packing/fixture.json");
  EXPECT_TRUE(in.good()) << "tests/data/reference/grpo_packing/fixture.json";
  return nlohmann::json::parse(in);
}

// The reference script's rollouts: row i of length n holds 1 + (i + s) mod 9 then pad 0, its
// generated tokens from position 2 on (Gale's mask: position s predicts s + 1, so 1 on [1, n − 1)),
// advantage i/2 − 1, inference log-probability −(i + 1)/10 − s/100 where the mask is 1.
GrpoRollouts rollouts_of(const std::vector<int64_t>& lengths, int64_t S) {
  GrpoRollouts r;
  r.rows = static_cast<int64_t>(lengths.size());
  r.seq_length = S;
  r.tokens.assign(static_cast<size_t>(r.rows * S), 0);
  r.loss_mask.assign(static_cast<size_t>(r.rows * S), 0.0f);
  r.inference_logprobs.assign(static_cast<size_t>(r.rows * S), 0.0);
  for (int64_t i = 0; i < r.rows; ++i) {
    for (int64_t s = 0; s < lengths[i]; ++s) r.tokens[i * S + s] = static_cast<int32_t>(1 + (i + s) % 9);
    for (int64_t s = 1; s + 1 < lengths[i]; ++s) {
      r.loss_mask[i * S + s] = 1.0f;
      r.inference_logprobs[i * S + s] = -(static_cast<double>(i) + 1.0) / 10.0 - static_cast<double>(s) / 100.0;
    }
    r.advantages.push_back(static_cast<double>(i) / 2.0 - 1.0);
  }
  return r;
}

TEST(GrpoPacking, SequenceLengthsEndAtTheLastNonPadToken) {
  GrpoRollouts r = rollouts_of({3, 5, 0}, 8);
  r.tokens[1 * 8 + 2] = 0;  // a pad inside the rollout counts
  EXPECT_EQ(grpo_sequence_lengths(r, 0), (std::vector<int64_t>{3, 5, 0}));
}

TEST(GrpoPacking, BinsAreMegatronsOnEveryRank) {
  const nlohmann::json f = fixture();
  ASSERT_GE(f["cases"].size(), 7u);
  for (const nlohmann::json& c : f["cases"]) {
    const std::string name = c["name"];
    const std::vector<int64_t> lengths = c["lengths"].get<std::vector<int64_t>>();
    const int64_t S = c["bin_size"], dp = c["dp"];
    const GrpoRollouts r = rollouts_of(lengths, S);
    GrpoPackingOptions o;
    o.enabled = true;
    o.max_sequences_per_bin = c["max_sequences_per_bin"];
    o.algo = c["algo"];
    o.seq_length_multiple = c["seq_length_multiple"];
    for (int64_t rank = 0; rank < dp; ++rank) {
      const nlohmann::json& want = c["ranks"][rank];
      StatusOr<GrpoTrainingRows> got = grpo_packed_rows(r, 0, o, dp, rank);
      ASSERT_TRUE(got.ok()) << name << " " << got.status().message();
      const GrpoTrainingRows& t = got.value();
      EXPECT_EQ(t.total_bins, c["total_bins"].get<int64_t>()) << name;
      ASSERT_EQ(t.rows, static_cast<int64_t>(want["bins"].size())) << name << " rank " << rank;
      for (int64_t b = 0; b < t.rows; ++b) {
        const std::string where = name + " rank " + std::to_string(rank) + " bin " + std::to_string(b);
        EXPECT_EQ(t.members[b], want["bins"][b].get<std::vector<int64_t>>()) << where;
        const std::vector<int32_t> tokens(t.tokens.begin() + b * S, t.tokens.begin() + (b + 1) * S);
        const std::vector<int32_t> positions(t.position_ids.begin() + b * S, t.position_ids.begin() + (b + 1) * S);
        EXPECT_EQ(tokens, want["tokens"][b].get<std::vector<int32_t>>()) << where;
        EXPECT_EQ(positions, want["position_ids"][b].get<std::vector<int32_t>>()) << where;
        // Megatron's loss mask is [bins, S] over the tokens; position s here predicts token s + 1.
        const std::vector<float> mask = want["loss_mask"][b].get<std::vector<float>>();
        for (int64_t s = 0; s < S; ++s)
          EXPECT_EQ(t.loss_mask[b * S + s], s + 1 < S ? mask[s + 1] : 0.0f) << where << " position " << s;
        // Each rollout's advantage, inference log-probabilities and document id at its positions.
        const std::vector<int64_t> starts = want["starts"][b].get<std::vector<int64_t>>();
        for (size_t j = 0; j < t.members[b].size(); ++j) {
          const int64_t row = t.members[b][j];
          for (int64_t s = 0; s < lengths[row]; ++s) {
            const int64_t p = b * S + starts[j] + s;
            EXPECT_EQ(t.advantages[p], r.advantages[row]) << where;
            EXPECT_EQ(t.inference_logprobs[p], r.inference_logprobs[row * S + s]) << where;
            EXPECT_EQ(t.document_ids[p], static_cast<int32_t>(j)) << where;
          }
        }
        if (!t.members[b].empty()) {  // after the last slot: a document of its own
          const int64_t end = starts.back();
          for (int64_t s = end; s < S; ++s)
            EXPECT_EQ(t.document_ids[b * S + s], static_cast<int32_t>(t.members[b].size())) << where;
        }
      }
    }
  }
}

TEST(GrpoPacking, UnpackedRowsAreTheRanksShare) {
  const GrpoRollouts r = rollouts_of({5, 7, 3, 7}, 8);
  const GrpoTrainingRows t = grpo_unpacked_rows(r, 2, 1);
  ASSERT_EQ(t.rows, 2);
  EXPECT_TRUE(t.document_ids.empty());
  EXPECT_EQ(t.members[0], (std::vector<int64_t>{2}));
  EXPECT_EQ(std::vector<int32_t>(t.tokens.begin(), t.tokens.begin() + 8),
            std::vector<int32_t>(r.tokens.begin() + 16, r.tokens.begin() + 24));
  for (int64_t s = 0; s < 8; ++s) {
    EXPECT_EQ(t.position_ids[8 + s], s);
    EXPECT_EQ(t.advantages[8 + s], r.advantages[3]);
  }
}

TEST(GrpoPacking, OptionChecks) {
  const GrpoRollouts r = rollouts_of({5, 7}, 8);
  GrpoPackingOptions o;
  o.max_sequences_per_bin = 0;
  EXPECT_EQ(grpo_packed_rows(r, 0, o, 1, 0).status().message(),
            "--rl-sequence-packing-max-sequences-per-bin: expected a positive number, found 0");
  o = GrpoPackingOptions{};
  o.algo = "lifo";
  EXPECT_EQ(grpo_packed_rows(r, 0, o, 1, 0).status().message(),
            "--rl-sequence-packing-algo: expected fifo or round-robin, found 'lifo'");
  o = GrpoPackingOptions{};
  o.seq_length_multiple = 6;
  EXPECT_EQ(grpo_packed_rows(r, 0, o, 1, 0).status().message(),
            "--seq-length 8: expected a multiple of 6 (2 x --context-parallel-size: each packed rollout's slot splits "
            "over the cp ranks)");
}

// A packed bin's forward (document ids, position ids restarting per rollout, the scans restarting
// per rollout) gives every rollout's token the log-probability its own unpacked row gives it.
void expect_packed_logprobs_are_each_rollouts_own(const ModelConfig& c) {
  OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(11);
  const std::vector<int64_t> lengths = {5, 7, 3, 7, 2, 6};
  const GrpoRollouts r = rollouts_of(lengths, 16);
  GrpoPackingOptions o;
  StatusOr<GrpoTrainingRows> packed = grpo_packed_rows(r, 0, o, 1, 0);
  ASSERT_TRUE(packed.ok());
  const GrpoTrainingRows& t = packed.value();
  ASSERT_LT(t.rows, r.rows);  // several rollouts share bins
  const std::vector<double> unpacked = grpo_token_logprobs(model, grpo_micro_batch(r, 0, r.rows, 0, 0));
  const std::vector<double> lp = grpo_token_logprobs(model, grpo_rows_micro_batch(t, 0, t.rows, 0, 0));
  int64_t compared = 0;
  for (int64_t b = 0; b < t.rows; ++b) {
    int64_t start = 0;
    for (int64_t row : t.members[b]) {
      for (int64_t s = 0; s + 1 < lengths[row]; ++s, ++compared)  // positions predicting the rollout's tokens
        EXPECT_NEAR(lp[b * 16 + start + s], unpacked[row * 16 + s], 1e-5) << "rollout " << row << " position " << s;
      start += lengths[row];
    }
  }
  EXPECT_EQ(compared, 5 + 7 + 3 + 7 + 2 + 6 - 6);
}

ModelConfig packed_gpt_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.seq_length = 16;
  return c;
}

// "M*-M": Mamba, attention, MLP, Mamba (tests/model/hybrid_model_test.cc's sizes).
ModelConfig packed_hybrid_config() {
  ModelConfig c = packed_gpt_config();
  c.num_layers = 4;
  c.rms_norm = true;
  c.position = PositionEmbedding::kNone;
  c.hybrid.enabled = true;
  c.hybrid.layers = "M*-M";
  c.hybrid.headdim = 8;
  c.hybrid.ngroups = 2;
  c.hybrid.d_state = 4;
  return c;
}

// "MG*G": Mamba, Gated DeltaNet, attention, Gated DeltaNet.
ModelConfig packed_gdn_config() {
  ModelConfig c = packed_hybrid_config();
  c.hybrid.layers = "MG*G";
  c.gdn.enabled = true;
  c.gdn.pattern = hybrid_gdn_layer_flags(c.hybrid.layers);
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  return c;
}

TEST(GrpoPacking, PackedLogProbsAreEachRolloutsOwn) { expect_packed_logprobs_are_each_rollouts_own(packed_gpt_config()); }

TEST(GrpoPacking, PackedLogProbsAreEachRolloutsOwnWithMambaLayers) {
  expect_packed_logprobs_are_each_rollouts_own(packed_hybrid_config());
}

TEST(GrpoPacking, PackedLogProbsAreEachRolloutsOwnWithGatedDeltaNetLayers) {
  expect_packed_logprobs_are_each_rollouts_own(packed_gdn_config());
}

// Per-position advantages ([B, S]) give the loss and gradient of the per-row ones ([B]) they expand.
TEST(GrpoPacking, PerPositionAdvantagesAreThePerRowOnesExpanded) {
  const int64_t B = 2, S = 3;
  const std::vector<double> cur = {-1.0, -0.5, -2.0, -0.3, -1.2, -0.7}, old = {-1.1, -0.4, -2.0, -0.2, -1.0, -0.9};
  const std::vector<double> ref = {-0.9, -0.6, -1.8, -0.5, -1.1, -0.6};
  const std::vector<float> mask = {1, 1, 0, 0, 1, 1};
  GrpoLossOptions lo;
  lo.clamp_eps_lower = lo.clamp_eps_upper = 0.2;
  lo.kl_beta = 0.1;
  const GrpoMicroBatchLoss rows = grpo_micro_batch_loss(cur, old, ref, {0.5, -1.5}, mask, B, S, 2, lo);
  const GrpoMicroBatchLoss tokens =
      grpo_micro_batch_loss(cur, old, ref, {0.5, 0.5, 0.5, -1.5, -1.5, -1.5}, mask, B, S, 2, lo);
  EXPECT_EQ(rows.mb_loss, tokens.mb_loss);
  EXPECT_EQ(rows.grad, tokens.grad);
  const GrpoMicroBatchLoss other =
      grpo_micro_batch_loss(cur, old, ref, {0.5, 0.5, 0.5, -1.5, 0.5, -1.5}, mask, B, S, 2, lo);
  EXPECT_NE(other.grad[4], rows.grad[4]);  // position 4 reads its own advantage
}

}  // namespace
}  // namespace gale
