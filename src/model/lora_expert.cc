// LoRA adapters of the routed experts: registration beside the expert weights, split backward.
#include "model/lora_expert.h"

#include <cmath>

#include "model/linear.h"
#include "model/param_builders.h"

namespace gale {

namespace {

// The expert weight's placement: expert-parallel (reduced over the expert-DP group), partial over TP.
ParamSpec like_expert(ParamSpec s, const ParamSpec& weight) {
  s.expert_parallel = weight.expert_parallel;
  s.sequence_parallel = weight.sequence_parallel;
  return s;
}

}  // namespace

LoraIds register_expert_lora(ParamBuffer& pb, const LoraConfig& c, const ParamSpec& weight) {
  GALE_CHECK_GT(c.r, 0);
  GALE_CHECK_EQ(weight.global_shape.size(), 2u) << weight.name;
  const int64_t out = weight.global_shape[0], in = weight.global_shape[1];
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));  // kaiming_uniform_(a = sqrt(5)), as lora.cc
  ParamSpec a = like_expert(make_param_spec(lora_a_name(weight.name), {c.r, in}, InitKind::kUniform, bound, true), weight);
  ParamSpec b = like_expert(make_param_spec(lora_b_name(weight.name), {out, c.r}, InitKind::kZeros, 0.0f, true), weight);
  if (weight.expert_parallel) {
    a.global_name = lora_a_name(weight.global_name);
    b.global_name = lora_b_name(weight.global_name);
  }
  if (weight.split_parts > 1) {  // expert TP: split as the weight, the whole factor's gradient partial
    GALE_CHECK(weight.split_dim == 0 || weight.split_dim == 1) << weight.name;
    GALE_CHECK(!weight.sequence_parallel) << weight.name << ": a split expert's gradient is not partial";
    ParamSpec& split = weight.split_dim == 0 ? b : a;  // fc1: B on out; fc2: A on in
    split.split_dim = weight.split_dim;
    split.split_blocks = weight.split_dim == 0 ? weight.split_blocks : 1;
    split.split_parts = weight.split_parts;
    split.split_rank = weight.split_rank;
    (weight.split_dim == 0 ? a : b).sequence_parallel = true;
  }
  LoraIds ids;
  ids.a = pb.add(std::move(a));
  ids.b = pb.add(std::move(b));
  return ids;
}

void lora_backward_input(const Tensor& dy_in, const LoraWeights& l, Tensor& dx) {
  const Tensor dy = to_f32(dy_in);
  const int64_t M = dy.size(0);
  GALE_CHECK(dy.size(1) == l.out && dx.size(0) == M && dx.size(1) == l.in && dx.dtype() == DType::kF32);
  Tensor du = Tensor::empty({M, l.r});  // s·dy·B [M, r]
  l.gemm(false, false, M, l.r, l.out, l.scaling, dy.data<float>(), l.out, l.b, l.r, 0.0f, du.data<float>(), l.r);
  l.gemm(false, false, M, l.in, l.r, 1.0f, du.data<float>(), l.r, l.a, l.in, 1.0f, dx.data<float>(), l.in);
}

void lora_backward_weights(const Tensor& dy_in, const Tensor& x_in, const LoraWeights& l) {
  const Tensor dy = to_f32(dy_in), x = to_f32(x_in);
  const int64_t M = dy.size(0);
  GALE_CHECK(dy.size(1) == l.out && x.size(0) == M && x.size(1) == l.in);
  Tensor u = Tensor::empty({M, l.r});  // x·Aᵀ, as forward computed it
  l.gemm(false, true, M, l.r, l.in, 1.0f, x.data<float>(), l.in, l.a, l.in, 0.0f, u.data<float>(), l.r);
  l.gemm(true, false, l.out, l.r, M, l.scaling, dy.data<float>(), l.out, u.data<float>(), l.r, 1.0f, l.grad_b, l.r);
  Tensor du = Tensor::empty({M, l.r});
  l.gemm(false, false, M, l.r, l.out, l.scaling, dy.data<float>(), l.out, l.b, l.r, 0.0f, du.data<float>(), l.r);
  l.gemm(true, false, l.r, l.in, M, 1.0f, du.data<float>(), l.r, x.data<float>(), l.in, 1.0f, l.grad_a, l.in);
}

}  // namespace gale
