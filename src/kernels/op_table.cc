// The level-0 op table: reference kernels, plus the small composites the model calls.
#include "kernels/op_table.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/tensor.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/logit_softcap.h"

namespace gale {

namespace {

// x rounded to bf16 (nearest even) in place.
void round_to_bf16(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_float(float_to_bf16(x[i]));
}

void norm_forward_ref(const NormSpec& s, const float* x, const float* w, const float* b, float* y, float* stats,
                      int64_t rows, int64_t H) {
  if (s.rms)
    rmsnorm_forward_ref(x, w, y, stats, rows, H, s.eps);
  else
    layernorm_forward_ref(x, w, b, y, stats, stats + rows, rows, H, s.eps);
}

void norm_backward_ref(const NormSpec& s, const float* dy, const float* x, const float* w, const float* stats,
                       float* dx, float* dw, float* db, int64_t rows, int64_t H) {
  if (s.rms)
    rmsnorm_backward_ref(dy, x, w, stats, dx, dw, rows, H);
  else
    layernorm_backward_ref(dy, x, w, stats, stats + rows, dx, dw, db, rows, H);
}

void bias_dropout_add_ref(const float* x, const float* bias, const float* residual, float* out, int64_t rows,
                          int64_t cols, const DropoutSpec& spec) {
  // The reference spells the three steps out; x is used as scratch.
  float* t = const_cast<float*>(x);
  if (bias) add_bias_ref(t, bias, rows, cols);
  if (spec.p > 0.0f) dropout_forward_ref(t, t, rows, cols, spec);
  for (int64_t i = 0; i < rows * cols; ++i) out[i] = residual[i] + t[i];
}

void bias_dropout_add_backward_ref(const float* dout, float* dx, float* dbias, int64_t rows, int64_t cols,
                                   const DropoutSpec& spec) {
  if (spec.p > 0.0f)
    dropout_backward_ref(dout, dx, rows, cols, spec);
  else if (dx != dout)
    std::memcpy(dx, dout, sizeof(float) * static_cast<size_t>(rows * cols));
  if (dbias) column_sum_accumulate(dx, dbias, rows, cols);
}

void bias_dropout_add_norm_ref(const float* x, const float* bias, const float* residual, float* out,
                               const NormSpec& norm, const float* w, const float* b, float* y, float* stats,
                               int64_t rows, int64_t cols, const DropoutSpec& spec) {
  bias_dropout_add_ref(x, bias, residual, out, rows, cols, spec);
  norm_forward_ref(norm, out, w, b, y, stats, rows, cols);
}

// Reference LM head: the whole [T, Vl] logits, kept in `saved` and turned into their gradient.
void lm_head_loss_forward_ref(const LmHeadProblem& p, float* slice_max, float* slice_sumexp, float* target_logit,
                              Tensor* saved) {
  Tensor logits = Tensor::empty({p.T, p.Vl});
  p.gemm(false, true, p.T, p.Vl, p.H, 1.0f, p.x, p.H, p.W, p.H, 0.0f, logits.data<float>(), p.Vl);
  if (p.bf16_logits) round_to_bf16(logits.data<float>(), p.T * p.Vl);  // --output-logit-dtype bf16
  if (p.logit_softcap > 0.0f) {  // --output-logit-softcapping (in the logits' dtype)
    softcap_inplace(logits.data<float>(), p.T * p.Vl, p.logit_softcap);
    if (p.bf16_logits) round_to_bf16(logits.data<float>(), p.T * p.Vl);
  }
  ce_row_max(logits.data<float>(), p.T, p.Vl, slice_max);
  ce_sumexp_and_target(logits.data<float>(), p.T, p.Vl, slice_max, p.targets, p.vocab_start, slice_sumexp,
                       target_logit);
  if (saved) *saved = logits;
}

void lm_head_loss_backward_ref(const LmHeadProblem& p, const float* lse, const float* dloss, float* dx, float* dW,
                               Tensor* saved) {
  Tensor logits = *saved;
  *saved = Tensor();
  // softmax = exp(logit − lse): the kernel's (max, sumexp) form with max = lse and sumexp = 1.
  std::vector<float> ones(static_cast<size_t>(p.T), 1.0f);
  std::vector<float> capped;
  if (p.logit_softcap > 0.0f) capped.assign(logits.data<float>(), logits.data<float>() + p.T * p.Vl);
  ce_backward_inplace(logits.data<float>(), p.T, p.Vl, lse, ones.data(), p.targets, p.vocab_start, dloss);
  for (size_t e = 0; e < capped.size(); ++e)  // --output-logit-softcapping: d z = d capped · (1 − tanh²)
    logits.data<float>()[e] = softcap_grad(logits.data<float>()[e], capped[e], p.logit_softcap);
  if (p.bf16_logits) round_to_bf16(logits.data<float>(), p.T * p.Vl);  // the gradient of bf16 logits
  if (dW) p.gemm(true, false, p.Vl, p.H, p.T, 1.0f, logits.data<float>(), p.Vl, p.x, p.H, 1.0f, dW, p.H);
  p.gemm(false, false, p.T, p.H, p.Vl, 1.0f, logits.data<float>(), p.Vl, p.W, p.H, 0.0f, dx, p.H);
}

void gelu_act_forward_ref(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (bias) add_bias_ref(u, bias, rows, F);
  gelu_forward_ref(u, act, rows * F);
}

void gelu_act_backward_ref(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  gelu_backward_ref(dact, u, du, rows * F);
  if (dbias) column_sum_accumulate(du, dbias, rows, F);
}

void gelu_tanh_act_forward_ref(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (bias) add_bias_ref(u, bias, rows, F);
  gelu_tanh_forward_ref(u, act, rows * F);
}

void gelu_tanh_act_backward_ref(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  gelu_tanh_backward_ref(dact, u, du, rows * F);
  if (dbias) column_sum_accumulate(du, dbias, rows, F);
}

void squared_relu_act_forward_ref(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (bias) add_bias_ref(u, bias, rows, F);
  squared_relu_forward_ref(u, act, rows * F);
}

void squared_relu_act_backward_ref(const float* dact, const float* u, float* du, float* dbias, int64_t rows,
                                   int64_t F) {
  squared_relu_backward_ref(dact, u, du, rows * F);
  if (dbias) column_sum_accumulate(du, dbias, rows, F);
}

void swiglu_act_forward_ref(float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (bias) add_bias_ref(u, bias, rows, 2 * F);
  swiglu_forward_ref(u, act, rows, F);
}

void swiglu_act_backward_ref(const float* dact, const float* u, float* du, float* dbias, int64_t rows, int64_t F) {
  swiglu_backward_ref(dact, u, du, rows, F);
  if (dbias) column_sum_accumulate(du, dbias, rows, 2 * F);
}

void glu_act_forward_ref(const GluSpec& spec, float* u, const float* bias, float* act, int64_t rows, int64_t F) {
  if (bias) add_bias_ref(u, bias, rows, 2 * F);
  glu_forward_ref(spec, u, act, rows, F);
}

void glu_act_backward_ref(const GluSpec& spec, const float* dact, const float* u, float* du, float* dbias,
                          int64_t rows, int64_t F) {
  glu_backward_ref(spec, dact, u, du, rows, F);
  if (dbias) column_sum_accumulate(du, dbias, rows, 2 * F);
}

}  // namespace

OpTable reference_ops() {
  OpTable t;
  t.gemm = sgemm;
  t.bf16_gemm = gemm_bf16;
  t.norm_forward = norm_forward_ref;
  t.norm_backward = norm_backward_ref;
  t.bias_dropout_add = bias_dropout_add_ref;
  t.bias_dropout_add_backward = bias_dropout_add_backward_ref;
  t.dropout = dropout_forward_ref;
  t.gelu_forward = gelu_act_forward_ref;
  t.gelu_backward = gelu_act_backward_ref;
  t.gelu_tanh_forward = gelu_tanh_act_forward_ref;
  t.gelu_tanh_backward = gelu_tanh_act_backward_ref;
  t.squared_relu_forward = squared_relu_act_forward_ref;
  t.squared_relu_backward = squared_relu_act_backward_ref;
  t.swiglu_forward = swiglu_act_forward_ref;
  t.swiglu_backward = swiglu_act_backward_ref;
  t.glu_forward = glu_act_forward_ref;
  t.glu_backward = glu_act_backward_ref;
  t.rope_forward = rope_forward_ref;
  t.rope_backward = rope_backward_ref;
  t.attention_forward = attention_forward_ref;
  t.attention_backward = attention_backward_ref;
  t.dsa_sparse_attention_forward = dsa_sparse_attention_forward_ref;
  t.dsa_sparse_attention_backward = dsa_sparse_attention_backward_ref;
  t.embedding_forward = embedding_forward_ref;
  t.embedding_backward = embedding_backward_ref;
  t.bias_dropout_add_norm = bias_dropout_add_norm_ref;
  t.lm_head_loss_forward = lm_head_loss_forward_ref;
  t.lm_head_loss_backward = lm_head_loss_backward_ref;
  t.adamw_step = adamw_step_ref;
  t.ema_adamw_step = ema_adamw_step_ref;
  t.sum_of_squares = gale::sum_of_squares;
  for (const char* op : {"gemm", "norm", "bias_dropout_add", "gelu", "swiglu", "geglu", "rope", "attention",
                         "embedding", "bias_dropout_add_norm", "lm_head_loss", "adamw"})
    t.impl[op] = "reference";
  return t;
}

}  // namespace gale
