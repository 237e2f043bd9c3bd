// A packed micro-batch (MicroBatch::packed_sequences, Megatron's packed_seq_params) trains as its
// documents in rows of their own: the LM and MTP losses and every parameter gradient, for a GPT
// with MTP (the rolls stay inside each document), a hybrid Mamba model and a hybrid Gated DeltaNet
// model (their scans and convolutions restart at each document).
#include <gtest/gtest.h>

#include <cmath>

#include "model/gpt_model.h"
#include "model/hybrid_layers.h"
#include "model_test_batches.h"
#include "testing.h"

namespace gale {
namespace {

ModelConfig hybrid_config() {  // "M*-M" on the test GPT's sizes (tests/model/hybrid_model_test.cc's)
  ModelConfig c = testing::gradcheck_gpt_config();
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

ModelConfig hybrid_gdn_config() {  // "MG-*G": Mamba, GDN, MLP, attention, GDN
  ModelConfig c = hybrid_config();
  c.num_layers = 5;
  c.hybrid.layers = "MG-*G";
  c.gdn.enabled = true;
  c.gdn.pattern = hybrid_gdn_layer_flags(c.hybrid.layers);
  c.gdn.num_key_heads = 2;
  c.gdn.num_value_heads = 4;
  c.gdn.key_head_dim = 4;
  c.gdn.value_head_dim = 6;
  c.gdn.conv_kernel = 3;
  return c;
}

ModelConfig mtp_config() {
  ModelConfig c = testing::gradcheck_gpt_config();
  c.mtp_num_layers = 2;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

// Documents of `lengths` (summing to S) of random tokens. Each position s of a document but its
// last is in the loss with label token s + 1 (the first one too, so that an MTP roll across a
// document's end would bring a masked-in position into the loss).
struct Documents {
  std::vector<int64_t> lengths;
  int64_t S = 0;
  std::vector<std::vector<int32_t>> tokens;
  Documents(const ModelConfig& c, std::vector<int64_t> l) : lengths(std::move(l)) {
    const auto r = testing::random_vector(64, 5);
    size_t i = 0;
    for (int64_t n : lengths) {
      S += n;
      tokens.emplace_back();
      for (int64_t s = 0; s < n; ++s)
        tokens.back().push_back(static_cast<int32_t>((r[i++ % r.size()] + 1.0f) * 0.5f * (c.vocab - 1)));
    }
  }
  // All documents in one row: document ids, position ids restarting, packed_sequences.
  MicroBatch packed() const {
    MicroBatch mb;
    mb.B = 1;
    mb.S = S;
    mb.packed_sequences = true;
    for (size_t d = 0; d < lengths.size(); ++d)
      for (int64_t s = 0; s < lengths[d]; ++s) {
        mb.tokens.push_back(tokens[d][s]);
        mb.labels.push_back(s + 1 < lengths[d] ? tokens[d][s + 1] : 0);
        mb.loss_mask.push_back(s + 1 < lengths[d] ? 1.0f : 0.0f);
        mb.position_ids.push_back(static_cast<int32_t>(s));
        mb.document_ids.push_back(static_cast<int32_t>(d));
      }
    mb.sample_ids = {0};
    return mb;
  }
  // Each document in a row of its own, padded to S with token 0 out of the loss.
  MicroBatch rows() const {
    MicroBatch mb;
    mb.B = static_cast<int64_t>(lengths.size());
    mb.S = S;
    for (size_t d = 0; d < lengths.size(); ++d) {
      for (int64_t s = 0; s < S; ++s) {
        const bool in = s < lengths[d];
        mb.tokens.push_back(in ? tokens[d][s] : 0);
        mb.labels.push_back(s + 1 < lengths[d] ? tokens[d][s + 1] : 0);
        mb.loss_mask.push_back(s + 1 < lengths[d] ? 1.0f : 0.0f);
        mb.position_ids.push_back(static_cast<int32_t>(s));
      }
      mb.sample_ids.push_back(static_cast<int64_t>(d));
    }
    return mb;
  }
};

struct StepResult {
  GPTModel::LossSums sums;
  std::vector<double> mtp;
  std::vector<std::vector<float>> grads;
};

StepResult train_step(GPTModel& model, const MicroBatch& mb) {
  StepResult r;
  model.params().zero_grads();
  model.set_num_microbatches(1);
  model.forward(0, mb, Tensor(), /*training=*/true, &r.sums);
  model.backward(0, Tensor(), micro_batch_loss_scale(r.sums.tokens, 1));
  r.mtp = model.take_mtp_losses();
  const ParamBuffer& pb = model.params();
  for (int id = 0; id < pb.size(); ++id)
    r.grads.emplace_back(pb.grad_data(id), pb.grad_data(id) + pb.spec(id).local_numel());
  return r;
}

void expect_packed_is_rows(const ModelConfig& c) {
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  // A one-position document, one shorter than the convolution's window, longer ones.
  const Documents docs(c, {5, 1, 2, 6});
  const StepResult packed = train_step(model, docs.packed());
  const StepResult rows = train_step(model, docs.rows());
  EXPECT_EQ(packed.sums.tokens, rows.sums.tokens);
  EXPECT_NEAR(packed.sums.loss_sum, rows.sums.loss_sum, 1e-5 * std::fabs(rows.sums.loss_sum));
  ASSERT_EQ(packed.mtp.size(), rows.mtp.size());
  for (size_t k = 0; k < rows.mtp.size(); ++k) EXPECT_NEAR(packed.mtp[k], rows.mtp[k], 1e-5) << "MTP depth " << k + 1;
  const ParamBuffer& pb = model.params();
  for (size_t p = 0; p < rows.grads.size(); ++p) {
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < rows.grads[p].size(); ++i) {
      err = std::max(err, std::fabs(static_cast<double>(packed.grads[p][i]) - rows.grads[p][i]));
      norm = std::max(norm, std::fabs(static_cast<double>(rows.grads[p][i])));
    }
    EXPECT_LE(err, 1e-5 + 1e-4 * norm) << pb.spec(static_cast<int>(p)).name;
  }
}

TEST(PackedSequences, MtpRollsStayInsideEachDocument) {
  const ModelConfig c = mtp_config();
  expect_packed_is_rows(c);
  // The check can fail: without packed_sequences (--reset-attention-mask's batches) the rolls cross
  // the documents' ends and bring the next document's first position into the MTP losses.
  const OpTable ops = reference_ops();
  GPTModel model(c, single_process_partition(c), &ops);
  model.params().initialize(42);
  const Documents docs(c, {5, 1, 2, 6});
  MicroBatch crossing = docs.packed();
  crossing.packed_sequences = false;
  const StepResult across = train_step(model, crossing);
  const StepResult rows = train_step(model, docs.rows());
  EXPECT_GT(std::fabs(across.mtp[0] - rows.mtp[0]), 1e-4);
}

TEST(PackedSequences, MambaScansRestartAtEachDocument) { expect_packed_is_rows(hybrid_config()); }

TEST(PackedSequences, GatedDeltaNetAndMambaScansRestartAtEachDocument) { expect_packed_is_rows(hybrid_gdn_config()); }

}  // namespace
}  // namespace gale
