// LoRA model tests' shared checks: random lora_B values, and "the adapted model starts at its base and
// merges into it" for any architecture (dense, Gated DeltaNet, MoE experts).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cpu/gemm.h"
#include "model/gpt_model.h"
#include "model/lora.h"
#include "testing.h"

namespace gale::testing {

// Gives every lora_B random values (they start at zero, which would make every dA zero).
inline void randomise_lora_b(ParamBuffer& pb, uint64_t seed) {
  for (int id = 0; id < pb.size(); ++id)
    if (pb.spec(id).name.find(".lora_B.") != std::string::npos)
      fill_random(pb.param_data(id), pb.spec(id).local_numel(), seed + id, 0.3f);
}

// `lora` (config `lc`) and `base` initialised alike: with B = 0 the adapted logits on `mb` are the
// base's to the bit; after random B, merging every adapter into the base's weights (W += (alpha / r)·B·A,
// lora_merge) gives the adapted logits within `tolerance`, `expected_merged` weights merged, and the
// adapters moved the logits by more than `moved_at_least`.
inline void expect_lora_starts_at_base_and_merges(GPTModel& lora, GPTModel& base, const ModelConfig& lc,
                                                  const MicroBatch& mb, int expected_merged, double tolerance,
                                                  double moved_at_least) {
  Tensor l0 = lora.forward_logits(mb, Tensor()), b0 = base.forward_logits(mb, Tensor());
  ASSERT_EQ(l0.numel(), b0.numel());
  EXPECT_EQ(0, std::memcmp(l0.data<float>(), b0.data<float>(), l0.nbytes())) << "B = 0: the adapted model is the base";
  randomise_lora_b(lora.params(), 3);
  Tensor adapted = lora.forward_logits(mb, Tensor());
  const ParamBuffer& lp = lora.params();
  ParamBuffer& bp = base.params();
  int merged = 0;
  for (int id = 0; id < bp.size(); ++id) {
    const std::string& name = bp.spec(id).name;
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (!weight || lp.find(lora_a_name(name)) < 0) continue;
    LoraIds ids{lp.find(lora_a_name(name)), lp.find(lora_b_name(name))};
    lora_merge(bp.param_data(id), lora_weights(lp, ids, lc.lora.scaling(), sgemm));
    ++merged;
  }
  EXPECT_EQ(merged, expected_merged);
  Tensor merged_logits = base.forward_logits(mb, Tensor());
  double worst = 0.0, moved = 0.0;
  for (int64_t i = 0; i < adapted.numel(); ++i) {
    worst = std::max(worst, double(std::fabs(adapted.data<float>()[i] - merged_logits.data<float>()[i])));
    moved = std::max(moved, double(std::fabs(adapted.data<float>()[i] - b0.data<float>()[i])));
  }
  EXPECT_LT(worst, tolerance);
  EXPECT_GT(moved, moved_at_least);
}

}  // namespace gale::testing
