// --qat-scheme: which weights are fake-quantised, and their fake-quantised GEMM copies.
#include "model/qat.h"

#include "core/check.h"
#include "kernels/cpu/bf16_convert.h"
#include "model/linear.h"
#include "model/params.h"

namespace gale {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

StatusOr<QatConfig> parse_qat_scheme(const std::string& scheme, int64_t block_size) {
  QatConfig c;
  if (scheme.empty()) return c;
  if (scheme == "w4a16-mxfp4" || scheme == "w4a16-mxfp4-moe-only") {
    c.element = MxElement::kFp4E2M1;
  } else if (scheme == "w8a16-mxfp8" || scheme == "w8a16-mxfp8-moe-only") {
    c.element = MxElement::kFp8E4M3;
  } else {
    return InvalidArgument("--qat-scheme: expected w4a16-mxfp4, w4a16-mxfp4-moe-only, w8a16-mxfp8 or "
                           "w8a16-mxfp8-moe-only, found \"", scheme, "\"",
                           scheme == "w4a4-mxfp4" || scheme == "w4a8-moe-only"
                               ? " (MindSpeed's schemes with quantised activations are not supported yet)"
                               : "");
  }
  c.moe_only = ends_with(scheme, "-moe-only");
  if (block_size != 32 && block_size != 128)
    return InvalidArgument("--qat-quant-block-size: expected 32 or 128, found ", block_size);
  c.block = block_size;
  return c;
}

bool is_transformer_linear_weight(const std::string& name) {
  bool linear = false;
  for (const char* suffix : {".linear_qkv.weight", ".linear_proj.weight", ".linear_fc1.weight", ".linear_fc2.weight",
                             // multi-latent attention's projections (model/mla_attention.h)
                             ".linear_q_proj.weight", ".linear_q_down_proj.weight", ".linear_q_up_proj.weight",
                             ".linear_kv_down_proj.weight", ".linear_kv_up_proj.weight"})
    linear = linear || ends_with(name, suffix);
  return linear;
}

bool qat_selects(const QatConfig& c, const std::string& name) {
  if (!c.enabled() || !is_transformer_linear_weight(name)) return false;
  return !c.moe_only || name.find(".mlp.experts.") != std::string::npos;
}

void mark_qat_params(ParamBuffer& pb, const QatConfig& c) {
  if (!c.enabled()) return;
  for (int id = 0; id < pb.size(); ++id) {
    const ParamSpec& s = pb.spec(id);
    if (s.global_shape.size() != 2 || !qat_selects(c, s.name)) continue;
    const int64_t in = s.local_shape()[1];
    GALE_CHECK(in % c.block == 0) << "--qat-quant-block-size " << c.block << " does not divide " << s.name
                                  << "'s input dimension " << in << " on this rank";
    pb.set_qat(id, c.element, c.block);
  }
}

void qat_fake_quant_into(const ParamBuffer& pb, int id, LinearWeight& w) {
  const ParamSpec& s = pb.spec(id);
  GALE_CHECK(s.qat_element != MxElement::kNone) << s.name << " is not marked for --qat-scheme";
  const DType copy = pb.gemm_copy_dtype();
  GALE_CHECK(copy != DType::kF16) << "--qat-scheme with --fp16";
  const int64_t n = w.out * w.in;
  w.qat_w = Tensor::empty({w.out, w.in});
  float* q = w.qat_w.data<float>();
  if (copy == DType::kBF16) {  // what the bf16 GEMMs read, fake-quantised (exact in bf16)
    GALE_CHECK(w.w_bf16 != nullptr) << s.name << ": no bf16 copy";
    convert_bf16_to_f32(w.w_bf16, q, n);
    mx_fake_quant(q, q, w.out, w.in, s.qat_block, s.qat_element);
    w.qat_w_bf16 = Tensor::empty({w.out, w.in}, DType::kBF16);
    convert_f32_to_bf16(q, w.qat_w_bf16.data<bf16>(), n);
    w.w_bf16 = w.qat_w_bf16.data<bf16>();
  } else {
    GALE_CHECK(w.w != nullptr) << s.name << ": no f32 values";
    mx_fake_quant(w.w, q, w.out, w.in, s.qat_block, s.qat_element);
  }
  w.w = q;
}

}  // namespace gale
