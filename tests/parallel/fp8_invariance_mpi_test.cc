// Parallel invariance of --fp8-format (model/fp8.h) on 2 ranks against the single-process run:
// TP 2 (with and without sequence parallelism) and DP 2 with the distributed optimizer.
//
// delayed: every amax is reduced (max) over TP×DP×CP before the scale update, as Megatron's amax
//   reduction group, so TP 2 (SP too) quantises every element with the single-process scale: losses within
//   1e-5 relative over 3 steps, grad norms 1e-4 (the GEMMs' own summation order only), and every
//   linear layer's FP8 scales within 1e-5 of the reference's (their amaxes differ in the last bits
//   only). DP 2 within 2e-3: each rank's output gradients are those of its half of the batch, twice
//   the single process's (the data-parallel mean comes after), and at step 1 the scale is still 1,
//   so E5M2's subnormal range rounds them differently (as in Megatron); later steps' reduced amaxes
//   double with them, so those scales are half the reference's.
// mxfp8: with every block of 32 inside one rank's shard (hidden 64, linear_proj 32 and fc2 128
//   columns per rank, qkv 96 and fc1 128 rows per rank), the same blocks: the same 1e-5.
// tensorwise: a weight's (and a column-parallel output gradient's) current scale comes from this
//   rank's shard, as TE's Float8CurrentScaling does without amax reduction, so TP 2 quantises
//   those with other scales: losses within 2e-3 relative; DP 2 within 1e-5 (a power-of-two factor on
//   the gradients changes the current scale by exactly its inverse).
// A layout that skipped the amax reduction (deliberately broken) misses the delayed tolerance.
#include <cstring>

#include <gtest/gtest.h>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--ffn-hidden-size", "256",
    "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--lr", "2e-3", "--train-iters", "5", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.0",
    "--attention-dropout", "0.0", "--eval-iters", "0", "--log-interval", "1000", "--fp8-format", "hybrid"};

const char* const kRecipes[] = {"delayed", "mxfp8", "tensorwise"};

class Fp8Invariance : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Fp8Invariance, MatchesSingleProcess) {
  const auto& [name, r] = GetParam();
  const std::string recipe = kRecipes[r];
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  std::vector<std::string> flags = testing::join({kCommon, {"--fp8-recipe", recipe, "--fp8-amax-history-len", "2"}});
  const int steps = 3;
  testing::LayoutAndReference t = testing::train_layout_and_reference(flags, *layout, steps);
  const bool tp = name.rfind("tp2", 0) == 0;
  const bool loose = (recipe == "tensorwise" && tp) || (recipe == "delayed" && name == "dp2_distopt");
  const double tol = loose ? 2e-3 : 1e-5;
  for (int i = 0; i < steps; ++i) {
    EXPECT_NEAR(t.run->losses[i], t.reference->losses[i], tol * t.reference->losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(t.run->grad_norms[i], t.reference->grad_norms[i], 10 * tol * t.reference->grad_norms[i])
        << "grad norm of iteration " << i + 1;
  }
  if (recipe != "delayed" || !tp) return;
  const ParamBuffer& pb = t.run->engine->chunks[0]->params();
  const ParamBuffer& ref = t.reference->engine->chunks[0]->params();
  int scales = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (s.name.find("._extra_state.fp8_scale") == std::string::npos) continue;
    const int rid = ref.find(s.whole_model_name());
    ASSERT_GE(rid, 0) << s.name;
    for (int k = 0; k < 3; ++k)
      EXPECT_NEAR(pb.param_data(id)[k], ref.param_data(rid)[k], 1e-5 * ref.param_data(rid)[k])
          << s.name << " [" << k << "]";
    EXPECT_NE(pb.param_data(id)[2], 1.0f) << s.name << ": the gradient scale never updated";
    ++scales;
  }
  EXPECT_EQ(scales, 8);  // 2 layers x qkv, proj, fc1, fc2
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fp8Invariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Range(0, 3)),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + kRecipes[std::get<1>(info.param)]; });

}  // namespace
}  // namespace gale
