// Context parallelism of the Mamba mixer (model/mamba_context_parallel.h): CP 2, 4 and 8 ranks (threads),
// each on its load-balanced chunks of the sequences, reproduce the one-rank mixer's output, input
// gradient and, summed over the ranks, every parameter gradient; with whole groups on each rank and
// with a group's heads spread over several ranks (its B and C repeated); and with the inter-chunk
// states stored in bf16 (--mamba-training-ssm-states-dtype, chunks of 4 positions).
#include "model/mamba_context_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/thread_communicator.h"
#include "kernels/cpu/gemm.h"
#include "mamba_test_mixer.h"
#include "testing.h"

namespace gale {
namespace {

// H 16: d_inner 32, 8 heads of 4 channels in G groups, d_state 3, d_conv 4.
ModelConfig mixer_config(int64_t G) { return testing::mamba_mixer_config(1, 16, 4, G, 3, 4); }

// One rank's copy of the mixer's parameters, the same on every rank.
struct Mixer : testing::MambaTestMixer {
  explicit Mixer(const ModelConfig& config) : MambaTestMixer(config) {
    // Δ ≈ 1 and A ≈ −0.5 (exp(Δ·A) ≈ 0.6): the state carries across the ranks' chunks, so a
    // position out of order changes the output; distinct D and norm weights per channel.
    std::vector<float> a(static_cast<size_t>(d.NH)), dt(static_cast<size_t>(d.NH)), dd(static_cast<size_t>(d.NH)),
        gn(static_cast<size_t>(d.DI));
    testing::fill_random(a.data(), d.NH, 77, 0.3f);
    testing::fill_random(dt.data(), d.NH, 78, 0.3f);
    testing::fill_random(dd.data(), d.NH, 79, 0.5f);
    testing::fill_random(gn.data(), d.DI, 80, 0.5f);
    for (float& v : a) v -= 0.7f;
    for (float& v : dt) v += 0.5f;
    for (float& v : dd) v += 1.0f;
    for (float& v : gn) v += 1.0f;
    pb.set_param_values(w.a_log, a.data());
    pb.set_param_values(w.dt_bias, dt.data());
    pb.set_param_values(w.d, dd.data());
    pb.set_param_values(w.gnorm_w, gn.data());
  }
  MambaMixerWeights weights() const { return mamba_mixer_weights(pb, w, sgemm, gemm_bf16); }
};

// The rows [S_local·B, W] of x [S·B, W] (rows s·B + b) at the positions `split` gives its rank.
Tensor rows_of(const Tensor& x, const ContextSplit& split, int64_t B) {
  const int64_t W = x.size(1), Sl = split.local_length();
  Tensor out = Tensor::empty({Sl * B, W});
  for (int64_t s = 0; s < Sl; ++s)
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(x.data<float>() + (split.global_position(s) * B + b) * W, W, out.data<float>() + (s * B + b) * W);
  return out;
}

void expect_near_all(const float* got, const float* want, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 2e-5 + 1e-4 * std::fabs(want[i])) << what << " [" << i << "]";
}

// `states`: the dtype of the inter-chunk states (chunks of 4 positions), on every rank as on one.
void expect_cp_matches_one_rank(int64_t groups, int cp, DType states = DType::kF32) {
  const ModelConfig c = mixer_config(groups);
  const int64_t S = 16, B = 2, H = c.hidden;
  Tensor u = Tensor::empty({S * B, H}), r = Tensor::empty({S * B, H});
  testing::fill_random(u.data<float>(), u.numel(), 5);
  testing::fill_random(r.data<float>(), r.numel(), 6);
  auto with_states = [&](MambaMixerWeights w) {
    w.ssm_states = states;
    w.chunk = 4;
    return w;
  };
  Mixer one(c);
  MambaMixerSaved saved;
  const Tensor out = mamba_mixer_forward(one.d, with_states(one.weights()), u, S, B, DType::kF32, &saved);
  const Tensor du = mamba_mixer_backward(one.d, with_states(one.weights()), saved, r, S, B);

  std::vector<std::unique_ptr<Mixer>> ranks;
  for (int i = 0; i < cp; ++i) ranks.push_back(std::make_unique<Mixer>(c));
  std::vector<Tensor> outs(static_cast<size_t>(cp)), dus(static_cast<size_t>(cp));
  testing_util::run_ranks(cp, [&](Communicator& comm) {
    const int rank = comm.rank();
    const ContextSplit split = make_context_split(S, cp, rank).value();
    Mixer& m = *ranks[static_cast<size_t>(rank)];
    MambaMixerWeights w = with_states(m.weights());
    w.cp = MambaCpComm{&comm, &split};
    MambaMixerSaved sv;
    outs[static_cast<size_t>(rank)] =
        mamba_mixer_forward(m.d, w, rows_of(u, split, B), split.local_length(), B, DType::kF32, &sv);
    dus[static_cast<size_t>(rank)] = mamba_mixer_backward(m.d, w, sv, rows_of(r, split, B), split.local_length(), B);
  });
  for (int rank = 0; rank < cp; ++rank) {
    const ContextSplit split = make_context_split(S, cp, rank).value();
    const std::string at = " at cp rank " + std::to_string(rank);
    const Tensor want_out = rows_of(out, split, B), want_du = rows_of(du, split, B);
    expect_near_all(outs[static_cast<size_t>(rank)].data<float>(), want_out.data<float>(), want_out.numel(), "out" + at);
    expect_near_all(dus[static_cast<size_t>(rank)].data<float>(), want_du.data<float>(), want_du.numel(), "d u" + at);
  }
  for (int id : one.w.all()) {  // each rank's gradient covers its positions and its slice: their sum is the whole
    const int64_t n = one.pb.spec(id).local_numel();
    std::vector<float> sum(static_cast<size_t>(n), 0.0f);
    for (const auto& m : ranks)
      for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += m->pb.grad_data(id)[i];
    expect_near_all(sum.data(), one.pb.grad_data(id), n, one.pb.spec(id).name);
  }
}

TEST(MambaContextParallel, WholeGroupsPerRankMatchOneRank) {
  expect_cp_matches_one_rank(/*groups=*/4, /*cp=*/2);  // two groups per rank
  expect_cp_matches_one_rank(/*groups=*/8, /*cp=*/4);
}

TEST(MambaContextParallel, GroupsSharedByRanksMatchOneRank) {
  expect_cp_matches_one_rank(/*groups=*/1, /*cp=*/2);  // each rank half of the group's heads
  expect_cp_matches_one_rank(/*groups=*/2, /*cp=*/4);
  expect_cp_matches_one_rank(/*groups=*/2, /*cp=*/8);  // one head per rank, each group on 4 ranks
}

// --mamba-training-ssm-states-dtype bf16: each rank scans whole sequences of its heads, so it stores
// the same states at the same chunk boundaries as the one-rank scan.
TEST(MambaContextParallel, Bf16InterChunkStatesMatchOneRank) {
  expect_cp_matches_one_rank(/*groups=*/4, /*cp=*/2, DType::kBF16);
  expect_cp_matches_one_rank(/*groups=*/1, /*cp=*/2, DType::kBF16);
}

TEST(MambaContextParallel, LocalDims) {
  const MambaDims d = MambaDims::of(mixer_config(2));
  const MambaDims c = mamba_cp_local(d, 4);
  EXPECT_EQ(c.DI, 8);
  EXPECT_EQ(c.NH, 2);
  EXPECT_EQ(c.G, 1);
  EXPECT_EQ(mamba_cp_group_repeat(d, 4), 2);
  EXPECT_EQ(mamba_cp_group_repeat(d, 2), 1);
  EXPECT_EQ(mamba_cp_local(d, 2).G, 1);
  EXPECT_EQ(mamba_cp_local(MambaDims::of(mixer_config(8)), 2).G, 4);
}

}  // namespace
}  // namespace gale
