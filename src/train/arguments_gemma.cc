// MindSpeed-LLM's Gemma flags (--geglu, --gelu-tanh, --add-rmsnorm-offset, --input-embeds-norm): parsed, checked and resolved into the model config.
#include <cmath>

#include "core/dtype.h"
#include "model/config.h"
#include "train/arguments.h"

namespace gale {

void add_gemma_args(ArgParser& p, ModelArgs& a) {
  p.add_flag("--geglu", &a.geglu,
             "MindSpeed-LLM's GeGLU (Gemma): a gated MLP like --swiglu (fc1 = [gate; up]) whose gate goes through "
             "the exact erf GeLU: gelu(gate)·up");
  p.add_flag("--gelu-tanh", &a.gelu_tanh,
             "MindSpeed-LLM's tanh GeGLU (Gemma, Hugging Face's gelu_pytorch_tanh): --geglu with the "
             "tanh-approximated GeLU");
  p.add_flag("--add-rmsnorm-offset", &a.add_rmsnorm_offset,
             "MindSpeed-LLM's RMSNorm unit offset (Gemma): every RMSNorm scales by 1 + weight (weights "
             "initialised to 1, as MindSpeed-LLM's RMSNorm)");
  p.add_flag("--input-embeds-norm", &a.input_embeds_norm,
             "MindSpeed-LLM's input normalization (Gemma): the embedding's output times sqrt(hidden-size), the "
             "factor rounded to the training dtype (bf16 / fp16)");
}

Status validate_gemma_args(const Arguments& a) {
  const ModelArgs& m = a.model;
  const bool geglu = m.geglu || m.gelu_tanh;
  const char* flag = m.geglu ? "--geglu" : "--gelu-tanh";
  if (m.geglu && m.gelu_tanh)
    return InvalidArgument("--geglu with --gelu-tanh: the GeGLU MLP has one GeLU (exact with --geglu, tanh with "
                           "--gelu-tanh)");
  if (geglu && m.swiglu)
    return InvalidArgument(flag, " with --swiglu: the gated MLP has one activation (GeLU or SiLU)");
  if (geglu && m.quick_geglu)
    return InvalidArgument(flag, " with --quick-geglu: the gated MLP has one activation (GeLU or quick GeLU)");
  if (geglu && m.squared_relu)
    return InvalidArgument(flag, " with --squared-relu: the MLP has one activation (GeGLU or squared ReLU)");
  if (m.geglu && m.openai_gelu)
    return InvalidArgument("--geglu with --openai-gelu: --geglu gates through the exact GeLU; use --gelu-tanh for "
                           "the tanh GeLU");
  if (geglu && m.glu_linear_offset != 0.0)
    return InvalidArgument("--glu-linear-offset ", m.glu_linear_offset, " with ", flag,
                           ": expected --swiglu or --quick-geglu (the offset is Megatron's glu() option), found GeGLU");
  if (geglu && !unset(m.activation_func_clamp_value))
    return InvalidArgument("--activation-func-clamp-value ", m.activation_func_clamp_value, " with ", flag,
                           ": expected --swiglu or --quick-geglu (the clamp is Megatron's glu() option), found GeGLU");
  if (m.add_rmsnorm_offset) {
    if (m.normalization != "RMSNorm")
      return InvalidArgument("--add-rmsnorm-offset needs --normalization RMSNorm (MindSpeed-LLM offsets only RMSNorm), "
                             "found ", m.normalization);
    if (m.apply_layernorm_1p)
      return InvalidArgument("--add-rmsnorm-offset with --apply-layernorm-1p: both make the norm scale 1 + weight; "
                             "expected one of them");
    if (m.is_hybrid_model)
      return InvalidArgument("--add-rmsnorm-offset with --is-hybrid-model: the Mamba mixers' gated norms have no "
                             "offset in MindSpeed-LLM; expected a GPT model");
    if (!m.experimental_attention_variant.empty())
      return InvalidArgument("--add-rmsnorm-offset with --experimental-attention-variant ",
                             m.experimental_attention_variant, ": expected standard attention");
  }
  if (m.input_embeds_norm && m.mtp_num_layers != kUnset && m.mtp_num_layers > 0)
    return InvalidArgument("--input-embeds-norm with --mtp-num-layers ", m.mtp_num_layers,
                           ": MindSpeed-LLM scales only the decoder's input, not the MTP layers' embeddings; "
                           "expected no MTP layers");
  return Status::Ok();
}

void apply_gemma_args(const Arguments& a, ModelConfig* c) {
  const ModelArgs& m = a.model;
  c->geglu = m.geglu || m.gelu_tanh;
  if (m.gelu_tanh) c->openai_gelu = true;
  c->rmsnorm_offset = m.add_rmsnorm_offset;
  c->input_embeds_scale = 1.0f;
  if (m.input_embeds_norm) {
    // torch.tensor(hidden_size ** 0.5, dtype=hidden_states.dtype): the factor in the activations' dtype.
    const float s = static_cast<float>(std::sqrt(static_cast<double>(m.hidden_size)));
    c->input_embeds_scale = a.training.bf16   ? bf16_to_float(float_to_bf16(s))
                            : a.training.fp16 ? f16_to_float(float_to_f16(s))
                                              : s;
  }
}

}  // namespace gale
