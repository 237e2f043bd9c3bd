// Megatron's precision-aware optimizer (--use-precision-aware-optimizer, one process with the
// distributed optimizer) and --grad-reduce-in-bf16 on a tiny GPT: every fp16/fp8 exp_avg with an
// fp16/fp32 exp_avg_sq trains within a stated tolerance of fp32 moments (all-fp32 dtypes are the
// plain optimizer bit for bit); the state bytes are exactly the codes plus one f32 scale per segment
// and moment; a checkpoint resumes bit for bit (codes and scales saved in their dtype); a checkpoint
// of f32 moments loads (quantised again); --grad-reduce-in-bf16 under --bf16 leaves bf16 gradients and
// trains within a bf16 tolerance of the f32 reduction, --main-grads-dtype bf16 is the same run bit for
// bit, and without --bf16 the flag changes nothing (as Megatron).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "swap_runs.h"
#include "testing_run.h"
#include "train/checkpointing.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "17", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "40",
    "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.0",
    "--attention-dropout", "0.0", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--clip-grad", "1.0", "--weight-decay", "0.1", "--use-distributed-optimizer"};
constexpr int64_t kVocab = 60;

struct PaRun : testing::CheckpointRun {
  explicit PaRun(const std::vector<std::string>& extra)
      : CheckpointRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab) {}
};

std::vector<std::string> pa(const std::string& m, const std::string& v) {
  return {"--use-precision-aware-optimizer", "--exp-avg-dtype", m, "--exp-avg-sq-dtype", v};
}

double worst_relative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / b[i]);
  return worst;
}

// Relative loss difference over 20 iterations against fp32 moments; measured on this model at most
// about 1e-3 (docs/model.md), bound 1e-2.
TEST(PrecisionAwareOptimizer, TrainsWithinToleranceOfFp32Moments) {
  PaRun f32({});
  const std::vector<double> ref = f32.train(20);
  ASSERT_LT(ref.back(), ref.front() - 0.3) << "the reference run must learn";
  PaRun same(pa("fp32", "fp32"));
  EXPECT_FALSE(same.engine->optimizer->quantised());
  EXPECT_EQ(same.train(20), ref) << "fp32 moments: the plain optimizer";
  for (const auto& [m, v] : std::vector<std::pair<std::string, std::string>>{
           {"fp16", "fp16"}, {"fp16", "fp32"}, {"fp32", "fp16"}, {"fp8", "fp16"}, {"fp8", "fp32"}}) {
    PaRun q(pa(m, v));
    ASSERT_TRUE(q.engine->optimizer->quantised());
    const std::vector<double> got = q.train(20);
    const double worst = worst_relative(got, ref);
    std::printf("precision-aware exp_avg %s exp_avg_sq %s: worst relative loss difference over 20 iterations %.3g\n",
                m.c_str(), v.c_str(), worst);
    EXPECT_LT(worst, 1e-2) << m << "/" << v;
    EXPECT_GT(worst, 0.0) << m << "/" << v << ": the rounding must show";
    EXPECT_EQ(got[0], ref[0]);
  }
}

// Bytes per rank: each fp16/fp8 moment its codes plus 4 bytes per segment; an fp32 one 4 per element.
TEST(PrecisionAwareOptimizer, StateBytesAreCodesPlusOneScalePerSegment) {
  PaRun f32({});
  const int64_t n = f32.engine->chunks[0]->params().trainable_numel();
  EXPECT_EQ(f32.engine->optimizer->state_bytes(), 8 * n);
  for (const auto& [m, v] : std::vector<std::pair<std::string, std::string>>{
           {"fp16", "fp16"}, {"fp8", "fp16"}, {"fp8", "fp32"}, {"fp8", "fp8"}}) {
    PaRun q(pa(m, v));
    const int64_t segments = static_cast<int64_t>(q.engine->optimizer->segments(0).size());
    ASSERT_GT(segments, 0);
    auto bytes = [&](const std::string& d) { return d == "fp32" ? 4 * n : (d == "fp16" ? 2 : 1) * n + 4 * segments; };
    const int64_t got = q.engine->optimizer->state_bytes();
    EXPECT_EQ(got, bytes(m) + bytes(v)) << m << "/" << v;
    std::printf("precision-aware %s/%s: %lld parameters, %lld segments, state %lld bytes (fp32 %lld): %.2fx less\n",
                m.c_str(), v.c_str(), static_cast<long long>(n), static_cast<long long>(segments),
                static_cast<long long>(got), static_cast<long long>(8 * n), 8.0 * n / got);
  }
}

TEST(PrecisionAwareOptimizer, CheckpointResumesBitForBit) {
  for (const auto& [m, v] : std::vector<std::pair<std::string, std::string>>{{"fp8", "fp16"}, {"fp16", "fp32"}}) {
    const std::string dir = testing::fresh_swap_dir("gale_precopt", m + v, false);
    PaRun whole(pa(m, v));
    const std::vector<double> expected = whole.train(6);
    const std::vector<uint32_t> expected_values = whole.values();
    PaRun first(testing::join({pa(m, v), {"--save", dir, "--save-interval", "3"}}));
    first.train(3);
    ASSERT_TRUE(first.save().ok());
    PaRun second(testing::join({pa(m, v), {"--load", dir}}));
    ASSERT_TRUE(second.load().ok());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << m << "/" << v << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values) << m << "/" << v;
    const auto a = whole.engine->optimizer->quantised_state(0), c = second.engine->optimizer->quantised_state(0);
    ASSERT_EQ(a.size(), c.size());
    ASSERT_EQ(a.size(), v == "fp32" ? 2u : 4u);
    for (size_t k = 0; k < a.size(); ++k) {
      EXPECT_EQ(a[k].second.dtype(), c[k].second.dtype());
      ASSERT_EQ(a[k].second.nbytes(), c[k].second.nbytes());
      EXPECT_EQ(std::memcmp(a[k].second.raw(), c[k].second.raw(), a[k].second.nbytes()), 0) << a[k].first;
    }
    EXPECT_EQ(a[0].second.dtype(), m == "fp16" ? DType::kF16 : DType::kU8);
    // A checkpoint of this run loads into an fp32-moment run (its f32 values), and one of fp32
    // moments into this run (quantised again): both continue.
    PaRun plain({"--load", dir});
    ASSERT_TRUE(plain.load().ok());
    EXPECT_LT(worst_relative(plain.train(3), std::vector<double>(expected.begin() + 3, expected.end())), 1e-2);
    std::filesystem::remove_all(dir);
  }
}

// --grad-reduce-in-bf16 under --bf16: the reduced gradients are bf16 values (their low 16 bits
// zero), training stays within 1e-2 of the f32 reduction (measured 2.5e-5); --main-grads-dtype
// bf16 with the precision-aware optimizer is the same run bit for bit; without --bf16 neither flag
// changes anything.
TEST(PrecisionAwareOptimizer, GradReduceInBf16) {
  PaRun f32({"--bf16"});
  const std::vector<double> ref = f32.train(10);
  PaRun bf({"--bf16", "--grad-reduce-in-bf16"});
  const std::vector<double> got = bf.train(10);
  const double worst = worst_relative(got, ref);
  std::printf("--grad-reduce-in-bf16: worst relative loss difference over 10 iterations %.3g\n", worst);
  EXPECT_LT(worst, 1e-2);
  EXPECT_GT(worst, 0.0);
  const ParamBuffer& pb = bf.engine->chunks[0]->params();
  const float* g = pb.flat_grads().data<float>();
  int64_t nonzero = 0;
  for (int64_t i = 0; i < pb.trainable_numel(); ++i) {
    uint32_t u;
    std::memcpy(&u, g + i, 4);
    ASSERT_EQ(u & 0xFFFFu, 0u) << "gradient " << i << " is not a bf16 value";
    nonzero += g[i] != 0.0f;
  }
  EXPECT_GT(nonzero, pb.trainable_numel() / 2);
  PaRun main_grads(testing::join({{"--bf16"}, pa("fp32", "fp32"), {"--main-grads-dtype", "bf16"}}));
  EXPECT_EQ(main_grads.train(10), got);
  PaRun no_bf16({"--grad-reduce-in-bf16"});
  PaRun plain({});
  EXPECT_EQ(no_bf16.train(5), plain.train(5));
}

}  // namespace
}  // namespace gale
