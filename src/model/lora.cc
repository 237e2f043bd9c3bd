// LoRA adapter registration, forward/backward as f32 GEMMs, and merging into the base weight.
#include "model/lora.h"

#include <cmath>

#include "model/linear.h"
#include "model/param_builders.h"

namespace gale {

namespace {

std::string replace_weight_suffix(const std::string& weight_name, const char* with) {
  const std::string suffix = ".weight";
  GALE_CHECK(weight_name.size() > suffix.size() &&
             weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
      << weight_name << " is not a weight";
  return weight_name.substr(0, weight_name.size() - suffix.size()) + with;
}

}  // namespace

bool lora_targets(const LoraConfig& c, LoraTarget t) {
  if (!c.enabled()) return false;
  switch (t) {
    case LoraTarget::kQkv: return c.qkv;
    case LoraTarget::kProj: return c.proj;
    case LoraTarget::kFc1: return c.fc1;
    case LoraTarget::kFc2: return c.fc2;
    case LoraTarget::kInProj: return c.in_proj;
    case LoraTarget::kOutProj: return c.out_proj;
  }
  return false;
}

std::string lora_a_name(const std::string& weight_name) {
  return replace_weight_suffix(weight_name, ".lora_A.default.weight");
}
std::string lora_b_name(const std::string& weight_name) {
  return replace_weight_suffix(weight_name, ".lora_B.default.weight");
}

LoraIds register_lora_params(ParamBuffer& pb, const LoraConfig& c, const ModelPartition& part,
                             const std::string& weight_name, int64_t out, int64_t in, LoraSplit split, int blocks) {
  GALE_CHECK_GT(c.r, 0);
  // kaiming_uniform_(a = sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain·sqrt(3 / fan_in) = 1 / sqrt(fan_in).
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  ParamSpec a = make_param_spec(lora_a_name(weight_name), {c.r, in}, InitKind::kUniform, bound, true);
  ParamSpec b = make_param_spec(lora_b_name(weight_name), {out, c.r}, InitKind::kZeros, 0.0f, true);
  const bool tp = part.tp_size() > 1;
  if (split == LoraSplit::kColumn) {
    b = tp_split(std::move(b), part, 0, blocks);
    a.sequence_parallel = tp;  // replicated, gradient partial per TP rank: all-reduced over TP
  } else {
    a = tp_split(std::move(a), part, 1);
    b.sequence_parallel = tp;
  }
  LoraIds ids;
  ids.a = pb.add(std::move(a));
  ids.b = pb.add(std::move(b));
  return ids;
}

LoraWeights lora_weights(const ParamBuffer& pb, const LoraIds& ids, float scaling, SgemmFn gemm) {
  const Shape a = pb.spec(ids.a).local_shape(), b = pb.spec(ids.b).local_shape();
  GALE_CHECK_EQ(a[0], b[1]);
  return LoraWeights{pb.param_data(ids.a), pb.param_data(ids.b), pb.grad_data(ids.a), pb.grad_data(ids.b),
                     a[0],                 b[0],                 a[1],               scaling,
                     gemm};
}

Tensor lora_forward(const Tensor& x_in, const LoraWeights& l, Tensor& y) {
  const Tensor x = to_f32(x_in);
  const int64_t M = x.size(0);
  GALE_CHECK_EQ(x.size(1), l.in);
  GALE_CHECK(y.size(0) == M && y.size(1) == l.out && y.dtype() == DType::kF32);
  Tensor u = Tensor::empty({M, l.r});
  l.gemm(false, true, M, l.r, l.in, 1.0f, x.data<float>(), l.in, l.a, l.in, 0.0f, u.data<float>(), l.r);
  l.gemm(false, true, M, l.out, l.r, l.scaling, u.data<float>(), l.r, l.b, l.r, 1.0f, y.data<float>(), l.out);
  return u;
}

void lora_backward(const Tensor& dy, const Tensor& x_in, const Tensor& u, const LoraWeights& l, Tensor& dx) {
  const Tensor x = to_f32(x_in);
  const int64_t M = dy.size(0);
  GALE_CHECK(dy.size(1) == l.out && x.size(0) == M && u.size(0) == M && u.size(1) == l.r);
  GALE_CHECK(dx.size(0) == M && dx.size(1) == l.in && dx.dtype() == DType::kF32);
  // dB += s·dyᵀ·u [out, r]
  l.gemm(true, false, l.out, l.r, M, l.scaling, dy.data<float>(), l.out, u.data<float>(), l.r, 1.0f, l.grad_b, l.r);
  // du = s·dy·B [M, r]
  Tensor du = Tensor::empty({M, l.r});
  l.gemm(false, false, M, l.r, l.out, l.scaling, dy.data<float>(), l.out, l.b, l.r, 0.0f, du.data<float>(), l.r);
  // dA += duᵀ·x [r, in]
  l.gemm(true, false, l.r, l.in, M, 1.0f, du.data<float>(), l.r, x.data<float>(), l.in, 1.0f, l.grad_a, l.in);
  // dx += du·A [M, in]
  l.gemm(false, false, M, l.in, l.r, 1.0f, du.data<float>(), l.r, l.a, l.in, 1.0f, dx.data<float>(), l.in);
}

void lora_merge(float* w, const LoraWeights& l) {
  // W [out, in] += s·B [out, r]·A [r, in]
  l.gemm(false, false, l.out, l.in, l.r, l.scaling, l.b, l.r, l.a, l.in, 1.0f, w, l.in);
}

}  // namespace gale
