// --fp8-format: which linear weights run in FP8, their delayed-scaling state, and operand quantisation.
#include "model/fp8.h"

#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/mx_quant.h"
#include "model/param_builders.h"
#include "model/params.h"
#include "model/qat.h"

namespace gale {

namespace {

constexpr int64_t kMxBlock = 32;  // TE's MXFP8 block

// The global decoder layer of a parameter name ("decoder.layers.<i>. ..."), −1 for others (MTP
// layers, which Megatron's get_fp8_context does not count as first or last).
int64_t decoder_layer(const std::string& name) {
  const std::string prefix = "decoder.layers.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size()));
}

// `name` with its last ".weight" replaced by `suffix`.
std::string module_tensor(const std::string& name, const char* suffix) {
  const std::string w = ".weight";
  if (name.empty()) return name;
  GALE_CHECK(name.size() > w.size() && name.compare(name.size() - w.size(), w.size(), w) == 0) << name;
  return name.substr(0, name.size() - w.size()) + suffix;
}

// x [rows, cols] transposed into t [cols, rows].
void transpose(const float* x, float* t, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
}

}  // namespace

const char* fp8_recipe_name(Fp8Recipe r) {
  return r == Fp8Recipe::kDelayed ? "delayed" : r == Fp8Recipe::kTensorwise ? "tensorwise" : "mxfp8";
}

StatusOr<Fp8Config> parse_fp8_config(const std::string& format, const std::string& recipe, int margin,
                                     int64_t amax_history_len, const std::string& amax_algo, bool wgrad) {
  Fp8Config c;
  if (format.empty()) return c;
  if (format != "e4m3" && format != "hybrid")
    return InvalidArgument("--fp8-format: expected e4m3 or hybrid, found \"", format, "\"");
  c.enabled = true;
  c.hybrid = format == "hybrid";
  if (recipe == "delayed") c.recipe = Fp8Recipe::kDelayed;
  else if (recipe == "tensorwise") c.recipe = Fp8Recipe::kTensorwise;
  else if (recipe == "mxfp8") c.recipe = Fp8Recipe::kMxfp8;
  else
    return InvalidArgument("--fp8-recipe: expected delayed, tensorwise or mxfp8, found \"", recipe, "\"",
                           recipe == "blockwise"
                               ? " (Transformer Engine's Float8BlockScaling is not a choice of Megatron core_v0.12.1; "
                                 "not supported yet)"
                               : "");
  if (amax_history_len < 1)
    return InvalidArgument("--fp8-amax-history-len: expected at least 1, found ", amax_history_len);
  if (margin < 0 || margin > 64) return InvalidArgument("--fp8-margin: expected 0 to 64, found ", margin);
  if (amax_algo == "most_recent") c.amax_algo = Fp8AmaxAlgo::kMostRecent;
  else if (amax_algo == "max") c.amax_algo = Fp8AmaxAlgo::kMax;
  else return InvalidArgument("--fp8-amax-compute-algo: expected most_recent or max, found \"", amax_algo, "\"");
  c.margin = margin;
  c.amax_history_len = amax_history_len;
  c.wgrad = wgrad;
  return c;
}

bool fp8_selects(const Fp8Config& c, const std::string& name) {
  if (!c.enabled || !is_transformer_linear_weight(name)) return false;
  const int64_t layer = decoder_layer(name);
  if (layer < 0) return true;
  return layer >= c.bf16_layers_at_start && layer < c.num_layers - c.bf16_layers_at_end;
}

void add_fp8_params(ParamBuffer& pb, const Fp8Config& c) {
  if (!c.enabled) return;
  GALE_CHECK(!pb.finalized()) << "add_fp8_params after finalize";
  const int n = pb.size();
  for (int id = 0; id < n; ++id) {
    const ParamSpec s = pb.spec(id);
    if (s.global_shape.size() != 2 || !fp8_selects(c, s.name)) continue;
    int state = -1;
    if (c.recipe == Fp8Recipe::kDelayed) {
      // TE's _extra_state: replicated over TP (the amaxes are reduced over the amax group), a
      // buffer (no gradient, no optimizer state, in checkpoints).
      ParamSpec h = make_param_spec(module_tensor(s.name, "._extra_state.fp8_amax_history"),
                                    {c.amax_history_len, kFp8Roles}, InitKind::kZeros, 0.0f, false);
      ParamSpec sc = make_param_spec(module_tensor(s.name, "._extra_state.fp8_scale"), {kFp8Roles}, InitKind::kOnes,
                                     0.0f, false);
      for (ParamSpec* b : {&h, &sc}) {
        b->buffer = true;
        b->trainable = false;
        b->fp8_state_buffer = true;
      }
      h.global_name = module_tensor(s.global_name, "._extra_state.fp8_amax_history");
      sc.global_name = module_tensor(s.global_name, "._extra_state.fp8_scale");
      state = pb.add(h);
      GALE_CHECK_EQ(pb.add(sc), state + 1);
    }
    pb.set_fp8(id, state);
  }
  pb.set_fp8_config(std::make_shared<const Fp8Config>(c));
}

Tensor fp8_quantise(const Tensor& x, const Fp8Operands& op, Fp8Role role, bool reduce_cols) {
  GALE_CHECK_EQ(x.ndim(), 2);
  if (x.dtype() == DType::kF32) return fp8_quantise(x.data<float>(), x.size(0), x.size(1), op, role, reduce_cols);
  GALE_CHECK(x.dtype() == DType::kBF16) << "FP8 operands from " << dtype_name(x.dtype()) << " values";
  Tensor f = Tensor::empty(x.shape());
  convert_bf16_to_f32(x.data<bf16>(), f.data<float>(), x.numel());
  return fp8_quantise(f.data<float>(), x.size(0), x.size(1), op, role, reduce_cols);
}

Tensor fp8_quantise(const float* x, int64_t rows, int64_t cols, const Fp8Operands& op, Fp8Role role,
                    bool reduce_cols) {
  GALE_CHECK(op.active()) << "fp8_quantise without an FP8 configuration";
  const Fp8Config& c = *op.config;
  const Fp8Format f = c.format(role);
  const int64_t n = rows * cols;
  Tensor q = Tensor::empty({rows, cols});
  float* out = q.data<float>();
  switch (c.recipe) {
    case Fp8Recipe::kDelayed: {
      GALE_CHECK(op.history != nullptr && op.scale != nullptr) << "delayed scaling without its state";
      fp8_record_amax(op.history + role, fp8_amax(x, n));
      const float scale = op.scale[role];
      fp8_fake_quant_scaled(x, out, n, scale, 1.0f / scale, f);
      break;
    }
    case Fp8Recipe::kTensorwise: {
      const float scale = fp8_current_scale(fp8_amax(x, n), f);
      fp8_fake_quant_scaled(x, out, n, scale, 1.0f / scale, f);
      break;
    }
    case Fp8Recipe::kMxfp8: {
      const MxElement e = f == Fp8Format::kE5M2 ? MxElement::kFp8E5M2 : MxElement::kFp8E4M3;
      if (reduce_cols) {
        mx_fake_quant(x, out, rows, cols, kMxBlock, e);
      } else {  // blocks down the columns: quantise the transpose
        Tensor t = Tensor::empty({cols, rows});
        transpose(x, t.data<float>(), rows, cols);
        mx_fake_quant(t.data<float>(), t.data<float>(), cols, rows, kMxBlock, e);
        transpose(t.data<float>(), out, cols, rows);
      }
      break;
    }
  }
  return q;
}

std::vector<Fp8StateRef> fp8_delayed_states(ParamBuffer& pb) {
  std::vector<Fp8StateRef> states;
  for (int id = 0; id < pb.size(); ++id) {
    const int s = pb.spec(id).fp8_state;
    if (s >= 0) states.push_back({pb.param_data(s), pb.param_data(s + 1)});
  }
  return states;
}

void fp8_delayed_update_all(const std::vector<Fp8StateRef>& states, const Fp8Config& c) {
  for (const Fp8StateRef& st : states)
    for (int role = 0; role < kFp8Roles; ++role)
      fp8_delayed_update(st.history + role, c.amax_history_len, kFp8Roles, st.scale + role,
                         fp8_max(c.format(static_cast<Fp8Role>(role))), c.margin, c.amax_algo);
}

}  // namespace gale
