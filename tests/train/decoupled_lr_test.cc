// --decoupled-lr / --decoupled-min-lr (Megatron): the word embedding and the output layer follow
// the same schedule between their own bounds; every other parameter keeps --lr's.
#include <gtest/gtest.h>

#include "pretrain_cli.h"
#include "testing_run.h"

namespace gale {
namespace {

const std::vector<std::string> kRun = {
    "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4",
    "--lr", "3e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--min-lr", "3e-4", "--mock-data",
    "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--untie-embeddings-and-output-weights"};

TEST(DecoupledLr, EmbeddingAndOutputLayerStepWithTheirOwnRate) {
  testing::TestRun initial(kRun, make_self_communicator("world"), 60);
  testing::TestRun frozen(testing::join({kRun, {"--decoupled-lr", "0", "--decoupled-min-lr", "0"}}), make_self_communicator("world"), 60);
  frozen.train(3);
  const ParamBuffer &a = frozen.model().params(), &b = initial.model().params();
  int checked = 0;
  for (int id = 0; id < a.size(); ++id) {
    const std::string& name = a.spec(id).name;
    const bool decoupled = name == "embedding.word_embeddings.weight" || name == "output_layer.weight";
    int64_t moved = 0;
    for (int64_t i = 0; i < a.spec(id).local_numel(); ++i) moved += a.param_data(id)[i] != b.param_data(id)[i];
    if (decoupled) {
      EXPECT_EQ(moved, 0) << name << " moved with --decoupled-lr 0";
      ++checked;
    } else {
      EXPECT_GT(moved, 0) << name;
    }
  }
  EXPECT_EQ(checked, 2);
  // The rate of iteration 3: 0 throughout (both bounds 0), the main rate is not.
  EXPECT_EQ(frozen.trainer->decoupled_learning_rate(), 0.0);
  EXPECT_GT(frozen.engine->scheduler->lr(), 0.0);
}

TEST(DecoupledLr, SameBoundsAsLrChangeNothing) {
  testing::TestRun plain(kRun, make_self_communicator("world"), 60);
  testing::TestRun same(testing::join({kRun, {"--decoupled-lr", "3e-3", "--decoupled-min-lr", "3e-4"}}),
                        make_self_communicator("world"), 60);
  EXPECT_EQ(plain.train(4), same.train(4));
  EXPECT_FALSE(plain.trainer->decoupled_learning_rate().has_value());
  EXPECT_EQ(same.trainer->decoupled_learning_rate(), plain.engine->scheduler->lr());
  // Without --decoupled-min-lr the floor is --min-lr.
  testing::TestRun floor(testing::join({kRun, {"--decoupled-lr", "6e-3"}}), make_self_communicator("world"), 60);
  floor.engine->scheduler->set_num_steps(1000);
  EXPECT_DOUBLE_EQ(*floor.trainer->decoupled_learning_rate(), 3e-4);
}

TEST(DecoupledLr, FlagErrors) {
  testing::expect_one_line_error({{"--decoupled-min-lr", "1e-5"}, 1, "--decoupled-min-lr needs --decoupled-lr"});
  testing::expect_one_line_error({{"--decoupled-lr", "-1"}, 1, "--decoupled-lr: expected a non-negative number"});
}

}  // namespace
}  // namespace gale
