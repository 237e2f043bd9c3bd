// --use-multiparameter-pipeline-model-parallel (MindSpeed's MultiParameterFeature) against the plain
// pipeline on the same ranks. With --reset-attention-mask each stage sends the hidden states and
// the document ids (schedule/stage_tensors.h), and the stages after the first read no document ids
// from their data: here their dataset even gives wrong ones (every token its own document), which
// the plain pipeline does read and which change its losses, while the multi-parameter run still
// trains bitwise as the plain run on the right data (losses, gradient norms, every parameter and
// gradient of 3 iterations, and an evaluation) — so the later stages' masks came with the
// transfers. At PP2 and PP4, 1F1B and interleaved (also RiPipe's --recompute-in-advance order), with DP2, TP2 with sequence parallelism, with
// --optimize-send-recv-comm, and without --reset-attention-mask (the list of the hidden states
// alone). The messages are counted: one more per forward transfer for the ids, none more backward
// (the ids have no gradient), and the agreement's two per sending chunk and iteration.
#include <gtest/gtest.h>

#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_bitwise.h"
#include "testing_run.h"

namespace gale {
namespace {

using testing::Layout;
using testing::TestRun;

const std::vector<std::string> kDocuments = {"--reset-attention-mask", "--reset-position-ids"};

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"pp2", 2, testing::join({{"--pipeline-model-parallel-size", "2"}, kDocuments})},
      {"pp2_vpp2", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
                      kDocuments})},
      {"pp2_vpp2_recompute_in_advance", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                       "--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "1",
                       "--recompute-in-advance"},
                      kDocuments})},
      {"pp2_optimize_send_recv_comm", 2,
       testing::join({{"--pipeline-model-parallel-size", "2", "--optimize-send-recv-comm"}, kDocuments})},
      {"pp2_hidden_states_only", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp4", 4, testing::join({{"--pipeline-model-parallel-size", "4", "--num-layers", "8"}, kDocuments})},
      {"pp4_vpp2", 4,
       testing::join({{"--pipeline-model-parallel-size", "4", "--num-layers", "8",
                       "--num-virtual-stages-per-pipeline-rank", "2"},
                      kDocuments})},
      {"pp2_dp2", 4, testing::join({{"--pipeline-model-parallel-size", "2"}, kDocuments})},
      {"tp2_pp2_sp", 4,
       testing::join({{"--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
                       "--sequence-parallel"},
                      kDocuments})},
  };
  return all;
}

// 4 layers (8 at PP4), 16 sequences of 16 tokens per iteration in micro-batches of 2.
const std::vector<std::string>& kCommon = testing::kPipelineTestFlags;

// SyntheticDataset whose document ids are wrong when `wrong` (every token its own document).
class DocumentsDataset : public testing::SyntheticDataset {
 public:
  DocumentsDataset(int64_t S, bool wrong) : SyntheticDataset(100000, S, testing::kTinyVocab), wrong_(wrong) {}
  Status get(int64_t index, TrainingSample* out) const override {
    GALE_RETURN_IF_ERROR(SyntheticDataset::get(index, out));
    if (wrong_)
      for (size_t s = 0; s < out->document_ids.size(); ++s) out->document_ids[s] = static_cast<int32_t>(s);
    return Status::Ok();
  }

 private:
  bool wrong_;
};

int64_t sends(const TestRun& run) {
  int64_t n = run.engine->ps.pp()->stats().calls[static_cast<int>(CommOp::kSend)];
  if (run.engine->pp_backward) n += run.engine->pp_backward->stats().calls[static_cast<int>(CommOp::kSend)];
  return n;
}
int64_t receives(const TestRun& run) {
  int64_t n = run.engine->ps.pp()->stats().calls[static_cast<int>(CommOp::kRecv)];
  if (run.engine->pp_backward) n += run.engine->pp_backward->stats().calls[static_cast<int>(CommOp::kRecv)];
  return n;
}

class MultiParameterPipeline : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(MultiParameterPipeline, BitwiseEqualToThePlainPipeline) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const std::vector<std::string> flags =
      testing::join({kCommon, llama ? testing::kTinyLlama : testing::kTinyGpt, layout->flags});
  testing::TestRun plain(flags, test::world(), testing::kTinyVocab);
  testing::TestRun multi(testing::join({flags, {"--use-multiparameter-pipeline-model-parallel"}}), test::world(),
                         testing::kTinyVocab);
  const bool documents = plain.args.data.reset_attention_mask;
  const int pp_rank = plain.engine->ps.coords().pp;
  ASSERT_EQ(plain.engine->stage_tensors, nullptr);
  ASSERT_NE(multi.engine->stage_tensors, nullptr);
  EXPECT_EQ(multi.engine->stage_tensors->document_ids, documents);
  if (name.find("recompute_in_advance") != std::string::npos) {
    ASSERT_EQ(multi.engine->ripipe, RiPipe::kAdvance);  // the RiPipe order (recompute steps between the transfers)
  }
  plain.set_data(std::make_unique<DocumentsDataset>(16, false));
  multi.set_data(std::make_unique<DocumentsDataset>(16, /*wrong=*/pp_rank > 0));
  for (const testing::TestRun* run : {&plain, &multi}) {
    run->engine->ps.pp()->reset_stats();
    if (run->engine->pp_backward) run->engine->pp_backward->reset_stats();
  }

  constexpr int kIterations = 3;
  plain.train(kIterations);
  multi.train(kIterations);
  if (plain.engine->chunks.size() == 1) {
    testing::expect_runs_bit_identical(multi, plain, name);
  } else {
    testing::expect_chunks_bit_identical(multi, plain, kIterations, "");
  }

  // Messages: M micro-batches per iteration; each of this rank's chunks that is not the last stage
  // sends M forward transfers (one more message each for the ids) and its agreement text (2).
  const int64_t M = 16 / (2 * plain.engine->ps.dp_size());
  const int64_t V = static_cast<int64_t>(plain.engine->chunks.size());
  const int P = plain.engine->ps.pp_size();
  const int64_t sending = V - (pp_rank == P - 1 ? 1 : 0), receiving = V - (pp_rank == 0 ? 1 : 0);
  const int64_t extra = documents ? 1 : 0;
  EXPECT_EQ(sends(multi), sends(plain) + kIterations * sending * (M * extra + 2));
  EXPECT_EQ(receives(multi), receives(plain) + kIterations * receiving * (M * extra + 2));

  // Evaluation (forward only) through the same transfers.
  int64_t consumed_plain = 0, consumed_multi = 0;
  auto eval_plain = plain.trainer->evaluate(*plain.data, &consumed_plain, 2);
  auto eval_multi = multi.trainer->evaluate(*multi.data, &consumed_multi, 2);
  ASSERT_TRUE(eval_plain.ok()) << eval_plain.status().to_string();
  ASSERT_TRUE(eval_multi.ok()) << eval_multi.status().to_string();
  EXPECT_EQ(*eval_multi, *eval_plain) << "evaluation loss";

  // The check can fail: the plain pipeline reads the later stages' (here wrong) document ids.
  if (documents) {
    testing::TestRun misled(flags, test::world(), testing::kTinyVocab);
    misled.set_data(std::make_unique<DocumentsDataset>(16, /*wrong=*/pp_rank > 0));
    misled.train(kIterations);
    EXPECT_NE(misled.losses, plain.losses) << "the later stages' document ids do not change the plain pipeline";
  }
}

// The engine refuses what the feature refuses (for callers that build it without the registry):
// context parallelism with document ids (4 ranks: PP2 x CP2).
TEST(MultiParameterPipelineEngine, ContextParallelDocumentIdsNotSupportedYet) {
  if (test::world()->size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> argv = testing::join(
      {{"gale"}, kCommon, testing::kTinyLlama,
       {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2", "--reset-attention-mask",
        "--use-multiparameter-pipeline-model-parallel"}});
  std::vector<char*> ptrs;
  for (auto& a : argv) ptrs.push_back(a.data());
  ASSERT_TRUE(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()).ok());
  ASSERT_TRUE(validate_all_pretrain_args(args, parser, 4).ok());
  args.model.padded_vocab_size = 256;
  auto built = build_engine(args, test::world(), reference_ops(), {});
  ASSERT_FALSE(built.ok());
  EXPECT_EQ(built.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(built.status().message().find("--use-multiparameter-pipeline-model-parallel with --context-parallel-size 2 "
                                          "and --reset-attention-mask: not supported yet"),
            std::string::npos)
      << built.status().message();
}

INSTANTIATE_TEST_SUITE_P(Layouts, MultiParameterPipeline,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
