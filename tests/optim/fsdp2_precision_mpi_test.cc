// FSDP2 mixed precision (PyTorch's MixedPrecisionPolicy: param_dtype / reduce_dtype bf16, and
// Megatron's --bf16 with --use-torch-fsdp2; optim/zero3_sync.h, model/params.h gathers_bf16) under
// mpirun: the bf16 all-gather of a tiny buffer (bit-exact values, the allocator's exact bytes, the
// prefetched path), the bf16 reduce-scatter checked in float64, whole training runs against the
// single-process --bf16 run, the gathered bytes per unit, and checkpoints resumed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/allocator.h"
#include "core/dtype.h"
#include "mpi_test_env.h"
#include "optim/zero3_sync.h"
#include "parallel/checkpoint_checks.h"
#include "train/checkpointing.h"
#include "zero3_testing.h"

namespace gale {
namespace {

// A tiny buffer: unit 0 an embedding-like matrix (no GEMM weight: gathered in f32), unit 1 a layer
// with two GEMM weights around a norm weight, sizes that leave the ranks' payloads unequal.
struct Tiny {
  ParamBuffer pb;
  std::vector<float> initial;  // the whole f32 values before sharding
  std::vector<std::vector<int>> units = {{0}, {1, 2, 3}};
  explicit Tiny(bool bf16) {
    auto add = [&](const std::string& name, Shape shape, bool gemm) {
      ParamSpec s;
      s.name = name;
      s.global_shape = std::move(shape);
      s.init_std = 0.7f;
      s.gemm_weight = gemm;
      pb.add(s);
    };
    add("embedding.word_embeddings.weight", {9, 5}, false);
    add("decoder.layers.0.mlp.linear_fc1.weight", {12, 10}, true);
    add("decoder.layers.0.pre_mlp_layernorm.weight", {10}, false);
    add("decoder.layers.0.mlp.linear_fc2.weight", {10, 7}, true);
    pb.finalize();
    pb.initialize(1234);
    if (bf16) pb.enable_gemm_copy(DType::kBF16);
    const float* p = pb.flat_params().data<float>();
    initial.assign(p, p + pb.numel());
  }
  const float* initial_of(int id) const { return initial.data() + pb.spec(id).offset; }
};

uint16_t bits(bf16 b) {
  uint16_t u;
  std::memcpy(&u, &b, 2);
  return u;
}

// Unit 1 gathered in bf16: each GEMM weight's values are the f32 masters rounded to bf16 (nearest
// even) bit for bit, the norm weight is its exact f32 value; the unit holds 2 bytes per GEMM
// element and 4 per other element (the allocator's count, exactly), half the f32 gather's values
// for the GEMM weights; a prefetched (asynchronous) gather unpacks the same bits; gather_all
// gathers the f32 masters (checkpoints).
TEST(Fsdp2Precision, Bf16AllGatherValuesAndBytes) {
  Comm world = test::world();
  for (int prefetch : {0, 1}) {
    const std::string what = prefetch ? "prefetched" : "blocking";
    Tiny t(true), f(false);
    Zero3Options zo;
    zo.forward_prefetch = prefetch;
    Zero3Sync z(&t.pb, world, t.units, -1, zo);
    Zero3Sync zf(&f.pb, world, f.units, -1, zo);
    ASSERT_TRUE(t.pb.gathers_bf16() && !f.pb.gathers_bf16());
    EXPECT_EQ(t.pb.gemm_copy_dtype(), DType::kBF16);
    const int64_t gemm = 120 + 70, other = 10, padded = t.pb.unit(1).padded;

    z.on_params_needed({0});  // unit 0: f32 (no GEMM weight); with prefetch, unit 1's bf16 all-gather starts
    zf.on_params_needed({0});
    EXPECT_FALSE(t.pb.unit_values_bf16(0).defined()) << what;
    EXPECT_EQ(std::memcmp(t.pb.param_data(0), t.initial_of(0), 45 * sizeof(float)), 0) << what;
    const int64_t before = host_allocator().current_bytes();
    z.on_params_needed({1});
    const int64_t bf16_bytes = host_allocator().current_bytes() - before;
    EXPECT_EQ(z.prefetched(), prefetch) << what;
    // Unit 0 released (reshard after forward); unit 1: bf16 GEMM weights, f32 norm, f32 gradients.
    const int64_t unit0 = 2 * 4 * t.pb.unit(0).padded;
    EXPECT_EQ(t.pb.gathered_bytes(), 2 * gemm + 4 * other + 4 * padded) << what;
    if (!prefetch) {
      EXPECT_EQ(bf16_bytes, 2 * gemm + 4 * other + 4 * padded - unit0) << what << ": the allocator";
    }
    const int64_t before_f32 = host_allocator().current_bytes();
    zf.on_params_needed({1});
    const int64_t f32_bytes = host_allocator().current_bytes() - before_f32;
    EXPECT_EQ(f.pb.gathered_bytes(), 4 * padded + 4 * padded) << what;
    if (!prefetch) {
      EXPECT_EQ(f32_bytes, 8 * padded - unit0) << what;
      EXPECT_EQ(f32_bytes - bf16_bytes, 2 * gemm) << what << ": the GEMM weights' values take half the bytes";
    }
    for (int id : {1, 3}) {
      EXPECT_FALSE(t.pb.f32_readable(id)) << what;
      const bf16* b = t.pb.param_bf16_data(id);
      for (int64_t i = 0; i < t.pb.spec(id).local_numel(); ++i)
        ASSERT_EQ(bits(b[i]), bits(float_to_bf16(t.initial_of(id)[i]))) << what << ", " << t.pb.spec(id).name << " " << i;
    }
    EXPECT_TRUE(t.pb.f32_readable(2));
    EXPECT_EQ(std::memcmp(t.pb.param_data(2), t.initial_of(2), 10 * sizeof(float)), 0) << what;

    z.release_all(false);
    z.gather_all();  // checkpoints: every unit in f32
    for (int id = 0; id < 4; ++id) {
      EXPECT_TRUE(t.pb.f32_readable(id)) << what;
      EXPECT_EQ(std::memcmp(t.pb.param_data(id), t.initial_of(id), t.pb.spec(id).local_numel() * sizeof(float)), 0)
          << what << ", " << t.pb.spec(id).name;
    }
    z.release_all(true);
  }
}

// A rank's gradient of element i (of a unit's padded range): magnitudes within a factor 2 across
// ranks (so that the bf16 addends sum exactly in f32), signs that differ by rank.
float rank_grad(int64_t rank, int64_t i) {
  const double mag = (1.0 + static_cast<double>((i * 37 + rank * 11) % 97) / 97.0) * std::ldexp(1.0, static_cast<int>(i % 7) - 3);
  return static_cast<float>(((i + rank) % 3 == 0 ? -1.0 : 1.0) * mag / 3.0);
}

// reduce_dtype bf16 against fp32, in float64: with d_r the scaled f32 addends (g_r/dp) and a_r their
// bf16 roundings, the bf16 reduce-scatter gives exactly bf16(Σ a_r) and differs from the f32 one by
// at most the bf16 rounding: |S_bf16 − S_f32| ≤ (2u + u² + dp·2⁻²⁴)·Σ|d_r|, u = 2⁻⁸; and it does differ.
TEST(Fsdp2Precision, Bf16ReduceScatterWithinBf16Rounding) {
  Comm world = test::world();
  const int64_t dp = world->size();
  Tiny tb(true), tf(true);
  Zero3Options bf16_reduce;
  bf16_reduce.reduce_bf16 = true;
  Zero3Sync zb(&tb.pb, world, tb.units, -1, bf16_reduce);
  Zero3Sync zf(&tf.pb, world, tf.units, -1, Zero3Options{});
  int64_t differing = 0, checked = 0, wrong_sum = 0, beyond_bound = 0;
  for (int repeat = 0; repeat < 2; ++repeat) {  // the second micro-batch accumulates (in f32) onto the first
    for (auto [z, t] : {std::pair{&zb, &tb}, std::pair{&zf, &tf}}) {
      z->on_params_needed({1});
      float* g = t->pb.unit_grads(1).data<float>();
      const ParamUnit& x = t->pb.unit(1);
      for (int64_t i = 0; i < x.end - x.begin; ++i) g[i] = rank_grad(world->rank(), i + 1000 * repeat);
      z->on_grads_ready({1, 2, 3});
      z->release_all(false);
    }
  }
  const ParamUnit& x = tb.pb.unit(1);
  const double u = std::ldexp(1.0, -8);  // bf16: 8 significant bits
  for (int64_t i = x.own_begin; i < x.own_end; ++i) {
    const int64_t e = i - x.begin;
    double expect_bf16 = 0.0, bound = 0.0;
    for (int repeat = 0; repeat < 2; ++repeat) {
      double sum_a = 0.0, sum_abs = 0.0;
      for (int64_t r = 0; r < dp; ++r) {
        const float d = rank_grad(r, e + 1000 * repeat) * (1.0f / static_cast<float>(dp));
        sum_a += bf16_to_float(float_to_bf16(d));
        sum_abs += std::fabs(static_cast<double>(d));
      }
      expect_bf16 = static_cast<float>(expect_bf16 + bf16_to_float(float_to_bf16(static_cast<float>(sum_a))));
      bound += (2 * u + u * u + static_cast<double>(dp) * std::ldexp(1.0, -24)) * sum_abs;
    }
    const double sb = tb.pb.shard_grads(1)[i - x.own_begin], sf = tf.pb.shard_grads(1)[i - x.own_begin];
    // EXPECT, not ASSERT: every rank must reach the collectives below.
    if (sb != expect_bf16 && wrong_sum++ == 0)
      ADD_FAILURE() << "element " << e << ": " << sb << ", expected bf16(Σ bf16(g_r/dp)) accumulated in f32 = " << expect_bf16;
    if (std::fabs(sb - sf) > bound + 2 * std::ldexp(std::fabs(sf), -24) && beyond_bound++ == 0)
      ADD_FAILURE() << "element " << e << ": |" << sb << " − " << sf << "| exceeds the bf16 rounding bound " << bound;
    differing += sb != sf ? 1 : 0;
    ++checked;
  }
  EXPECT_EQ(wrong_sum, 0);
  EXPECT_EQ(beyond_bound, 0);
  EXPECT_GT(world->all_reduce_scalar(differing), world->all_reduce_scalar(checked) / 4)
      << "the bf16 reduction should round most sums";
}

using Fsdp2Run = testing::Zero3Run;

// Training: DP FSDP2 with param_dtype bf16 (reduce_dtype fp32) against the single-process --bf16
// run: the same bf16 GEMM weights and f32 arithmetic elsewhere, so the first loss agrees to 1e-9
// (only the micro-batch losses' sum order differs). The gradients are summed in another order too
// (over ranks, and the clipping norm over shards): from the fourth iteration on an f32 master now
// and then differs by an ulp, and where that crosses a bf16 rounding boundary its bf16 copy moves
// by 2⁻⁸ relative — measured at DP 2: losses within 3e-6, gradient norms 3e-4, the parameters
// 2.2e-4 (relative) after 5 iterations; tolerances 2e-5, 1e-3 and 1e-3. reduce_dtype bf16
// (--bf16's default, Megatron's) trains within 2e-4 of it and is not bitwise the same; so does HSDP
// (sharding_size 2 at DP 4), whose replicas all-reduce the bf16-reduced shards in bf16 too.
TEST(Fsdp2Precision, Bf16TrainsAsSingleProcessBf16) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const Comm self = make_self_communicator();
  Fsdp2Run single(self, testing::kTinyLlama, {"--bf16"});
  Fsdp2Run f32_reduce(world, testing::kTinyLlama, testing::fsdp2_flags("param_dtype: bf16\nreduce_dtype: fp32\n", {"--bf16"}));
  Fsdp2Run bf16_reduce(world, testing::kTinyLlama, testing::fsdp2_flags("", {"--bf16"}));
  ASSERT_TRUE(f32_reduce.model().params().gathers_bf16());
  ASSERT_TRUE(bf16_reduce.model().params().gathers_bf16());
  EXPECT_FALSE(f32_reduce.engine->zero3[0]->gathered_units());
  single.train(5);
  f32_reduce.train(5);
  bf16_reduce.train(5);
  bool all_equal = true;
  EXPECT_NEAR(f32_reduce.losses[0], single.losses[0], 1e-9 * single.losses[0]) << "the first loss";
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(f32_reduce.losses[i], single.losses[i], 2e-5 * single.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(f32_reduce.grad_norms[i], single.grad_norms[i], 1e-3 * single.grad_norms[i])
        << "grad norm of iteration " << i + 1;
    EXPECT_NEAR(bf16_reduce.losses[i], single.losses[i], 2e-4 * single.losses[i]) << "reduce bf16, iteration " << i + 1;
    all_equal = all_equal && bf16_reduce.grad_norms[i] == f32_reduce.grad_norms[i];
  }
  EXPECT_FALSE(all_equal) << "reduce_dtype bf16 should round the reduced gradients";
  if (world->size() >= 4) {  // HSDP (2 replicas): the bf16 reduce-scatter, then the bf16 all-reduce over the replicas
    Fsdp2Run hsdp(world, testing::kTinyLlama, testing::fsdp2_flags("sharding_size: 2\n", {"--bf16"}));
    hsdp.train(5);
    EXPECT_EQ(hsdp.engine->zero3[0]->shard_group_size(), 2);
    EXPECT_NEAR(hsdp.losses[0], single.losses[0], 1e-9 * single.losses[0]) << "HSDP, the first loss";
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR(hsdp.losses[i], single.losses[i], 2e-4 * single.losses[i]) << "HSDP reduce bf16, iteration " << i + 1;
  }
  EXPECT_LT(testing::shard_vs_replicated(f32_reduce.model().params(), single.model().params()), 1e-3);
  if (world->rank() == 0)
    for (int i = 0; i < 5; ++i)
      std::printf("iteration %d: single --bf16 %.9f, FSDP2 reduce fp32 %.9f, reduce bf16 %.9f\n", i + 1,
                  single.losses[i], f32_reduce.losses[i], bf16_reduce.losses[i]);
}

// Bytes (the allocator's counters, above what the process held before the run) with every unit
// wrapped (no root): the persistent bytes are the fp32 run's (the model's whole bf16 GEMM copy is
// freed when the storage is sharded), and the largest gathered unit is a transformer layer whose
// GEMM weights take 2 bytes per element instead of 4.
TEST(Fsdp2Precision, GatheredBf16UnitsTakeHalfTheBytes) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  struct Bytes {
    int64_t persistent = 0, gathered_peak = 0, expected_peak = 0, gemm_numel = 0;
  };
  auto measure = [&](const std::vector<std::string>& extra) {
    const int64_t base = host_allocator().current_bytes();
    Bytes b;
    Fsdp2Run run(world, testing::kTinyLlama,
                 testing::join({{"--num-layers", "4", "--hidden-size", "128"},
                                testing::fsdp2_flags("sub_modules_to_wrap:\n  - embedding\n  - layers\n  - head\n", extra)}));
    run.train(2);
    b.persistent = host_allocator().current_bytes() - base;
    run.engine->zero3[0]->reset_peak();
    run.train(1);
    b.gathered_peak = run.engine->zero3[0]->max_gathered_bytes();
    const ParamBuffer& pb = run.model().params();
    for (int u = 0; u < pb.num_units(); ++u) {  // values (bf16 GEMM weights, f32 others) + f32 gradients
      int64_t gemm = 0;
      for (int id = 0; id < pb.size(); ++id)
        if (pb.unit_of(id) == u && pb.spec(id).gemm_weight) gemm += pb.spec(id).local_numel();
      const ParamUnit& x = pb.unit(u);
      const bool half = pb.gathers_bf16() && gemm > 0;
      b.expected_peak = std::max(b.expected_peak, (half ? 2 * gemm + 4 * (x.end - x.begin - gemm) : 4 * x.padded) + 4 * x.padded);
      b.gemm_numel = std::max(b.gemm_numel, gemm);
    }
    return b;
  };
  const Bytes f32 = measure({});
  const Bytes bf16 = measure({"--bf16"});
  EXPECT_EQ(bf16.persistent, f32.persistent);
  EXPECT_EQ(f32.gathered_peak, f32.expected_peak);
  EXPECT_EQ(bf16.gathered_peak, bf16.expected_peak);
  EXPECT_EQ(f32.gathered_peak - bf16.gathered_peak, 2 * bf16.gemm_numel) << "a layer's GEMM weights: 2 bytes less each";
  if (world->rank() == 0)
    std::printf("DP%d, 4 layers, hidden 128: persistent %lld (fp32) %lld (--bf16); gathered peak %lld (fp32) %lld "
                "(--bf16)\n",
                world->size(), static_cast<long long>(f32.persistent), static_cast<long long>(bf16.persistent),
                static_cast<long long>(f32.gathered_peak), static_cast<long long>(bf16.gathered_peak));
}

// An FSDP2 --bf16 checkpoint (the f32 masters, gathered in f32) resumes bit for bit at its own
// layout, and with plain data parallelism --bf16 within the tolerance above.
TEST(Fsdp2Precision, Bf16CheckpointsResume) {
  Comm world = test::world();
  if (world->size() == 1) GTEST_SKIP() << "needs data parallelism";
  const std::vector<std::string> flags = testing::fsdp2_flags("", {"--bf16"});
  const std::string dir = testing::shared_temp_dir(world, "fsdp2mp_ckpt");
  if (world->rank() == 0) std::filesystem::remove_all(dir);
  world->barrier();
  std::vector<double> uninterrupted;
  {
    Fsdp2Run first(world, testing::kTinyLlama, testing::join({flags, {"--save", dir, "--save-interval", "3"}}));
    first.train(3);
    ASSERT_TRUE(save_checkpoint(first.args, *first.engine, first.trainer->state()).ok());
    uninterrupted = first.train(3);
  }
  world->barrier();
  for (const std::vector<std::string>& resumed : {flags, std::vector<std::string>{"--bf16"}}) {
    Fsdp2Run r(world, testing::kTinyLlama, testing::join({resumed, {"--load", dir}}));
    bool loaded = false;
    ASSERT_TRUE(load_checkpoint(r.args, *r.engine, r.trainer->state(), &loaded).ok());
    ASSERT_TRUE(loaded);
    const std::vector<double> losses = r.train(3);
    for (int i = 0; i < 3; ++i) {
      if (resumed.size() > 1)
        EXPECT_EQ(losses[i], uninterrupted[i]) << "resumed with FSDP2 --bf16, iteration " << 4 + i;
      else
        EXPECT_NEAR(losses[i], uninterrupted[i], 2e-4 * uninterrupted[i]) << "resumed with plain DP --bf16, iteration " << 4 + i;
    }
  }
  world->barrier();
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace gale
