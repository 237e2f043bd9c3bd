// --mamba-training-ssm-states-dtype (model/mamba_mixer.h): with bf16 inter-chunk states the mixer's
// forward and backward match a float64 chunked-SSD reference that rounds the states entering each
// chunk (tools/reference/mamba_ssm_states_reference.py), which the f32 scan does not; fp32 is the f32
// scan bit for bit; one chunk has no inter-chunk state; decoding never rounds; GPTModel's Mamba
// layers take the setting from ModelConfig::hybrid.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kernels/cpu/gemm.h"
#include "hybrid_test_model.h"
#include "mamba_test_mixer.h"
#include "model/mamba_mixer.h"
#include "model_test_batches.h"
#include "testing.h"
#include "testing_json.h"

namespace gale {
namespace {

// Two Mamba layers (the mixer tests use layer 0).
ModelConfig mixer_config(int64_t H, int64_t P, int64_t G, int64_t N, int64_t K) {
  return testing::mamba_mixer_config(2, H, P, G, N, K);
}

struct MixerRun {
  Tensor out, du;
  std::vector<std::vector<float>> grads;  // per parameter of MambaParamIds::all()
};

struct Mixer : testing::MambaTestMixer {
  using MambaTestMixer::MambaTestMixer;
  MambaMixerWeights weights(DType states, int64_t chunk) const {
    MambaMixerWeights m = mamba_mixer_weights(pb, w, sgemm, gemm_bf16);
    m.ssm_states = states;
    m.chunk = chunk;
    return m;
  }
  MixerRun run(const Tensor& u, const Tensor& r, int64_t S, int64_t B, DType states, int64_t chunk) {
    pb.zero_grads();
    MixerRun out;
    MambaMixerSaved saved;
    out.out = mamba_mixer_forward(d, weights(states, chunk), u, S, B, DType::kF32, &saved);
    out.du = mamba_mixer_backward(d, weights(states, chunk), saved, r, S, B);
    for (int id : w.all()) {
      const float* g = pb.grad_data(id);
      out.grads.emplace_back(g, g + pb.spec(id).local_numel());
    }
    return out;
  }
};

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.numel() == b.numel() &&
         std::memcmp(a.data<float>(), b.data<float>(), sizeof(float) * static_cast<size_t>(a.numel())) == 0;
}

void expect_bitwise_equal(const MixerRun& a, const MixerRun& b, const std::string& what) {
  EXPECT_TRUE(bitwise_equal(a.out, b.out)) << what << ": out";
  EXPECT_TRUE(bitwise_equal(a.du, b.du)) << what << ": d u";
  EXPECT_EQ(a.grads, b.grads) << what << ": parameter gradients";
}

struct Golden {
  nlohmann::json g;
  int64_t S = 0, B = 0, chunk = 0;
  ModelConfig c;
  Golden() {
    std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/mamba/ssm_states_bf16.json");
    GALE_CHECK(in.good()) << "reference/mamba/ssm_states_bf16.json";
    g = nlohmann::json::parse(in);
    const auto& dims = g["dims"];
    S = dims["S"];
    B = dims["B"];
    chunk = dims["chunk"];
    c = mixer_config(dims["H"], dims["headdim"], dims["ngroups"], dims["d_state"], dims["d_conv"]);
  }
  std::vector<std::pair<const char*, int>> params(const Mixer& m) const {
    return {{"w_in", m.w.in_proj}, {"conv_w", m.w.conv_w}, {"conv_b", m.w.conv_b}, {"a_log", m.w.a_log},
            {"d", m.w.d},          {"dt_bias", m.w.dt_bias}, {"norm_w", m.w.gnorm_w}, {"w_out", m.w.out_proj}};
  }
};

TEST(MambaSsmStates, Bf16MatchesTheChunkedFloat64Reference) {
  const Golden gd;
  Mixer m(gd.c);
  ASSERT_NO_FATAL_FAILURE(testing::set_params_from_json(m.pb, gd.params(m), gd.g["inputs"]));
  const Tensor u = testing::json_tensor(gd.g["inputs"]["u"], gd.S * gd.B, gd.c.hidden);
  const Tensor r = testing::json_tensor(gd.g["r"], gd.S * gd.B, gd.c.hidden);
  MambaMixerSaved saved;
  const MambaMixerWeights w = m.weights(DType::kBF16, gd.chunk);
  const Tensor out = mamba_mixer_forward(m.d, w, u, gd.S, gd.B, DType::kF32, &saved);
  testing::expect_near_reference(out.data<float>(), testing::json_floats(gd.g["out"]), "out");
  const Tensor du = mamba_mixer_backward(m.d, w, saved, r, gd.S, gd.B);
  testing::expect_near_reference(du.data<float>(), testing::json_floats(gd.g["grads"]["u"]), "d u");
  for (const auto& [name, id] : gd.params(m))
    testing::expect_near_reference(m.pb.grad_data(id), testing::json_floats(gd.g["grads"][name]), name);
}

// The rounding is visible at this tolerance: the f32 scan misses the reference (out and the
// gradients of A_log and dt_bias, which the rounded entering states reach through the chunk's decay).
TEST(MambaSsmStates, TheF32ScanMissesTheBf16Reference) {
  const Golden gd;
  Mixer m(gd.c);
  ASSERT_NO_FATAL_FAILURE(testing::set_params_from_json(m.pb, gd.params(m), gd.g["inputs"]));
  const Tensor u = testing::json_tensor(gd.g["inputs"]["u"], gd.S * gd.B, gd.c.hidden);
  const Tensor r = testing::json_tensor(gd.g["r"], gd.S * gd.B, gd.c.hidden);
  const MixerRun f32 = m.run(u, r, gd.S, gd.B, DType::kF32, gd.chunk);
  auto misses = [](const float* got, const std::vector<float>& want) {
    for (size_t i = 0; i < want.size(); ++i)
      if (std::fabs(got[i] - want[i]) > 1e-4 + 1e-3 * std::fabs(want[i])) return true;
    return false;
  };
  EXPECT_TRUE(misses(f32.out.data<float>(), testing::json_floats(gd.g["out"])));
  const std::vector<int> ids = m.w.all();
  for (size_t k = 0; k < ids.size(); ++k)
    if (ids[k] == m.w.a_log)
      EXPECT_TRUE(misses(f32.grads[k].data(), testing::json_floats(gd.g["grads"]["a_log"])));
}

// fp32 is Gale's f32 scan bit for bit, whatever the chunk size; bf16 within one chunk has no
// inter-chunk state to round, so it is the f32 scan too; past it, it differs.
TEST(MambaSsmStates, Fp32IsTheF32ScanAndOneChunkRoundsNothing) {
  const ModelConfig c = mixer_config(/*H=*/8, /*P=*/4, /*G=*/2, /*N=*/3, /*K=*/4);
  Mixer m(c);
  const int64_t S = 9, B = 2;
  Tensor u = Tensor::empty({S * B, c.hidden}), r = Tensor::empty({S * B, c.hidden});
  testing::fill_random(u.data<float>(), u.numel(), 5, 2.0f);
  testing::fill_random(r.data<float>(), r.numel(), 6);
  const MixerRun base = m.run(u, r, S, B, DType::kF32, 128);
  expect_bitwise_equal(m.run(u, r, S, B, DType::kF32, 2), base, "fp32, chunks of 2");
  expect_bitwise_equal(m.run(u, r, S, B, DType::kBF16, S), base, "bf16, one chunk");
  expect_bitwise_equal(m.run(u, r, S, B, DType::kBF16, 128), base, "bf16, Megatron's chunk of 128");
  const MixerRun bf16 = m.run(u, r, S, B, DType::kBF16, 3);
  EXPECT_FALSE(bitwise_equal(bf16.out, base.out)) << "bf16 states entering chunks 1 and 2";
  const MixerRun f16 = m.run(u, r, S, B, DType::kF16, 3);  // --fp16's default: f16 states
  EXPECT_FALSE(bitwise_equal(f16.out, base.out));
  EXPECT_FALSE(bitwise_equal(f16.out, bf16.out));
}

// Decoding (states carried between calls) never rounds: the setting is the training kernel's.
TEST(MambaSsmStates, DecodingWithStatesDoesNotRound) {
  const ModelConfig c = mixer_config(/*H=*/8, /*P=*/4, /*G=*/2, /*N=*/3, /*K=*/4);
  Mixer m(c);
  const int64_t S = 9, B = 1;
  Tensor u = Tensor::empty({S * B, c.hidden});
  testing::fill_random(u.data<float>(), u.numel(), 5, 2.0f);
  auto decode = [&](DType states) {
    std::vector<float> conv(static_cast<size_t>((m.d.K - 1) * m.d.conv_dim()), 0.0f);
    std::vector<float> ssm(static_cast<size_t>(m.d.NH * m.d.P * m.d.N), 0.0f);
    return mamba_mixer_forward_sequences(m.d, m.weights(states, 2), u, {MambaSequence{0, 1, S, conv.data(), ssm.data()}},
                                         DType::kF32);
  };
  EXPECT_TRUE(bitwise_equal(decode(DType::kBF16), decode(DType::kF32)));
}

// The hybrid model's Mamba layers read HybridConfig::training_ssm_states and chunk_size: the loss
// changes with bf16 states past the first chunk and not within it.
TEST(MambaSsmStates, HybridModelTakesTheSettingFromItsConfig) {
  auto loss = [](DType states, int64_t chunk) {
    ModelConfig c = testing::tiny_hybrid_config();
    c.seq_length = 12;
    c.hybrid.training_ssm_states = states;
    c.hybrid.chunk_size = chunk;
    OpTable ops = reference_ops();
    GPTModel model(c, single_process_partition(c), &ops);
    model.params().initialize(3);
    testing::make_mamba_state_carry(model);
    GPTModel::LossSums sums;
    model.forward(0, testing::masked_batch(c, 2, 9, false), Tensor(), /*training=*/true, &sums);
    model.backward(0, Tensor(), 0.0f);
    return sums.loss_sum;
  };
  const double f32 = loss(DType::kF32, 4);
  EXPECT_EQ(loss(DType::kBF16, 12), f32);
  EXPECT_NE(loss(DType::kBF16, 4), f32);
}

}  // namespace
}  // namespace gale
