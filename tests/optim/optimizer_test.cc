// The optimizer over owned ranges (the distributed optimizer's shards): ranges that cut through
// parameters update exactly like the whole-buffer optimizer, with each parameter's weight decay;
// state exists only for owned elements (exact allocator bytes); norms count owned elements once.
#include "optim/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/allocator.h"
#include "kernels/op_table.h"
#include "testing.h"

namespace gale {
namespace {

// weight [4, 5] (decayed), bias [5] (not decayed), norm [3] (not decayed): 28 elements.
ParamBuffer make_buffer() {
  ParamBuffer pb;
  ParamSpec w;
  w.name = "weight";
  w.global_shape = {4, 5};
  pb.add(w);
  ParamSpec b;
  b.name = "bias";
  b.global_shape = {5};
  b.weight_decay = false;
  pb.add(b);
  ParamSpec n;
  n.name = "norm";
  n.global_shape = {3};
  n.weight_decay = false;
  pb.add(n);
  pb.finalize();
  testing::fill_random(pb.flat_params().data<float>(), pb.numel(), 11);
  return pb;
}

void set_grads(ParamBuffer& pb, int step) {
  testing::fill_random(pb.flat_grads().data<float>(), pb.numel(), 100 + static_cast<uint64_t>(step));
}

OptimizerConfig config(const std::string& type) {
  OptimizerConfig c;
  c.type = type;
  c.clip_grad = 0.0;
  return c;
}

class ShardedOptimizer : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedOptimizer, ShardsThatCutParametersUpdateLikeTheWholeBuffer) {
  const OpTable ops = reference_ops();
  ParamBuffer full = make_buffer(), left = make_buffer(), right = make_buffer();
  // Two "ranks": left owns [3, 9) and [18, 23) (cutting the weight, spanning weight -> bias), right
  // owns the rest.
  const std::vector<FlatRange> left_ranges = {{3, 9}, {18, 23}};
  const std::vector<FlatRange> right_ranges = {{0, 3}, {9, 18}, {23, 28}};
  Optimizer whole(config(GetParam()), &full, &ops, make_self_communicator("mp"));
  Optimizer a(config(GetParam()), {OptimizedBuffer{&left, {}, left_ranges}}, &ops, make_self_communicator("mp"));
  Optimizer b(config(GetParam()), {OptimizedBuffer{&right, {}, right_ranges}}, &ops, make_self_communicator("mp"));
  for (int step = 0; step < 3; ++step) {
    for (ParamBuffer* pb : {&full, &left, &right}) set_grads(*pb, step);
    const double lr = 1e-2 * (step + 1), wd = 0.1;
    ASSERT_TRUE(whole.step(lr, wd).applied);
    ASSERT_TRUE(a.step(lr, wd).applied);
    ASSERT_TRUE(b.step(lr, wd).applied);
  }
  const float* expect = full.flat_params().data<float>();
  const ParamBuffer initial = make_buffer();
  const float* init = initial.flat_params().data<float>();
  for (const auto& [pb, owned] : {std::pair{&left, left_ranges}, std::pair{&right, right_ranges}}) {
    const float* got = pb->flat_params().data<float>();
    for (int64_t i = 0; i < full.numel(); ++i) {
      bool mine = false;
      for (const FlatRange& r : owned) mine |= r.begin <= i && i < r.end;
      if (mine)
        EXPECT_FLOAT_EQ(got[i], expect[i]) << "element " << i;
      else
        EXPECT_EQ(got[i], init[i]) << "element " << i << " is not owned and must not change";
    }
  }
}

TEST_P(ShardedOptimizer, StateExistsOnlyForOwnedElements) {
  const OpTable ops = reference_ops();
  ParamBuffer pb = make_buffer();
  const int64_t per_element = GetParam() == "adam" ? 2 * 4 : 4;  // two moments, or the momentum
  const int64_t before = host_allocator().current_bytes();
  Optimizer whole(config(GetParam()), &pb, &ops, make_self_communicator("mp"));
  const int64_t whole_bytes = host_allocator().current_bytes() - before;
  EXPECT_EQ(whole_bytes, per_element * pb.numel());
  EXPECT_EQ(whole.state_bytes(), whole_bytes);
  const int64_t before_sharded = host_allocator().current_bytes();
  Optimizer sharded(config(GetParam()), {OptimizedBuffer{&pb, {}, std::vector<FlatRange>{{3, 9}, {18, 23}}}}, &ops,
                    make_self_communicator("mp"));
  const int64_t sharded_bytes = host_allocator().current_bytes() - before_sharded;
  EXPECT_EQ(sharded_bytes, per_element * 11);
  EXPECT_EQ(sharded.state_bytes(), sharded_bytes);
  // Segments: the pieces of parameters in the ranges, state packed in range order.
  const auto& segs = sharded.segments();
  ASSERT_EQ(segs.size(), 3u);
  EXPECT_EQ(segs[0].param_id, 0);
  EXPECT_EQ(segs[0].begin, 3);
  EXPECT_EQ(segs[0].numel, 6);
  EXPECT_EQ(segs[0].state_offset, 0);
  EXPECT_EQ(segs[1].param_id, 0);
  EXPECT_EQ(segs[1].begin, 18);
  EXPECT_EQ(segs[1].numel, 2);
  EXPECT_EQ(segs[1].state_offset, 6);
  EXPECT_EQ(segs[2].param_id, 1);
  EXPECT_EQ(segs[2].begin, 20);
  EXPECT_EQ(segs[2].numel, 3);
  EXPECT_EQ(segs[2].state_offset, 8);
  // Unsharded: one segment per parameter, state at the parameter's offset.
  ASSERT_EQ(whole.segments().size(), 3u);
  for (const auto& s : whole.segments()) EXPECT_EQ(s.state_offset, pb.spec(s.param_id).offset);
}

INSTANTIATE_TEST_SUITE_P(Types, ShardedOptimizer, ::testing::Values("adam", "sgd"));

// --freeze-all-layers (OptimizerConfig::frozen): Megatron's optimizer gets no trainable parameter and is None, so
// Gale's holds no state: not one byte comes from the allocator (AdamW, SGD with momentum, Lion on the matrix with
// AdamW on the rest, AdamW with --compress-optimizer), while the unfrozen one takes its moments' bytes; the
// params norm (Megatron's calc_params_l2_norm reads the model) is the unfrozen optimizer's.
TEST(FrozenOptimizer, AllocatesNoStateAndKeepsTheParamsNorm) {
  const OpTable ops = reference_ops();
  for (const std::string type : {"adam", "sgd", "lion", "adam+compress"}) {
    SCOPED_TRACE(type);
    ParamBuffer pb = make_buffer();
    OptimizerConfig c = config(type == "adam+compress" ? "adam" : type);
    c.compress = type == "adam+compress";
    auto buffers = [&] {
      OptimizedBuffer b{&pb, {}, std::nullopt};
      if (type == "lion") b.muon = {true, false, false};  // Lion on the weight, AdamW on the bias and norm
      return std::vector<OptimizedBuffer>{b};
    };
    const int64_t before = host_allocator().current_bytes();
    Optimizer trained(c, buffers(), &ops, make_self_communicator("mp"));
    const int64_t trained_bytes = host_allocator().current_bytes() - before;
    EXPECT_GT(trained_bytes, 0);
    if (type != "adam+compress") EXPECT_EQ(trained.state_bytes(), trained_bytes);
    c.frozen = true;
    const int64_t before_frozen = host_allocator().current_bytes();
    Optimizer frozen(c, buffers(), &ops, make_self_communicator("mp"));
    EXPECT_EQ(host_allocator().current_bytes() - before_frozen, 0);
    EXPECT_EQ(frozen.state_bytes(), 0);
    EXPECT_EQ(frozen.params_norm(), trained.params_norm());
    EXPECT_GT(frozen.params_norm(), 0.0);
  }
}

TEST(ShardedOptimizerNorm, CountsOwnedElementsOfCountingParameters) {
  const OpTable ops = reference_ops();
  ParamBuffer pb = make_buffer();
  set_grads(pb, 0);
  const float* g = pb.flat_grads().data<float>();
  // The bias (id 1) does not count on this rank (e.g. a TP replica).
  Optimizer opt(config("adam"), {OptimizedBuffer{&pb, {true, false, true}, std::vector<FlatRange>{{3, 9}, {18, 26}}}},
                &ops, make_self_communicator("mp"));
  double sq = 0.0;
  for (int64_t i = 3; i < 9; ++i) sq += g[i] * g[i];
  for (int64_t i = 18; i < 20; ++i) sq += g[i] * g[i];  // weight
  for (int64_t i = 25; i < 26; ++i) sq += g[i] * g[i];  // norm; bias [20, 25) left out
  EXPECT_NEAR(opt.grad_norm(), std::sqrt(sq), 1e-6 * std::sqrt(sq));
}

TEST(ShardedOptimizerNorm, ClippingScalesOnlyOwnedGradients) {
  const OpTable ops = reference_ops();
  ParamBuffer pb = make_buffer();
  set_grads(pb, 0);
  std::vector<float> before(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  OptimizerConfig c = config("sgd");
  c.clip_grad = 1e-3;
  Optimizer opt(c, {OptimizedBuffer{&pb, {}, std::vector<FlatRange>{{3, 9}}}}, &ops, make_self_communicator("mp"));
  StepResult r = opt.step(0.0, 0.0);
  ASSERT_TRUE(r.applied);
  const float coeff = static_cast<float>(1e-3 / (r.grad_norm + 1e-6));
  const float* g = pb.flat_grads().data<float>();
  for (int64_t i = 0; i < pb.numel(); ++i)
    EXPECT_FLOAT_EQ(g[i], (i >= 3 && i < 9) ? before[i] * coeff : before[i]) << "element " << i;
}

// --decoupled-lr: the marked parameters step with the decoupled rate, the others with lr, each as an
// optimizer given only that rate would.
// The after-buffer hook (--overlap-param-gather-with-optimizer-step) runs once per buffer, in
// order, when that buffer is updated and the next one is not yet.
TEST_P(ShardedOptimizer, AfterBufferHookSeesThatBufferUpdatedAndTheNextNot) {
  const OpTable ops = reference_ops();
  ParamBuffer first = make_buffer(), second = make_buffer();
  Optimizer opt(config(GetParam()), {OptimizedBuffer{&first, {}, std::nullopt}, OptimizedBuffer{&second, {}, std::nullopt}},
                &ops, make_self_communicator("mp"));
  set_grads(first, 0);
  set_grads(second, 0);
  const float first_before = first.flat_params().data<float>()[0], second_before = second.flat_params().data<float>()[0];
  std::vector<size_t> calls;
  opt.set_after_buffer_step([&](size_t b) {
    calls.push_back(b);
    if (b == 0) {
      EXPECT_NE(first.flat_params().data<float>()[0], first_before);
      EXPECT_EQ(second.flat_params().data<float>()[0], second_before);
    }
  });
  ASSERT_TRUE(opt.step(1e-2, 0.1).applied);
  EXPECT_EQ(calls, (std::vector<size_t>{0, 1}));
  EXPECT_NE(second.flat_params().data<float>()[0], second_before);
}

TEST_P(ShardedOptimizer, DecoupledParametersUseTheirOwnRate) {
  const OpTable ops = reference_ops();
  ParamBuffer mixed = make_buffer(), plain = make_buffer(), fast = make_buffer();
  OptimizedBuffer marked{&mixed, {}, std::nullopt};
  marked.decoupled_lr = {false, true, false};  // the bias
  Optimizer a(config(GetParam()), {marked}, &ops, make_self_communicator("mp"));
  Optimizer b(config(GetParam()), &plain, &ops, make_self_communicator("mp"));
  Optimizer c(config(GetParam()), &fast, &ops, make_self_communicator("mp"));
  for (int step = 0; step < 2; ++step) {
    for (ParamBuffer* pb : {&mixed, &plain, &fast}) set_grads(*pb, step);
    ASSERT_TRUE(a.step(1e-2, 0.1, false, 1.0f, nullptr, 5e-2).applied);
    ASSERT_TRUE(b.step(1e-2, 0.1).applied);
    ASSERT_TRUE(c.step(5e-2, 0.1).applied);
  }
  const ParamBuffer& with_bias_rate = fast;
  for (int id = 0; id < mixed.size(); ++id) {
    const ParamBuffer& expected = id == 1 ? with_bias_rate : plain;
    for (int64_t i = 0; i < mixed.spec(id).local_numel(); ++i)
      EXPECT_EQ(mixed.param_data(id)[i], expected.param_data(id)[i]) << mixed.spec(id).name << " element " << i;
  }
  EXPECT_NE(plain.param_data(1)[0], fast.param_data(1)[0]);  // the rates differ visibly
}

TEST(ShardedOptimizerNorm, AdamFoldsClippingIntoTheUpdate) {
  const OpTable ops = reference_ops();
  ParamBuffer clipped = make_buffer(), prescaled = make_buffer();
  set_grads(clipped, 0);
  OptimizerConfig c = config("adam");
  c.clip_grad = 1e-2;
  const std::vector<FlatRange> owned = {{3, 9}, {18, 26}};
  Optimizer a(c, {OptimizedBuffer{&clipped, {}, owned}}, &ops, make_self_communicator("mp"));
  Optimizer b(config("adam"), {OptimizedBuffer{&prescaled, {}, owned}}, &ops, make_self_communicator("mp"));
  const double norm = a.grad_norm();
  const float coeff = static_cast<float>(1e-2 / (norm + 1e-6));
  set_grads(prescaled, 0);
  float* g = prescaled.flat_grads().data<float>();
  for (int64_t i = 0; i < prescaled.numel(); ++i) g[i] *= coeff;
  ASSERT_TRUE(a.step(1e-2, 0.1).applied);
  ASSERT_TRUE(b.step(1e-2, 0.1).applied);
  for (int64_t i = 0; i < clipped.numel(); ++i)
    EXPECT_EQ(clipped.flat_params().data<float>()[i], prescaled.flat_params().data<float>()[i]) << "element " << i;
}


// --optimizer-selection fused_ema_adamw (OptimizerConfig::ema) ---------------------------------

OptimizerConfig ema_config(double decay) {
  OptimizerConfig c = config("adam");
  c.ema = true;
  c.ema_decay = decay;
  return c;
}

const float* ema_of(const Optimizer& o, size_t b = 0) {
  for (const auto& [name, t] : o.state(b))
    if (name == "ema_params") return t.data<float>();
  return nullptr;
}

TEST(EmaAdamW, DecayWarmsUpAsMindSpeed) {
  EXPECT_EQ(ema_decay_at(0.9999, 1), 2.0f / 11.0f);
  EXPECT_EQ(ema_decay_at(0.9999, 2), 0.25f);
  EXPECT_EQ(ema_decay_at(0.5, 1), 2.0f / 11.0f);
  EXPECT_EQ(ema_decay_at(0.5, 8), 0.5f);  // 9/18: the warm-up reaches the decay
  EXPECT_EQ(ema_decay_at(0.5, 100), 0.5f);
  EXPECT_EQ(ema_decay_at(0.0, 3), 0.0f);
}

// Parameters and moments are plain AdamW's, bit for bit; the EMA is the closed form
//   e_T = (Π_t d_t)·p_0 + Σ_t (1 − d_t)·(Π_{u>t} d_u)·p_t
// over the parameters p_t after each step (p_0 the initial values), computed here in double.
TEST(EmaAdamW, TrainsAsAdamWAndKeepsTheClosedFormEma) {
  const OpTable ops = reference_ops();
  for (double decay : {0.9999, 0.3}) {
    SCOPED_TRACE(::testing::Message() << "decay " << decay);
    ParamBuffer plain = make_buffer(), ema = make_buffer();
    Optimizer adam(config("adam"), &plain, &ops, make_self_communicator("mp"));
    Optimizer with_ema(ema_config(decay), &ema, &ops, make_self_communicator("mp"));
    EXPECT_EQ(with_ema.state_bytes(), 12 * ema.numel());
    const int64_t n = plain.numel();
    std::vector<std::vector<double>> p;  // p[t][i]
    p.emplace_back(plain.flat_params().data<float>(), plain.flat_params().data<float>() + n);
    constexpr int kSteps = 12;
    for (int step = 0; step < kSteps; ++step) {
      set_grads(plain, step);
      set_grads(ema, step);
      ASSERT_TRUE(adam.step(1e-2, 0.1).applied);
      ASSERT_TRUE(with_ema.step(1e-2, 0.1).applied);
      ASSERT_EQ(std::memcmp(plain.flat_params().data<float>(), ema.flat_params().data<float>(), 4 * n), 0)
          << "step " << step + 1;
      p.emplace_back(plain.flat_params().data<float>(), plain.flat_params().data<float>() + n);
    }
    const auto a = adam.state(0), e = with_ema.state(0);
    ASSERT_EQ(e.size(), 3u);
    EXPECT_EQ(e[2].first, "ema_params");
    for (int k = 0; k < 2; ++k)
      EXPECT_EQ(std::memcmp(a[k].second.data<float>(), e[k].second.data<float>(), 4 * n), 0) << a[k].first;
    const float* got = ema_of(with_ema);
    ASSERT_NE(got, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      double want = 0.0, tail = 1.0;  // Π_{u>t} d_u, built from the last step down
      for (int t = kSteps; t >= 1; --t) {
        const double d = std::min(decay, (1.0 + t) / (10.0 + t));
        want += (1.0 - d) * tail * p[static_cast<size_t>(t)][static_cast<size_t>(i)];
        tail *= d;
      }
      want += tail * p[0][static_cast<size_t>(i)];
      EXPECT_NEAR(got[i], want, 1e-6 * (1.0 + std::fabs(want))) << "element " << i;
      EXPECT_NE(got[i], ema.flat_params().data<float>()[i]) << "the EMA lags the parameters";
    }
  }
}

// A hand-computed case: one parameter, lr 0 (the parameter stays p), decay 0.5: the EMA of a
// constant is the constant; then with the EMA set to 0 by hand, step 9 (d = min(0.5, 10/19) = 0.5)
// gives 0.5·0 + 0.5·p.
TEST(EmaAdamW, HandComputedValues) {
  const OpTable ops = reference_ops();
  ParamBuffer pb;
  ParamSpec w;
  w.name = "w";
  w.global_shape = {2};
  pb.add(w);
  pb.finalize();
  pb.flat_params().data<float>()[0] = 3.0f;
  pb.flat_params().data<float>()[1] = -1.5f;
  Optimizer o(ema_config(0.5), &pb, &ops, make_self_communicator("mp"));
  pb.flat_grads().data<float>()[0] = 1.0f;
  pb.flat_grads().data<float>()[1] = 2.0f;
  for (int step = 0; step < 8; ++step) ASSERT_TRUE(o.step(0.0, 0.0).applied);
  const float* e = ema_of(o);
  EXPECT_EQ(e[0], 3.0f);
  EXPECT_EQ(e[1], -1.5f);
  const_cast<float*>(e)[0] = 0.0f;  // state() shares the optimizer's storage
  const_cast<float*>(e)[1] = 0.0f;
  ASSERT_TRUE(o.step(0.0, 0.0).applied);
  EXPECT_EQ(e[0], 1.5f);
  EXPECT_EQ(e[1], -0.75f);
  // A real step: lr 0.1, step 10 (d = 0.5): p ← p − 0.1·(m̂/(√v̂ + eps)), EMA = 0.5·e + 0.5·p_new.
  const float p0 = pb.flat_params().data<float>()[0];
  ASSERT_TRUE(o.step(0.1, 0.0).applied);
  const float p1 = pb.flat_params().data<float>()[0];
  EXPECT_NEAR(p1, p0 - 0.1f, 1e-6f);  // a constant gradient: m̂/√v̂ = 1
  EXPECT_EQ(e[0], 0.5f * 1.5f + 0.5f * p1);
}

TEST(EmaAdamW, SkippedStepsLeaveTheEmaAndItsCount) {
  const OpTable ops = reference_ops();
  ParamBuffer pb = make_buffer();
  Optimizer o(ema_config(0.9), &pb, &ops, make_self_communicator("mp"));
  set_grads(pb, 0);
  ASSERT_TRUE(o.step(1e-2, 0.0).applied);
  const int64_t n = pb.numel();
  const std::vector<float> before(ema_of(o), ema_of(o) + n);
  pb.flat_grads().data<float>()[3] = std::nanf("");
  EXPECT_FALSE(o.step(1e-2, 0.0).applied);
  EXPECT_EQ(o.steps_taken(), 1);
  EXPECT_EQ(std::memcmp(before.data(), ema_of(o), 4 * n), 0);
}

// Owned ranges that cut parameters (the distributed optimizer's shards): each shard's EMA, packed in
// owned-range order, is the whole-buffer optimizer's EMA of those elements, bit for bit.
TEST(EmaAdamW, ShardedEmaIsTheWholeBuffersEma) {
  const OpTable ops = reference_ops();
  ParamBuffer full = make_buffer(), left = make_buffer(), right = make_buffer();
  const std::vector<FlatRange> left_ranges = {{3, 9}, {18, 23}};
  const std::vector<FlatRange> right_ranges = {{0, 3}, {9, 18}, {23, 28}};
  Optimizer whole(ema_config(0.9), &full, &ops, make_self_communicator("mp"));
  Optimizer a(ema_config(0.9), {OptimizedBuffer{&left, {}, left_ranges}}, &ops, make_self_communicator("mp"));
  Optimizer b(ema_config(0.9), {OptimizedBuffer{&right, {}, right_ranges}}, &ops, make_self_communicator("mp"));
  EXPECT_EQ(a.state_bytes(), 12 * 11);
  for (int step = 0; step < 4; ++step) {
    for (ParamBuffer* pb : {&full, &left, &right}) set_grads(*pb, step);
    ASSERT_TRUE(whole.step(1e-2, 0.1).applied);
    ASSERT_TRUE(a.step(1e-2, 0.1).applied);
    ASSERT_TRUE(b.step(1e-2, 0.1).applied);
  }
  const float* want = ema_of(whole);
  for (const Optimizer* o : {&a, &b}) {
    const float* got = ema_of(*o);
    for (const Optimizer::Segment& seg : o->segments())
      for (int64_t i = 0; i < seg.numel; ++i)
        EXPECT_EQ(got[seg.state_offset + i], want[seg.begin + i]) << "element " << seg.begin + i;
  }
}

}  // namespace
}  // namespace gale
