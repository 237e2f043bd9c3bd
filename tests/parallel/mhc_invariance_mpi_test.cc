// Parallel invariance of --enable-mhc-connections: tensor parallelism with and without sequence
// parallelism (the hyper-connection modules' parameters replicated, their gradients partial per TP
// rank under SP and all-reduced over TP), data parallelism with the distributed optimizer, context
// parallelism with every CP algorithm of 2 ranks (ring, all-gather, Ulysses a2a, kv all-gather,
// adaptive; the streams and the modules are per token, so they shard with the sequence; the modules'
// gradients are summed over CP with the others') and --recompute-modules mhc, for a GPT and for an
// MLA model, reproduce the single-process run: losses and grad norms within 1e-5 relative, final
// parameters within 1e-3 and gradients within 3e-5 (relative, with a floor for the gradients that are
// zero in exact arithmetic).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "layout_invariance.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"cp2_p2p_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp2_allgather", 2, {"--context-parallel-size", "2", "--cp-comm-type", "allgather"}},
      {"cp2_a2a", 2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp2_kvallgather", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "kvallgather_cp_algo"}},
      {"cp2_adaptive", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"}},
      // --recompute-modules mhc: one block, and blocks of 2 layers with layernorm under TP + SP and CP.
      {"tp2_sp_recompute_mhc", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                   "--recompute-granularity", "selective", "--recompute-modules", "mhc"}},
      {"cp2_recompute_mhc_layernorm_blocks2", 2, {"--context-parallel-size", "2", "--recompute-activations",
                                                  "--recompute-modules", "mhc", "layernorm",
                                                  "--mhc-recompute-layer-num", "2"}},
  };
  return all;
}

// GPT with biases, 3 residual streams, hidden dropout (the modules' dropout over the n·H columns).
const std::vector<std::string> kCommon = {
    "--num-layers", "3", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5",
    "--lr", "2e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
    "--make-vocab-size-divisible-by", "64", "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters",
    "0", "--log-interval", "1000", "--clip-grad", "0.5", "--enable-mhc-connections", "--mhc-num-residual-streams", "3",
    "--mhc-sinkhorn-iterations", "3", "--mhc-init-gating-factor", "0.5"};

// DeepSeek-like MLA (query latent, latent norms, RMSNorm, SwiGLU, RoPE) in attention's place.
const std::vector<std::string> kMla = {"--multi-latent-attention", "--kv-lora-rank", "12", "--qk-head-dim", "6",
                                       "--qk-pos-emb-head-dim", "4", "--v-head-dim", "5", "--q-lora-rank", "10",
                                       "--qk-layernorm", "--normalization", "RMSNorm", "--swiglu",
                                       "--position-embedding-type", "rope", "--disable-bias-linear"};

class MhcInvariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

// As testing::expect_matches_reference, but each gradient's error relative to max(‖ref‖, 1e-3·‖all
// gradients‖): the last layer's mlp_hyper_connection H_res logits (so alpha_res) get an exactly zero
// gradient (the streams' mean at the decoder's end sends every stream the same gradient, and H_res's
// last column normalisation makes Σ_ij g_j·H_res[i, j] = Σ_j g_j whatever the logits), and the first
// layer's self-attention one nearly zero (equal input streams); on those, only rounding is left.
TEST_P(MhcInvariance, MatchesSingleProcess) {
  const auto& [name, mla] = GetParam();
  const testing::Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  testing::LayoutAndReference t =
      testing::train_layout_and_reference(mla ? testing::join({kCommon, kMla}) : kCommon, *layout, 5);
  const testing::TestRun &run = *t.run, &reference = *t.reference;
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], reference.grad_norms[i], 1e-5 * reference.grad_norms[i]) << "grad norm " << i + 1;
  }
  const ParamBuffer& ref = reference.engine->chunks[0]->params();
  double all = 0.0;
  for (int64_t i = 0; i < ref.trainable_numel(); ++i) all += double(ref.flat_grads().data<float>()[i]) * ref.flat_grads().data<float>()[i];
  const double floor = 1e-3 * std::sqrt(all);
  const ParamBuffer& pb = run.engine->chunks[0]->params();
  const std::vector<FlatRange> owned = testing::owned_flat_ranges(run, 0);
  int modules = 0;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    const int rid = ref.find(s.whole_model_name());
    ASSERT_GE(rid, 0) << s.name;
    modules += s.name.find("hyper_connection") != std::string::npos;
    EXPECT_LT(testing::shard_relative_error(s, pb.param_data(id), ref.param_data(rid), nullptr), 1e-3) << s.name;
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < s.local_numel(); ++i) {
      if (std::none_of(owned.begin(), owned.end(),
                       [&](const FlatRange& r) { return r.begin <= s.offset + i && s.offset + i < r.end; }))
        continue;
      const double r = ref.grad_data(rid)[s.global_index(i)];
      diff += (pb.grad_data(id)[i] - r) * (pb.grad_data(id)[i] - r);
      norm += r * r;
    }
    EXPECT_LT(std::sqrt(diff), 3e-5 * std::max(std::sqrt(norm), floor)) << "gradient " << s.name;
  }
  EXPECT_EQ(modules, 3 * 2 * 5);  // 3 layers, 2 modules of 5 parameters
}

INSTANTIATE_TEST_SUITE_P(Layouts, MhcInvariance,
                         ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_mla" : "_gpt");
                         });

}  // namespace
}  // namespace gale
