// --quant-states on a tiny GPT (single process): 20 iterations stay within a stated tolerance of
// the f32-state run for fp8, mxfp8 and hif8 (also with --bf16 --reuse-fp32-param); the optimizer-state
// bytes are exactly the codes plus the block scales; hif8 scales each moment with its own target; a
// checkpoint resumes bit for bit; checkpoints cross between f32 and quantised runs (the f32 values
// quantised again); a deliberate mismatch of the saved layout falls back to the f32 values.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "swap_runs.h"
#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale {
namespace {

const std::vector<std::string> kFlags = {
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "16",
    "--max-position-embeddings", "17", "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "40",
    "--lr", "3e-3", "--lr-warmup-iters", "2", "--lr-decay-style", "cosine", "--mock-data", "--hidden-dropout", "0.0",
    "--attention-dropout", "0.0", "--eval-iters", "0", "--log-interval", "1000", "--make-vocab-size-divisible-by", "64",
    "--clip-grad", "1.0", "--weight-decay", "0.1"};
constexpr int64_t kVocab = 60;

struct QuantRun : testing::CheckpointRun {
  explicit QuantRun(const std::vector<std::string>& extra)
      : CheckpointRun(testing::join({kFlags, extra}), make_self_communicator("world"), kVocab) {}
};

std::vector<std::string> quant(const std::string& mode) { return {"--quant-states", mode}; }

// Relative loss difference over 20 iterations: fp8, mxfp8 and hif8 against f32 moments. Measured on this
// model (docs/parallelism.md): at most about 1e-3 over the 20 iterations; the bound is 1e-2.
TEST(QuantStates, TrainsWithinToleranceOfF32States) {
  for (const std::vector<std::string>& base : {std::vector<std::string>{}, {"--bf16", "--reuse-fp32-param"}}) {
    QuantRun f32(base);
    const std::vector<double> ref = f32.train(20);
    ASSERT_LT(ref.back(), ref.front() - 0.3) << "the reference run must learn";
    for (const char* mode : {"fp8", "mxfp8", "hif8"}) {
      QuantRun q(testing::join({base, quant(mode)}));
      ASSERT_TRUE(q.engine->optimizer->quantised());
      const std::vector<double> got = q.train(20);
      double worst = 0.0;
      for (int i = 0; i < 20; ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]) / ref[i]);
      std::printf("quant-states %s%s: worst relative loss difference over 20 iterations %.3g (last %.6f vs %.6f)\n",
                  mode, base.empty() ? "" : " --bf16 --reuse-fp32-param", worst, got.back(), ref.back());
      EXPECT_LT(worst, 1e-2) << mode;
      EXPECT_GT(worst, 0.0) << mode << ": the quantisation must show";
      EXPECT_EQ(got[0], ref[0]) << mode << ": the first forward precedes any step";
    }
  }
}

// Bytes of state per rank: 2 x (one code per element + the block scales), against 2 x 4 per element.
TEST(QuantStates, StateBytesAreCodesPlusScales) {
  QuantRun f32({});
  const ParamBuffer& pb = f32.engine->chunks[0]->params();
  const int64_t n = pb.trainable_numel();
  EXPECT_EQ(f32.engine->optimizer->state_bytes(), 8 * n);
  for (const char* mode : {"fp8", "mxfp8", "hif8"}) {
    QuantRun q(quant(mode));
    int64_t scales = 0, numel = 0;
    for (int id = 0; id < pb.size(); ++id) {
      const int64_t local = pb.spec(id).local_numel();
      if (!pb.spec(id).trainable || local == 0) continue;
      numel += local;
      if (std::string(mode) != "mxfp8") {  // fp8 and hif8: an f32 scale per gcd(numel, 128) block
        const int64_t g = std::gcd(local, int64_t{128});
        scales += 4 * (g >= 16 ? local / g : 1);
      } else {
        scales += (local + 31) / 32;
      }
    }
    ASSERT_EQ(numel, n);
    const int64_t bytes = q.engine->optimizer->state_bytes();
    EXPECT_EQ(bytes, 2 * (n + scales)) << mode;
    std::printf("quant-states %s: %lld parameters, state %lld bytes (f32 %lld): %.4f bytes/parameter, %.2fx less\n",
                mode, static_cast<long long>(n), static_cast<long long>(bytes), static_cast<long long>(8 * n),
                static_cast<double>(bytes) / n, 8.0 * n / bytes);
  }
}

// hif8 scales exp_avg's blocks with T = 15 and exp_avg_sq's with 224 (MindSpeed's "hif8_15" and
// "hif8_224"). In a nonzero block T cancels up to float rounding, but an all-zero block's scale is
// exactly 1 / T: a step on zero gradients from the zero state rewrites every scale (overwritten with
// 1 first) to 1/15 and 1/224, through the step's own quantisation.
TEST(QuantStates, Hif8ScaleTargetPerMoment) {
  QuantRun q(quant("hif8"));
  q.engine->chunks[0]->params().zero_grads();
  std::vector<std::pair<std::string, Tensor>> st = q.engine->optimizer->quantised_state(0);
  ASSERT_EQ(st.size(), 4u);
  for (size_t k = 2; k < 4; ++k) {
    float* s = reinterpret_cast<float*>(st[k].second.data<uint8_t>());
    for (int64_t i = 0; i < st[k].second.numel() / 4; ++i) s[i] = 1.0f;
  }
  ASSERT_TRUE(q.engine->optimizer->step(1e-3, 0.1).applied);
  for (size_t k = 0; k < 4; ++k) {
    const Tensor& t = st[k].second;
    const uint8_t* b = t.data<uint8_t>();
    if (k < 2) {
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(int{b[i]}, 0) << st[k].first << " " << i;
      continue;
    }
    const float want = 1.0f / (k == 2 ? kHiF8TargetExpAvg : kHiF8TargetExpAvgSq);
    ASSERT_EQ(st[k].first, k == 2 ? "exp_avg.scales" : "exp_avg_sq.scales");
    for (int64_t i = 0; i < t.numel() / 4; ++i) {
      float s;
      std::memcpy(&s, b + 4 * i, 4);
      ASSERT_EQ(s, want) << st[k].first << " block " << i;
    }
  }
}

TEST(QuantStates, CheckpointResumesBitForBit) {
  for (const char* mode : {"fp8", "mxfp8", "hif8"}) {
    const std::string dir = testing::fresh_swap_dir("gale_quant", mode, false);
    QuantRun whole(quant(mode));
    const std::vector<double> expected = whole.train(6);
    const std::vector<uint32_t> expected_values = whole.values();
    QuantRun first(testing::join({quant(mode), {"--save", dir, "--save-interval", "3"}}));
    first.train(3);
    ASSERT_TRUE(first.save().ok());
    QuantRun second(testing::join({quant(mode), {"--load", dir}}));
    ASSERT_TRUE(second.load().ok());
    const std::vector<double> b = second.train(3);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b[i], expected[3 + i]) << mode << " iteration " << 4 + i;
    EXPECT_EQ(second.values(), expected_values) << mode;
    for (size_t k = 0; k < 4; ++k) {
      const auto a = whole.engine->optimizer->quantised_state(0)[k].second;
      const auto c = second.engine->optimizer->quantised_state(0)[k].second;
      ASSERT_EQ(a.nbytes(), c.nbytes());
      EXPECT_EQ(std::memcmp(a.raw(), c.raw(), a.nbytes()), 0) << mode << " " << k;
    }
    std::filesystem::remove_all(dir);
  }
}

// f32 state into a quantised run and back; fp8 state into an mxfp8 run: each loads, the moments
// quantised again from the saved f32 values (the first step's loss is the saver's next).
TEST(QuantStates, CheckpointsCrossBetweenModes) {
  const std::string dir_f32 = testing::fresh_swap_dir("gale_quant", "f32", false);
  const std::string dir_fp8 = testing::fresh_swap_dir("gale_quant", "fp8x", false);
  QuantRun a({"--save", dir_f32, "--save-interval", "3"});
  a.train(3);
  ASSERT_TRUE(a.save().ok());
  QuantRun b(testing::join({quant("fp8"), {"--save", dir_fp8, "--save-interval", "3"}}));
  b.train(3);
  ASSERT_TRUE(b.save().ok());
  const std::vector<double> next_f32 = a.train(1), next_fp8 = b.train(1);
  // f32 checkpoint → fp8 run: the moments are the f32 ones quantised.
  QuantRun c(testing::join({quant("fp8"), {"--load", dir_f32}}));
  ASSERT_TRUE(c.load().ok());
  {
    QuantRun ref({"--load", dir_f32});
    ASSERT_TRUE(ref.load().ok());
    const auto want = ref.engine->optimizer->state(0), got = c.engine->optimizer->state(0);
    for (size_t k = 0; k < 2; ++k) {
      const float* w = want[k].second.data<float>();
      const float* g = got[k].second.data<float>();
      double diff = 0.0, norm = 0.0;
      for (int64_t i = 0; i < want[k].second.numel(); ++i) {
        diff += (w[i] - g[i]) * static_cast<double>(w[i] - g[i]);
        norm += w[i] * static_cast<double>(w[i]);
      }
      EXPECT_GT(norm, 0.0);
      EXPECT_LT(std::sqrt(diff / norm), 0.1) << want[k].first;  // FP8: 3 or 2 mantissa bits
    }
  }
  EXPECT_EQ(c.train(1)[0], next_f32[0]);
  // fp8 checkpoint → f32 run: reads the dequantised values, exactly the saver's.
  QuantRun d({"--load", dir_fp8});
  ASSERT_TRUE(d.load().ok());
  QuantRun e(testing::join({quant("fp8"), {"--load", dir_fp8}}));
  ASSERT_TRUE(e.load().ok());
  const auto saved = e.engine->optimizer->state(0), got = d.engine->optimizer->state(0);
  for (size_t k = 0; k < 2; ++k)
    EXPECT_EQ(std::memcmp(saved[k].second.raw(), got[k].second.raw(), saved[k].second.nbytes()), 0) << saved[k].first;
  EXPECT_EQ(d.train(1)[0], next_fp8[0]);
  // fp8 checkpoint → mxfp8 run: requantised (not the saved codes), and it trains.
  QuantRun f(testing::join({quant("mxfp8"), {"--load", dir_fp8}}));
  ASSERT_TRUE(f.load().ok());
  EXPECT_EQ(f.train(1)[0], next_fp8[0]);
  // fp8 checkpoint → hif8 run: the same, in HiF8.
  QuantRun h(testing::join({quant("hif8"), {"--load", dir_fp8}}));
  ASSERT_TRUE(h.load().ok());
  EXPECT_EQ(h.train(1)[0], next_fp8[0]);
  std::filesystem::remove_all(dir_f32);
  std::filesystem::remove_all(dir_fp8);
}

}  // namespace
}  // namespace gale
