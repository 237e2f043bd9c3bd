// --optimize-send-recv-comm (MindSpeed's OptimizeSendRecvCommFeature) against the plain 1F1B schedule
// on the same ranks: the gradients travel on the second pipeline communicator ("pp-backward") and the
// activations on the pipeline group, and nothing a step computes changes, so the losses, gradient
// norms, parameters and gradients of 3 iterations are bitwise equal, at PP2 and PP4, PP2 x DP2 and
// TP2 x PP2 with sequence parallelism, for the GPT and the LLaMA-like model, and with
// --variable-seq-lengths (micro-batches of different lengths, so transfers of different shapes on
// both communicators). The routing is checked by the send/receive counters of both communicators.
#include <gtest/gtest.h>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp4", 4, {"--pipeline-model-parallel-size", "4", "--num-layers", "8"}},
      {"pp2_dp2", 4, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_pp2_sp", 4,
       {"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"pp2_variable_seq_lengths", 2, {"--pipeline-model-parallel-size", "2", "--variable-seq-lengths"}},
      {"pp4_variable_seq_lengths", 4,
       {"--pipeline-model-parallel-size", "4", "--num-layers", "8", "--variable-seq-lengths"}},
  };
  return all;
}

// 4 layers (8 at PP4), 16 sequences of 16 tokens per iteration in micro-batches of 2.
const std::vector<std::string>& kCommon = testing::kPipelineTestFlags;

// Samples right-padded after 5 + (7·index mod 12) tokens (loss mask 0 on the padding), as an
// instruction dataset's: with --variable-seq-lengths each micro-batch is cut to its longest sample.
class PaddedSyntheticDataset : public testing::SyntheticDataset {
 public:
  PaddedSyntheticDataset(int64_t size, int64_t S, int64_t vocab) : SyntheticDataset(size, S, vocab), S_(S) {}
  Status get(int64_t index, TrainingSample* out) const override {
    GALE_RETURN_IF_ERROR(SyntheticDataset::get(index, out));
    out->unpadded_length = 5 + (7 * index) % 12;
    for (int64_t s = out->unpadded_length; s < S_; ++s) out->loss_mask[s] = 0.0f;
    return Status::Ok();
  }

 private:
  int64_t S_;
};

class OptimizeSendRecvComm : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(OptimizeSendRecvComm, BitwiseEqualToPlainOneFOneB) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const std::vector<std::string> flags =
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, layout->flags});
  testing::TestRun plain(flags, test::world(), testing::kTinyVocab);
  testing::TestRun optimized(testing::join({flags, {"--optimize-send-recv-comm"}}), test::world(), testing::kTinyVocab);
  const bool variable = plain.args.data.variable_seq_lengths;
  if (variable) {
    for (testing::TestRun* run : {&plain, &optimized})
      run->set_data(std::make_unique<PaddedSyntheticDataset>(100000, 16, testing::kTinyVocab));
  }
  ASSERT_EQ(plain.engine->pp_backward, nullptr);
  ASSERT_NE(optimized.engine->pp_backward, nullptr);
  const Comm& pp = optimized.engine->ps.pp();
  const Comm& backward = optimized.engine->pp_backward;
  EXPECT_EQ(backward->name(), "pp-backward");
  EXPECT_EQ(backward->world_ranks(), pp->world_ranks());
  EXPECT_NE(backward.get(), pp.get());
  pp->reset_stats();
  backward->reset_stats();
  plain.engine->ps.pp()->reset_stats();

  constexpr int kIterations = 3;
  plain.train(kIterations);
  optimized.train(kIterations);
  testing::expect_runs_bit_identical(optimized, plain, name);

  // Routing: M micro-batches per iteration; rank r sends activations unless last, gradients unless first.
  const int64_t M = 16 / (2 * optimized.engine->ps.dp_size()) * kIterations;
  const int r = pp->rank(), P = pp->size();
  const auto calls = [](const Comm& c, CommOp op) { return c->stats().calls[static_cast<int>(op)]; };
  const auto bytes = [](const Comm& c, CommOp op) { return c->stats().bytes[static_cast<int>(op)]; };
  EXPECT_EQ(calls(pp, CommOp::kSend), r < P - 1 ? M : 0) << "activations sent on the pipeline group";
  EXPECT_EQ(calls(pp, CommOp::kRecv), r > 0 ? M : 0) << "activations received on the pipeline group";
  EXPECT_EQ(calls(backward, CommOp::kSend), r > 0 ? M : 0) << "gradients sent on pp-backward";
  EXPECT_EQ(calls(backward, CommOp::kRecv), r < P - 1 ? M : 0) << "gradients received on pp-backward";
  EXPECT_EQ(backward->stats().total_calls(), calls(backward, CommOp::kSend) + calls(backward, CommOp::kRecv))
      << "pp-backward carries nothing but gradients";
  // The plain run sends and receives both directions on the pipeline group, the same bytes in all.
  const Comm& plain_pp = plain.engine->ps.pp();
  EXPECT_EQ(calls(plain_pp, CommOp::kSend), calls(pp, CommOp::kSend) + calls(backward, CommOp::kSend));
  EXPECT_EQ(calls(plain_pp, CommOp::kRecv), calls(pp, CommOp::kRecv) + calls(backward, CommOp::kRecv));
  EXPECT_EQ(bytes(plain_pp, CommOp::kSend), bytes(pp, CommOp::kSend) + bytes(backward, CommOp::kSend));
  if (variable) {  // transfers of several shapes: fewer bytes than M full-length messages
    const int64_t full = M * 2 * 16 * 64 * static_cast<int64_t>(sizeof(float));
    if (r < P - 1) {
      EXPECT_LT(bytes(pp, CommOp::kSend), full);
    }
    if (r > 0) {
      EXPECT_LT(bytes(backward, CommOp::kSend), full);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, OptimizeSendRecvComm,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
