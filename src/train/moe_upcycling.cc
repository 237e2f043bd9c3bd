// Megatron's MoE upcycling plan: granularity, slices of the dense MLP per expert, scale, router rows.
#include "train/moe_upcycling.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "core/log.h"

namespace gale {

StatusOr<UpcyclingPlan> make_upcycling_plan(const Arguments& a) {
  const MoeArgs& m = a.moe;
  const ModelArgs& md = a.model;
  if (m.moe_upcycling_granularity < 1)
    return InvalidArgument("--moe-upcycling-granularity: expected a positive integer, found ",
                           m.moe_upcycling_granularity);
  UpcyclingPlan plan;
  plan.expert_ffn = m.moe_ffn_hidden_size;
  plan.dense_ffn = md.ffn_hidden_size * m.moe_upcycling_granularity;
  if (plan.expert_ffn <= 0 || plan.dense_ffn % plan.expert_ffn != 0)
    return InvalidArgument("--moe-use-upcycling: The ffn hidden size of dense model must be divisible by ffn hidden "
                           "size of moe model. (dense: --ffn-hidden-size ", md.ffn_hidden_size,
                           " x --moe-upcycling-granularity ", m.moe_upcycling_granularity, " = ", plan.dense_ffn,
                           ", experts: --moe-ffn-hidden-size ", plan.expert_ffn, ")");
  plan.granularity = plan.dense_ffn / plan.expert_ffn;
  if (m.num_experts % plan.granularity != 0)
    return InvalidArgument("--moe-use-upcycling: The number of experts must be divisible by granularity for upcycling "
                           "(--num-experts ", m.num_experts, ", granularity ", plan.granularity, ")");
  plan.expansion_rate = m.num_experts / plan.granularity;
  // Megatron's activation names: F.gelu (also under --openai-gelu, which Megatron main leaves at
  // F.gelu), F.silu (--swiglu), squared_relu; --quick-geglu's quick_gelu is refused.
  if (md.quick_geglu)
    return InvalidArgument("--moe-use-upcycling: The activation func is not supported by upcycling.Valid options are: "
                           "['gelu', 'silu', 'squared_relu']But got quick_gelu (--quick-geglu)");
  if (md.geglu || md.gelu_tanh)
    return Unimplemented("--moe-use-upcycling with ", md.geglu ? "--geglu" : "--gelu-tanh",
                         ": upcycling a GeGLU MLP is not supported yet (expected a GeLU, SwiGLU or squared-ReLU MLP)");
  plan.glu = md.swiglu;
  if (plan.granularity > 1 && m.moe_upcycling_granularity > 1)
    for (size_t i = 0; i < m.layer_pattern.size(); ++i)
      if (m.layer_pattern[i] == 0)
        return Unimplemented("--moe-upcycling-granularity ", m.moe_upcycling_granularity, " with dense layers in "
                             "--moe-layer-freq (layer ", i, "): not supported (their MLPs have --ffn-hidden-size ",
                             md.ffn_hidden_size, ", the dense checkpoint's ", plan.dense_ffn,
                             "; Megatron's upcycling cannot load them either)");
  const double g = static_cast<double>(plan.granularity);
  plan.activation_scale = m.moe_router_pre_softmax
                              ? static_cast<double>(plan.expansion_rate) * g * g / static_cast<double>(m.moe_router_topk)
                              : g;
  plan.weight_scale = plan.glu || md.squared_relu ? std::cbrt(plan.activation_scale) : std::sqrt(plan.activation_scale);
  return plan;
}

namespace {

constexpr const char* kExperts = ".mlp.experts.local_experts.";

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

bool is_router_weight(const std::string& name) { return ends_with(name, ".mlp.router.weight"); }

std::vector<UpcyclingSource> upcycling_sources(const UpcyclingPlan& plan, const ParamSpec& s,
                                               const std::vector<int64_t>& offsets, int64_t rows) {
  const std::string& name = s.whole_model_name();
  UpcyclingSource src{name, s.global_shape, offsets, 1.0f, 0, rows};
  if (name.find(".mlp.router.") != std::string::npos) {
    src.name.clear();
    return {src};
  }
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return {src};
  const size_t index_at = at + std::strlen(kExperts);
  const size_t rest = name.find('.', index_at);  // after the expert index
  const int64_t expert = std::stoll(name.substr(index_at, rest - index_at));
  const std::string tensor = name.substr(rest + 1);  // linear_fc1.weight, ...
  src.name = name.substr(0, at) + ".mlp." + tensor;
  const int64_t G = plan.granularity, fe = plan.expert_ffn, j = expert % G;
  const float scale = static_cast<float>(plan.weight_scale);
  if (tensor == "linear_fc1.weight" || tensor == "linear_fc1.bias") {
    // Rows [gate (Fe); up (Fe)] with a GLU: each half takes slice j of the dense half (dense rows
    // [gate (G·Fe); up (G·Fe)]); without one, rows [0, Fe) take dense rows j·Fe onwards.
    GALE_CHECK_EQ(s.global_shape[0], (plan.glu ? 2 : 1) * fe) << name;
    src.global_shape[0] = s.global_shape[0] * G;
    src.scale = scale;
    std::vector<UpcyclingSource> out;
    for (int64_t r = offsets[0]; r < offsets[0] + rows;) {
      const int64_t half = r / fe, within = r - half * fe;
      const int64_t n = std::min(offsets[0] + rows - r, fe - within);  // up to the end of this half
      UpcyclingSource part = src;
      part.offsets[0] = half * G * fe + j * fe + within;
      part.first_row = r - offsets[0];
      part.rows = n;
      out.push_back(std::move(part));
      r += n;
    }
    return out;
  }
  if (tensor == "linear_fc2.weight") {
    GALE_CHECK_EQ(s.global_shape[1], fe) << name;
    src.global_shape[1] = fe * G;
    src.offsets[1] = j * fe + offsets[1];
    src.scale = scale;
  }  // linear_fc2.bias: the dense bias, unscaled, in every expert
  return {src};
}

void upcycle_router_rows(const UpcyclingPlan& plan, Tensor& router) {
  const int64_t G = plan.granularity;
  if (G == 1) return;
  const int64_t E = router.size(0), H = router.numel() / E;
  float* w = router.data<float>();
  // Descending, so that row floor(e / G) <= e is still the initial one when row e is written.
  for (int64_t e = E - 1; e > 0; --e) std::copy(w + (e / G) * H, w + (e / G + 1) * H, w + e * H);
}

}  // namespace gale
