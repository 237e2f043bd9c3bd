// The Muon and Lion tests' shared case: one step on a [4, 6] matrix of the emerging optimizer and a [6] bias of AdamW.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/optimizer.h"
#include "kernels/op_table.h"
#include "optim/optimizer.h"
#include "testing.h"

namespace gale::testing {

// Fills the empty `pb` with "w" [4, 6] (marked for `type`'s own update: Muon's or Lion's) and "b"
// [6] (no weight decay), random values (seed 3) and gradients (seed 4), and takes one step of
// `type` at lr 1e-3, weight decay 0.1, no clipping. The bias must move exactly as adamw_step_ref.
inline std::unique_ptr<Optimizer> step_matrix_and_bias(const std::string& type, ParamBuffer& pb, const OpTable& ops) {
  ParamSpec w;
  w.name = "w";
  w.global_shape = {4, 6};
  pb.add(w);
  ParamSpec b;
  b.name = "b";
  b.global_shape = {6};
  b.weight_decay = false;
  pb.add(b);
  pb.finalize();
  fill_random(pb.flat_params().data<float>(), pb.numel(), 3);
  fill_random(pb.flat_grads().data<float>(), pb.numel(), 4);
  std::vector<float> bias(pb.param_data(1), pb.param_data(1) + 6), m(6, 0.0f), v(6, 0.0f);
  OptimizerConfig o;
  o.type = type;
  o.clip_grad = 0.0;
  OptimizedBuffer buffer{&pb, {}, std::nullopt};
  buffer.muon = {true, false};
  std::vector<OptimizedBuffer> buffers;
  buffers.push_back(buffer);
  auto opt = std::make_unique<Optimizer>(o, std::move(buffers), &ops, make_self_communicator("mp"));
  EXPECT_TRUE(opt->step(1e-3, 0.1).applied);
  AdamWHyper h;
  h.lr = 1e-3f;
  adamw_step_ref(bias.data(), pb.grad_data(1), m.data(), v.data(), 6, h);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(pb.param_data(1)[i], bias[static_cast<size_t>(i)]);
  return opt;
}

}  // namespace gale::testing
