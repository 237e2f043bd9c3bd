// AdamW's step 8 from a loaded Megatron optimizer state, checked on every element of what a `gale pretrain` run saved
// (the checks of the Megatron resume tests: convert_megatron_cli_test.cc, megatron_moe_cli_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ckpt/checkpoint_reader.h"
#include "train/megatron_checkpoint.h"

namespace gale {
namespace megatron_adamw {

// AdamW's step 8 on every element of one tensor: with the gradient g the saved first moment m8 implies,
// the second moment v8 and the weights p8 (constants as below; Megatron's rule: no decay on 1-D tensors).
// Adds the elements checked to `checked`.
inline void expect_adamw_elements(const Tensor& p7t, const float* m7, const float* v7, const float* m8, const float* v8,
                                  const float* p8, const std::string& where, int64_t& checked) {
  constexpr double b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, lr = 7.5e-4;
  const double bc1 = 1 - std::pow(b1, 8), bc2 = 1 - std::pow(b2, 8);
  const float* p7 = p7t.data<float>();
  const double decay = p7t.ndim() > 1 ? wd : 0.0;
  for (int64_t i = 0; i < p7t.numel(); ++i, ++checked) {
    const double g = (m8[i] - b1 * m7[i]) / (1 - b1);
    ASSERT_NEAR(v8[i], b2 * v7[i] + (1 - b2) * g * g, 1e-5 * (std::abs(v8[i]) + b2 * v7[i]) + 1e-12)
        << where << " [" << i << "]";
    const double update = m8[i] / bc1 / (std::sqrt(v8[i] / bc2) + eps);
    ASSERT_NEAR(p8[i], p7[i] - lr * (update + decay * p7[i]), 3e-7 * std::abs(p7[i]) + 1e-5 * lr * std::abs(update) + 1e-9)
        << where << " [" << i << "]";
  }
}

inline void expect_adamw_step(const MegatronCheckpoint& from, const std::string& saved, const std::string& what,
                              int64_t at_least = 6000) {
  auto r = CheckpointReader::open(saved);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_TRUE(from.optimizer.has_value());
  int64_t checked = 0;
  for (const auto& [name, m7t] : from.optimizer->tensors.at("exp_avg")) {
    const Tensor& v7t = from.optimizer->tensors.at("exp_avg_sq").at(name);
    const Tensor& p7t = from.tensors.at(name);
    auto p8t = r->read(name, p7t.shape());
    auto m8t = r->read("optimizer.exp_avg." + name, p7t.shape());
    auto v8t = r->read("optimizer.exp_avg_sq." + name, p7t.shape());
    ASSERT_TRUE(p8t.ok() && m8t.ok() && v8t.ok()) << name;
    const float *m7 = m7t.data<float>(), *v7 = v7t.data<float>();
    const float *m8 = m8t->data<float>(), *v8 = v8t->data<float>(), *p8 = p8t->data<float>();
    expect_adamw_elements(p7t, m7, v7, m8, v8, p8, what + " " + name, checked);
  }
  EXPECT_GT(checked, at_least) << what;
}

}  // namespace megatron_adamw
}  // namespace gale
