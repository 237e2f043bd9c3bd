// MoE MLP forward/backward: router, top-k, permutation, expert GEMMs, weighted un-permutation, aux losses.
#include "model/moe_layer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "core/interleave.h"
#include "core/threads.h"
#include "kernels/cpu/activation.h"
#include "kernels/flop_counter.h"
#include "kernels/cpu/norm.h"
#include "model/expert_loop.h"
#include "model/linear.h"
#include "model/lora_expert.h"
#include "model/mlp_activation.h"
#include "model/moe_hot_experts.h"
#include "model/moe_mc2.h"
#include "model/param_builders.h"
#include "model/weight_grad_store.h"

namespace gale {

namespace {

std::string expert_name(int64_t layer, int64_t expert, const char* rest) {
  return str_cat("decoder.layers.", layer, ".mlp.experts.local_experts.", expert, ".", rest);
}

LinearWeight weight(const OpTable& ops, const ParamBuffer& pb, int id) {
  return linear_weight(pb, id, ops.gemm, ops.bf16_gemm);
}

// The token of a permuted row's slot: t·k + j, or -(t + 1) for a padding row.
int64_t token_of(int64_t slot, int64_t k) { return slot >= 0 ? slot / k : -slot - 1; }

// Rows `rows` (slots, token_of) of x [T, H] (f32 or bf16) into a new [n, H] tensor of the same type.
Tensor gather_rows(const Tensor& x, const int64_t* rows, int64_t n, int64_t k) {
  const int64_t H = x.size(1);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(x.dtype());
  Tensor out = Tensor::empty({n, H}, x.dtype());
  const char* src = static_cast<const char*>(x.raw());
  char* dst = static_cast<char*>(out.raw());
  for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * row_bytes, src + token_of(rows[r], k) * row_bytes, row_bytes);
  return out;
}

// Rows `rows` of f32 `x` [?, H] into a new [rows.size(), H] tensor.
Tensor take_rows(const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t H = x.size(1);
  Tensor out = Tensor::empty({static_cast<int64_t>(rows.size()), H});
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data<float>() + static_cast<int64_t>(i) * H, x.data<float>() + rows[i] * H,
                static_cast<size_t>(H) * sizeof(float));
  return out;
}

// The inverse of two take_rows: f32 [n, H] = a's rows at `a_rows` and b's at `b_rows` (together
// every row of the n once).
Tensor merge_rows(const Tensor& a, const std::vector<int64_t>& a_rows, const Tensor& b,
                  const std::vector<int64_t>& b_rows, int64_t n) {
  GALE_CHECK_EQ(static_cast<int64_t>(a_rows.size() + b_rows.size()), n);
  const int64_t H = a.size(1);
  const size_t row_bytes = static_cast<size_t>(H) * sizeof(float);
  Tensor out = Tensor::empty({n, H});
  for (size_t i = 0; i < a_rows.size(); ++i)
    std::memcpy(out.data<float>() + a_rows[i] * H, a.data<float>() + static_cast<int64_t>(i) * H, row_bytes);
  for (size_t i = 0; i < b_rows.size(); ++i)
    std::memcpy(out.data<float>() + b_rows[i] * H, b.data<float>() + static_cast<int64_t>(i) * H, row_bytes);
  return out;
}

// All-gather of `x` [n, ...] (any dtype) over `g` into [g·n, ...].
Tensor all_gather_rows(const Comm& g, const Tensor& x) {
  Shape shape = x.shape();
  shape[0] *= g->size();
  Tensor out = Tensor::empty(shape, x.dtype());
  g->all_gather(x.raw(), out.raw(), x.numel(), x.dtype());
  return out;
}

// all_gather_rows without waiting: issues the all-gather of `x` over `g` into *out (allocated
// here, [g·n, ...]); the caller keeps `x` alive and waits for the returned work before reading *out.
WorkPtr all_gather_rows_async(const Comm& g, const Tensor& x, Tensor* out) {
  Shape shape = x.shape();
  shape[0] *= g->size();
  *out = Tensor::empty(shape, x.dtype());
  return g->all_gather_async(x.raw(), out->raw(), x.numel(), x.dtype());
}

// reduce_scatter_rows without waiting (the same sum; *out is valid after the returned work's wait).
WorkPtr reduce_scatter_rows_async(const Comm& g, const Tensor& x, Tensor* out) {
  Shape shape = x.shape();
  GALE_CHECK_EQ(shape[0] % g->size(), 0);
  shape[0] /= g->size();
  *out = Tensor::empty(shape);
  return g->reduce_scatter_async(x.raw(), out->raw(), out->numel(), DType::kF32, ReduceOp::kSum);
}

// Reduce-scatter (sum) of f32 `x` [g·n, ...] over `g`: this rank's block [n, ...].
Tensor reduce_scatter_rows(const Comm& g, const Tensor& x) {
  Shape shape = x.shape();
  GALE_CHECK_EQ(shape[0] % g->size(), 0);
  shape[0] /= g->size();
  Tensor out = Tensor::empty(shape);
  g->reduce_scatter(x.raw(), out.raw(), out.numel(), DType::kF32, ReduceOp::kSum);
  return out;
}

bool splits(const Comm& g) { return g && g->size() > 1; }

// The experts a pass runs: this rank's local experts (parameters in the ParamBuffer) or the
// replicas of remote hot experts (--balanced-moe-experts, model/moe_hot_experts.h). fc1/fc2 as
// linear layers (their gradients included), the biases (null: none) and their gradients.
struct ExpertSet {
  int64_t count = 0;
  std::function<LinearWeight(int64_t)> fc1, fc2;
  // LoRA adapters of fc1 / fc2 (model/lora_expert.h): lora1[e].a null when not adapted.
  std::vector<LoraWeights> lora1, lora2;
  const LoraWeights* fc1_lora(int64_t e) const { return e < (int64_t)lora1.size() && lora1[e].a ? &lora1[e] : nullptr; }
  const LoraWeights* fc2_lora(int64_t e) const { return e < (int64_t)lora2.size() && lora2[e].a ? &lora2[e] : nullptr; }
  std::function<const float*(int64_t)> fc1_bias, fc2_bias;
  std::function<float*(int64_t)> fc1_bias_grad, fc2_bias_grad;
};

ExpertSet local_expert_set(const OpTable& ops, const ParamBuffer& pb, const MoeParamIds& w, float lora_scaling) {
  ExpertSet x;
  x.count = static_cast<int64_t>(w.fc1_w.size());
  x.fc1 = [&ops, &pb, &w](int64_t e) { return weight(ops, pb, w.fc1_w[e]); };
  x.fc2 = [&ops, &pb, &w](int64_t e) { return weight(ops, pb, w.fc2_w[e]); };
  x.fc1_bias = [&pb, &w](int64_t e) -> const float* { return w.fc1_b[e] >= 0 ? pb.param_data(w.fc1_b[e]) : nullptr; };
  x.fc2_bias = [&pb, &w](int64_t e) -> const float* { return w.fc2_b[e] >= 0 ? pb.param_data(w.fc2_b[e]) : nullptr; };
  x.fc1_bias_grad = [&pb, &w](int64_t e) -> float* { return w.fc1_b[e] >= 0 ? pb.grad_data(w.fc1_b[e]) : nullptr; };
  x.fc2_bias_grad = [&pb, &w](int64_t e) -> float* { return w.fc2_b[e] >= 0 ? pb.grad_data(w.fc2_b[e]) : nullptr; };
  // The experts' LoRA adapters, found by name beside their weights (register_moe_params).
  for (size_t e = 0; e < w.fc1_w.size(); ++e)
    for (auto [id, out] : {std::pair{w.fc1_w[e], &x.lora1}, std::pair{w.fc2_w[e], &x.lora2}}) {
      const LoraIds ids{pb.find(lora_a_name(pb.spec(id).name)), pb.find(lora_b_name(pb.spec(id).name))};
      out->push_back(ids.defined() ? lora_weights(pb, ids, lora_scaling, ops.gemm) : LoraWeights{});
    }
  return x;
}

ExpertSet replica_expert_set(const OpTable& ops, MoeHotExperts& hot, float lora_scaling) {
  ExpertSet x;
  x.count = hot.num_replicas();
  for (int64_t e = 0; e < x.count; ++e) {  // the replicas' LoRA adapters (a null: none)
    x.lora1.push_back(hot.fc1_lora(e, lora_scaling, ops.gemm));
    x.lora2.push_back(hot.fc2_lora(e, lora_scaling, ops.gemm));
  }
  x.fc1 = [&ops, &hot](int64_t e) { return hot.fc1(e, ops.gemm, ops.bf16_gemm); };
  x.fc2 = [&ops, &hot](int64_t e) { return hot.fc2(e, ops.gemm, ops.bf16_gemm); };
  x.fc1_bias = [&hot](int64_t e) { return hot.fc1_bias(e); };
  x.fc2_bias = [&hot](int64_t e) { return hot.fc2_bias(e); };
  x.fc1_bias_grad = [&hot](int64_t e) { return hot.fc1_bias_grad(e); };
  x.fc2_bias_grad = [&hot](int64_t e) { return hot.fc2_bias_grad(e); };
  return x;
}

// The expert-TP layout of this rank's local-expert rows (offsets [El + 1]): every ETP rank's row
// counts per local expert, exchanged once (all-gather of El int64).
MoeEtpLayout make_etp_layout(const Comm& etp, const std::vector<int64_t>& offsets) {
  MoeEtpLayout l;
  const int64_t El = static_cast<int64_t>(offsets.size()) - 1, P = etp->size();
  Tensor mine = Tensor::empty({El}, DType::kI64);
  for (int64_t j = 0; j < El; ++j) mine.data<int64_t>()[j] = offsets[j + 1] - offsets[j];
  const Tensor all = all_gather_rows(etp, mine);  // [P·El]
  const int64_t* n = all.data<int64_t>();
  l.padded_rows = 0;
  for (int64_t r = 0; r < P; ++r) {
    int64_t rows = 0;
    for (int64_t j = 0; j < El; ++j) rows += n[r * El + j];
    l.padded_rows = std::max(l.padded_rows, rows);
  }
  l.offsets.assign(static_cast<size_t>(El + 1), 0);
  for (int64_t j = 0; j < El; ++j) {
    l.offsets[j + 1] = l.offsets[j];
    for (int64_t r = 0; r < P; ++r) l.offsets[j + 1] += n[r * El + j];
  }
  l.source_row.resize(static_cast<size_t>(l.offsets[El]));
  std::vector<int64_t> next(l.offsets.begin(), l.offsets.end() - 1);
  for (int64_t r = 0; r < P; ++r) {
    int64_t first = r * l.padded_rows;  // rank r's block in the padded all-gather
    for (int64_t j = 0; j < El; ++j)
      for (int64_t i = 0; i < n[r * El + j]; ++i) l.source_row[next[j]++] = first++;
  }
  return l;
}

// Rows [N, H] (any dtype) of this rank -> the expert-TP group's rows [N', H] grouped by local
// expert (expert j: ETP rank 0's rows, then rank 1's, ...).
Tensor etp_gather(const Comm& etp, const MoeEtpLayout& l, const Tensor& rows) {
  const int64_t H = rows.size(1), N = rows.size(0);
  const size_t row_bytes = static_cast<size_t>(H) * dtype_size(rows.dtype());
  Tensor padded = Tensor::zeros({l.padded_rows, H}, rows.dtype());
  if (N > 0) std::memcpy(padded.raw(), rows.raw(), static_cast<size_t>(N) * row_bytes);
  const Tensor all = all_gather_rows(etp, padded);
  Tensor out = Tensor::empty({l.offsets.back(), H}, rows.dtype());
  const char* src = static_cast<const char*>(all.raw());
  char* dst = static_cast<char*>(out.raw());
  for (size_t i = 0; i < l.source_row.size(); ++i)
    std::memcpy(dst + i * row_bytes, src + l.source_row[i] * row_bytes, row_bytes);
  return out;
}

// The inverse with a sum: partial f32 rows [N', H] (each ETP rank's share of the row-parallel
// fc2 or of fc1's input gradient) -> this rank's N rows summed over the group (reduce-scatter).
Tensor etp_reduce_scatter(const Comm& etp, const MoeEtpLayout& l, const Tensor& partial, int64_t N) {
  const int64_t H = partial.size(1);
  Tensor padded = Tensor::zeros({etp->size() * l.padded_rows, H});
  for (size_t i = 0; i < l.source_row.size(); ++i)
    std::memcpy(padded.data<float>() + l.source_row[i] * H, partial.data<float>() + static_cast<int64_t>(i) * H,
                static_cast<size_t>(H) * sizeof(float));
  const Tensor mine = reduce_scatter_rows(etp, padded);  // [padded_rows, H]
  Tensor out = Tensor::empty({N, H});
  if (N > 0) std::memcpy(out.raw(), mine.raw(), static_cast<size_t>(N * H) * sizeof(float));
  return out;
}

// The local experts on `in` [N, H] (f32 or bf16) grouped by local expert: expert e takes rows
// [offsets[e], offsets[e+1]). Returns their outputs [N, H] (f32) and keeps each expert's fc1
// output and activation for backward. With an expert-TP group (`etp`, size > 1) the rows of the
// whole group are gathered first (s->etp, s->expert_in), each rank's fc1 shard (column-parallel)
// and fc2 shard (row-parallel) give partial outputs, reduce-scattered back to the rows' ranks; the
// fc2 bias is added once (ETP rank 0) before the sum.
// Under --moe-zero-memory (s->zero_memory) the input rows and activations (level1: and the fc1
// outputs) are not kept.
Tensor experts_forward(const ModelConfig& c, const OpTable& ops, const ExpertSet& w, const Tensor& in,
                       const std::vector<int64_t>& in_offsets, const Comm& etp, MoeSaved* s) {
  const int64_t H = c.hidden;
  const bool split = splits(etp);
  const int64_t Fe = c.moe.ffn / (split ? etp->size() : 1);
  std::vector<int64_t> offsets = in_offsets;
  Tensor rows = in;
  if (split) {
    s->etp = make_etp_layout(etp, in_offsets);
    offsets = s->etp.offsets;
    rows = etp_gather(etp, s->etp, in);
  }
  const int64_t El = static_cast<int64_t>(offsets.size()) - 1;
  GALE_CHECK_EQ(w.count, El) << "local experts";
  Tensor out = Tensor::empty({offsets[El], H});
  std::vector<Tensor>* fc1_outs = &s->fc1_out;
  std::vector<Tensor>* acts = &s->act;
  fc1_outs->assign(static_cast<size_t>(El), Tensor());
  acts->assign(static_cast<size_t>(El), Tensor());
  const bool add_fc2_bias = !split || etp->rank() == 0;
  for_each_expert(El, [&](int64_t e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) return;
    Tensor u = linear_forward(rows.slice(offsets[e], n), w.fc1(e));  // [n, Fe or 2Fe]
    if (const LoraWeights* l = w.fc1_lora(e)) lora_forward(rows.slice(offsets[e], n), *l, u);
    Tensor act = Tensor::empty({n, Fe});
    mlp_activation_forward(c, ops)(u.data<float>(), w.fc1_bias(e), act.data<float>(), n, Fe);
    act = to_gemm_input(act, c.gemm_dtype());
    Tensor ye = linear_forward(act, w.fc2(e));  // [n, H]
    if (const LoraWeights* l = w.fc2_lora(e)) lora_forward(act, *l, ye);
    if (w.fc2_bias(e) && add_fc2_bias) add_bias_ref(ye.data<float>(), w.fc2_bias(e), n, H);
    std::memcpy(out.data<float>() + offsets[e] * H, ye.data<float>(), static_cast<size_t>(n * H) * sizeof(float));
    const bool off = s->zero_memory == MoeZeroMemory::kOff;
    if (s->zero_memory != MoeZeroMemory::kLevel1) (*fc1_outs)[e] = u;
    if (!c.recompute.moe_act && off) (*acts)[e] = act;  // --recompute-modules moe_act: backward recomputes it
  });
  if (s->zero_memory == MoeZeroMemory::kOff) s->expert_in = rows;
  return split ? etp_reduce_scatter(etp, s->etp, out, in.size(0)) : out;
}

// The local experts' offsets of the rows experts_forward ran (under ETP the group's).
const std::vector<int64_t>& expert_row_offsets(const Comm& etp, const MoeSaved& s, const std::vector<int64_t>& in) {
  return splits(etp) ? s.etp.offsets : in;
}

// The experts' input rows again (--moe-zero-memory): the re-dispatched rows of this rank, under
// ETP all-gathered over the group as forward did.
Tensor redispatched_rows(const Comm& etp, const MoeSaved& s, PendingRows& redispatch) {
  const Tensor rows = redispatch.wait();
  return splits(etp) ? etp_gather(etp, s.etp, rows) : rows;
}

// --moe-zero-memory level1: each local expert's fc1 output (bias added) and activation from its
// rows, the same kernels as experts_forward (so the same bits).
void recompute_fc1(const ModelConfig& c, const OpTable& ops, const ExpertSet& w, const Tensor& rows,
                   const std::vector<int64_t>& offsets, int64_t Fe, MoeSaved& s) {
  FlopCountRecompute recompute;  // --op-cal-tflops: counted with recompute only
  const int64_t El = static_cast<int64_t>(offsets.size()) - 1;
  s.fc1_out.assign(static_cast<size_t>(El), Tensor());
  s.act.assign(static_cast<size_t>(El), Tensor());
  for_each_expert(El, [&](int64_t e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) return;
    Tensor u = linear_forward(rows.slice(offsets[e], n), w.fc1(e));
    if (const LoraWeights* l = w.fc1_lora(e)) lora_forward(rows.slice(offsets[e], n), *l, u);
    Tensor act = Tensor::empty({n, Fe});
    mlp_activation_forward(c, ops)(u.data<float>(), w.fc1_bias(e), act.data<float>(), n, Fe);
    s.fc1_out[e] = u;
    s.act[e] = to_gemm_input(act, c.gemm_dtype());
  });
}

// Backward of experts_forward up to the rows: `d_out_local` [N, H] (this rank's rows) -> the rows'
// gradient [N, H] (under ETP reduce-scattered back); accumulates the fc2 weight and bias and the
// fc1 bias gradients and keeps in `du` each expert's fc1 output gradient (as the fc1 GEMMs take
// it, `rows_dtype`) for experts_fc1_weight_grads. Releases the kept fc1 outputs and activations.
Tensor experts_backward_data(const ModelConfig& c, const OpTable& ops, const ExpertSet& w, const Tensor& d_out_local,
                             const std::vector<int64_t>& in_offsets, const Comm& etp,
                             DType rows_dtype, MoeSaved& s, std::vector<Tensor>* du, WeightGradStore* defer) {
  const int64_t H = c.hidden;
  const bool split = splits(etp);
  const int64_t Fe = c.moe.ffn / (split ? etp->size() : 1);
  const std::vector<int64_t>& offsets = expert_row_offsets(etp, s, in_offsets);
  const Tensor d_out = split ? etp_gather(etp, s.etp, d_out_local) : d_out_local;
  std::vector<Tensor>& fc1_outs = s.fc1_out;
  std::vector<Tensor>& acts = s.act;
  const int64_t El = static_cast<int64_t>(offsets.size()) - 1;
  Tensor d_in = Tensor::empty({offsets[El], H});
  du->assign(static_cast<size_t>(El), Tensor());
  if (defer) defer->begin_experts(El);
  for_each_expert(El, [&](int64_t e) {
    const int64_t first = offsets[e], n = offsets[e + 1] - first;
    if (n == 0) return;
    const Tensor d_ye = d_out.slice(first, n);
    if (float* db2 = w.fc2_bias_grad(e)) column_sum_accumulate(d_ye.data<float>(), db2, n, H);
    if (!acts[e].defined()) {  // moe_act / zero memory: from fc1's output (its bias already added)
      Tensor act = Tensor::empty({n, Fe});
      mlp_activation_forward(c, ops)(fc1_outs[e].data<float>(), nullptr, act.data<float>(), n, Fe);
      acts[e] = to_gemm_input(act, c.gemm_dtype());
    }
    // [n, Fe]; the fc2 weight gradient at once or into the expert batch (as linear_backward).
    const LinearWeight fc2 = w.fc2(e);
    const Tensor d_ye_gemm = to_gemm_input(d_ye, acts[e].dtype());
    if (defer)
      defer->put_expert(e, d_ye_gemm, acts[e], fc2);
    else
      linear_backward_weight(d_ye_gemm, acts[e], fc2);
    Tensor d_act = Tensor::empty({n, fc2.in});
    linear_backward_data_into(d_ye_gemm, fc2, acts[e].dtype(), d_act);
    if (const LoraWeights* l = w.fc2_lora(e)) {  // the adapter's dA, dB and its part of d_act
      lora_backward_input(d_ye, *l, d_act);
      lora_backward_weights(d_ye, acts[e], *l);
    }
    acts[e] = Tensor();
    Tensor d_u = Tensor::empty(fc1_outs[e].shape());
    float* db1 = w.fc1_bias_grad(e);
    mlp_activation_backward(c, ops)(d_act.data<float>(), fc1_outs[e].data<float>(), d_u.data<float>(), db1, n, Fe);
    fc1_outs[e] = Tensor();
    (*du)[e] = to_gemm_input(d_u, rows_dtype);  // rounded once for both products (as linear_backward)
    Tensor dxe = Tensor::empty({n, H});
    linear_backward_data_into((*du)[e], w.fc1(e), rows_dtype, dxe);  // [n, H]
    if (const LoraWeights* l = w.fc1_lora(e)) lora_backward_input(d_u, *l, dxe);  // dA, dB with fc1's dW
    std::memcpy(d_in.data<float>() + first * H, dxe.data<float>(), static_cast<size_t>(n * H) * sizeof(float));
  });
  if (defer) defer->end_experts();
  return split ? etp_reduce_scatter(etp, s.etp, d_in, d_out_local.size(0)) : d_in;
}

// The fc1 weight gradients from experts_backward_data's `du` and the experts' input rows; releases `du`.
// With `defer` (--dualpipev-dw-detach) they are queued there as one expert batch instead.
void experts_fc1_weight_grads(const ExpertSet& w, const Tensor& rows,
                              const std::vector<int64_t>& offsets, std::vector<Tensor>& du, WeightGradStore* defer) {
  const int64_t El = static_cast<int64_t>(offsets.size()) - 1;
  if (defer) defer->begin_experts(El);
  for_each_expert(El, [&](int64_t e) {
    const int64_t n = offsets[e + 1] - offsets[e];
    if (n == 0) return;
    if (defer)
      defer->put_expert(e, du[e], rows.slice(offsets[e], n), w.fc1(e));
    else
      linear_backward_weight(du[e], rows.slice(offsets[e], n), w.fc1(e));
    if (const LoraWeights* l = w.fc1_lora(e)) lora_backward_weights(du[e], rows.slice(offsets[e], n), *l);
    du[e] = Tensor();
  });
  if (defer) defer->end_experts();
}

}  // namespace

MoeHotPass::MoeHotPass() = default;
MoeHotPass::~MoeHotPass() = default;

std::vector<int64_t> MoeHotPass::slots(const std::vector<int64_t>& permuted) const {
  std::vector<int64_t> out(hot_rows.size());
  for (size_t i = 0; i < hot_rows.size(); ++i) out[i] = permuted[static_cast<size_t>(hot_rows[i])];
  return out;
}

std::vector<int64_t> MoeHotPass::sent_slots(const std::vector<int64_t>& permuted) const {
  std::vector<int64_t> out(sent_rows.size());
  for (size_t i = 0; i < sent_rows.size(); ++i) out[i] = permuted[static_cast<size_t>(sent_rows[i])];
  return out;
}

int64_t MoeSaved::tensor_bytes() const {
  int64_t n = 0;
  const auto add = [&](const Tensor& t) { n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; };
  for (const Tensor* t : {&x, &router.scores, &router.logsumexp, &router.logits, &router.probs, &probs,
                          &gathered_probs, &expert_in, &expert_out})
    add(*t);
  for (const std::vector<Tensor>* v : {&fc1_out, &act})
    for (const Tensor& t : *v) add(t);
  if (hot) n += hot->state.tensor_bytes();  // --balanced-moe-experts: the replicas' kept tensors
  return n;
}

std::vector<int> MoeParamIds::all() const {
  std::vector<int> ids;
  if (router_w >= 0) ids.push_back(router_w);
  if (router_b >= 0) ids.push_back(router_b);
  for (size_t e = 0; e < fc1_w.size(); ++e)
    for (int id : {fc1_w[e], fc1_b[e], fc2_w[e], fc2_b[e]})
      if (id >= 0) ids.push_back(id);
  return ids;
}

MoeParamIds register_moe_params(ParamBuffer& pb, const ModelConfig& c, int64_t layer, int64_t ep_size,
                                int64_t ep_rank, int64_t etp_size, int64_t etp_rank, bool router_partial_grad,
                                bool experts_partial_grad) {
  MoeParamIds w;
  GALE_CHECK(ep_size >= 1 && c.moe.num_experts % ep_size == 0 && ep_rank >= 0 && ep_rank < ep_size)
      << c.moe.num_experts << " experts over expert-parallel rank " << ep_rank << " of " << ep_size;
  GALE_CHECK(etp_size >= 1 && c.moe.ffn % etp_size == 0 && etp_rank >= 0 && etp_rank < etp_size)
      << "--moe-ffn-hidden-size " << c.moe.ffn << " over expert-tensor-parallel rank " << etp_rank << " of " << etp_size;
  const int64_t El = c.moe.num_experts / ep_size, H = c.hidden, Fe = c.moe.ffn;
  // A local expert's spec: its local name, and under EP the global expert's name.
  // split_dim: the dimension split over the expert-TP group (-1: whole on every ETP rank).
  auto expert_spec = [&](int64_t j, const char* rest, Shape shape, InitKind init, float std, bool decay,
                         int split_dim = -1, int blocks = 1) {
    ParamSpec s = make_param_spec(expert_name(layer, j, rest), std::move(shape), init, std, decay);
    s.sequence_parallel = experts_partial_grad;
    if (etp_size > 1 && split_dim >= 0) {
      s.split_dim = split_dim;
      s.split_blocks = blocks;
      s.split_parts = etp_size;
      s.split_rank = etp_rank;
    }
    if (ep_size > 1) {
      s.expert_parallel = true;
      s.global_name = expert_name(layer, ep_rank * El + j, rest);
    }
    return s;
  };
  const float out_std = c.init_std / std::sqrt(2.0f * static_cast<float>(c.num_layers));
  ParamSpec router = make_param_spec(str_cat("decoder.layers.", layer, ".mlp.router.weight"), {c.moe.num_experts, H},
                                     InitKind::kNormal, c.init_std, true);
  router.sequence_parallel = router_partial_grad;  // each TP rank routes its own tokens
  w.router_w = pb.add(router);
  if (c.add_bias_linear) {  // Megatron's TopKRouter.bias: init_method as the weight, no weight decay
    ParamSpec bias = make_param_spec(str_cat("decoder.layers.", layer, ".mlp.router.bias"), {c.moe.num_experts},
                                     InitKind::kNormal, c.init_std, false);
    bias.sequence_parallel = router_partial_grad;
    w.router_b = pb.add(bias);
  }
  if (c.moe.expert_bias) {  // Megatron's buffer: no gradient, no optimizer state, in checkpoints
    ParamSpec bias = make_param_spec(str_cat("decoder.layers.", layer, ".mlp.router.expert_bias"), {c.moe.num_experts},
                                     InitKind::kZeros, 0, false);
    bias.trainable = false;
    bias.buffer = true;
    w.expert_bias = pb.add(bias);
  }
  if (c.moe.quantile_balancing) {  // Megatron main's qb_beta buffer (its accumulators are not saved)
    ParamSpec beta = make_param_spec(str_cat("decoder.layers.", layer, ".mlp.router.qb_beta"), {c.moe.num_experts},
                                     InitKind::kZeros, 0, false);
    beta.trainable = false;
    beta.buffer = true;
    w.qb_beta = pb.add(beta);
    w.qb = std::make_shared<MoeQuantileBalancing>(c.moe.num_experts);
  }
  const int blocks = c.gated() ? 2 : 1;  // SwiGLU fc1 [gate; up]: each half split (as the dense MLP)
  for (int64_t e = 0; e < El; ++e) {
    const int64_t fc1_rows = c.gated() ? 2 * Fe : Fe;
    w.fc1_w.push_back(
        pb.add(expert_spec(e, "linear_fc1.weight", {fc1_rows, H}, InitKind::kNormal, c.init_std, true, 0, blocks)));
    w.fc1_b.push_back(c.add_bias_linear
                          ? pb.add(expert_spec(e, "linear_fc1.bias", {fc1_rows}, InitKind::kZeros, 0, false, 0, blocks))
                          : -1);
    w.fc2_w.push_back(pb.add(expert_spec(e, "linear_fc2.weight", {H, Fe}, InitKind::kNormal, out_std, true, 1)));
    // LoRA on the routed experts (MindSpeed-LLM's peft matches every expert's linear_fc1 / linear_fc2).
    if (lora_targets(c.lora, LoraTarget::kFc1)) register_expert_lora(pb, c.lora, pb.spec(w.fc1_w.back()));
    if (lora_targets(c.lora, LoraTarget::kFc2)) register_expert_lora(pb, c.lora, pb.spec(w.fc2_w.back()));
    w.fc2_b.push_back(c.add_bias_linear ? pb.add(expert_spec(e, "linear_fc2.bias", {H}, InitKind::kZeros, 0, false))
                                        : -1);
  }
  return w;
}

Tensor moe_forward(const ModelConfig& c, const OpTable& ops, const ParamBuffer& pb, const MoeParamIds& w,
                   const Tensor& x, MoeSaved* saved, MoeAuxLosses* losses, const Comm& ep, bool allgather,
                   const Comm& etp, const Comm& seq, int64_t batch, const std::function<void()>& overlap,
                   const MoeRouterKey& router_key, MoeZeroMemory zero_memory, const std::vector<Comm>& hot_groups) {
  const int64_t T = x.size(0), H = c.hidden, E = c.moe.num_experts, k = c.moe.topk;
  // ---- router (model/moe_router.h): top-k experts, weights, dropped pairs (expert -1) ----
  MoeRouterSaved router_saved;
  MoeRouting routing =
      moe_router_forward(c, ops, pb, w.router(), x, batch, saved ? &router_saved : nullptr, losses, seq, router_key);
  const Tensor probs = routing.probs;
  const std::vector<int32_t>& experts = routing.experts;
  const std::vector<int64_t>& global_counts = routing.tokens_per_expert;
  const int64_t R = std::accumulate(global_counts.begin(), global_counts.end(), int64_t{0});  // the kept (token, expert) pairs
  // --enable-expert-placement: the counters of the load prediction (training forwards only), and
  // the chosen experts relabelled to the physical experts that hold them (model/expert_placement.h)
  MoePlacement* placed = w.placement.get();
  if (placed && saved && losses)
    for (int64_t e = 0; e < E; ++e) placed->counts[e] += global_counts[e];
  if (placed && placed->identity()) placed = nullptr;
  GALE_CHECK(!placed || (!(allgather && ep && ep->size() > 1) && routing.padding.empty()))
      << "expert placement needs the alltoall dispatcher and no --moe-pad-expert-input-to-capacity";
  std::vector<int64_t> counts = global_counts;  // per physical expert
  if (placed)
    for (int64_t e = 0; e < E; ++e) counts[placed->physical[e]] = global_counts[e];
  // ---- permutation: each expert's rows in token order (padding rows among them) ----
  std::vector<int64_t> offsets(static_cast<size_t>(E + 1), 0);
  for (int64_t e = 0; e < E; ++e) offsets[e + 1] = offsets[e] + counts[e];
  std::vector<int64_t> permuted(static_cast<size_t>(R));
  {
    std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j)
        if (experts[t * k + j] >= 0) {
          const int64_t e = placed ? placed->physical[experts[t * k + j]] : experts[t * k + j];
          permuted[next[e]++] = t * k + j;
        }
    for (size_t e = 0; e < routing.padding.size(); ++e) {
      for (int64_t t : routing.padding[e]) permuted[next[e]++] = -(t + 1);
      std::stable_sort(permuted.begin() + offsets[e], permuted.begin() + offsets[e + 1],
                       [&](int64_t a, int64_t b) { return token_of(a, k) < token_of(b, k); });
    }
  }
  std::vector<int64_t> row_order;  // with a placement: the rows in global expert order
  if (placed) {
    row_order.reserve(static_cast<size_t>(R));
    for (int64_t e = 0; e < E; ++e) {
      const int64_t p = placed->physical[e];
      for (int64_t r = offsets[p]; r < offsets[p + 1]; ++r) row_order.push_back(r);
    }
  }
  Tensor y = Tensor::zeros({T, H});
  const bool gathered = allgather && ep && ep->size() > 1;
  MoeDispatchPlan plan;
  Tensor expert_in, expert_out, gathered_probs;
  std::vector<int64_t> gathered_slot;
  MoeSaved st;  // the experts' kept tensors (and the expert-TP layout)
  st.zero_memory = saved ? zero_memory : MoeZeroMemory::kOff;
  GALE_CHECK(st.zero_memory == MoeZeroMemory::kOff || !gathered) << "--moe-zero-memory with the all-gather dispatcher";
  if (!gathered) {
    // ---- all-to-all: this rank's rows to the experts' ranks, local experts, and back ----
    // --balanced-moe-experts (model/moe_hot_experts.h): the hot experts are chosen and their
    // replicas broadcast; this rank's rows of the remote hot ones stay here (hot->hot_rows)
    std::shared_ptr<MoeHotPass> hot;
    std::vector<int64_t> send_counts = counts;
    if (ops.moe_hot_experts > 0 && ep && ep->size() > 1) {
      GALE_CHECK(!placed && routing.padding.empty() && !splits(etp) && st.zero_memory == MoeZeroMemory::kOff)
          << "--balanced-moe-experts with expert placement, padding to capacity, expert-TP or --moe-zero-memory";
      hot = std::make_shared<MoeHotPass>();
      hot->experts = std::make_unique<MoeHotExperts>(ep, hot_groups, pb, w, counts, ops.moe_hot_experts);
      hot->hot_offsets.assign(1, 0);
      for (int64_t e = 0; e < E; ++e) {
        const bool here = hot->experts->remote(e);
        std::vector<int64_t>& to = here ? hot->hot_rows : hot->sent_rows;
        for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) to.push_back(r);
        if (here) {
          send_counts[e] = 0;
          hot->hot_offsets.push_back(static_cast<int64_t>(hot->hot_rows.size()));
        }
      }
    }
    plan = make_dispatch_plan(ep, send_counts);
    Tensor hot_out;  // [hot rows, H] the replicas' outputs, replica-major
    // --moe-fb-overlap (core/interleave.h): while each exchange is in flight the other micro-batch
    // of the overlapped forward/backward pair computes (no-op outside a pair); the hot rows are
    // computed while the other rows are dispatched
    const std::function<void()> in_flight = [&] {
      if (overlap) overlap();
      if (hot) {
        const ExpertSet replicas = replica_expert_set(ops, *hot->experts, c.lora.scaling());
        hot_out = experts_forward(c, ops, replicas, gather_rows(x, hot->slots(permuted).data(), hot->num_rows(), k),
                                  hot->hot_offsets, nullptr, &hot->state);
      }
      interleave_yield();
    };
    const ExpertSet locals = local_expert_set(ops, pb, w, c.lora.scaling());
    if (ops.moe_alltoall_mc2) {
      // --moe-alltoall-mc2 (model/moe_mc2.h): each permuted row copied from x straight to its
      // expert's input (this rank's experts) or the send buffer, received straight into the
      // expert-major layout; the outputs sent straight from the experts' rows and reduced token by
      // token where they land (kept in permuted order only for backward)
      GALE_CHECK(!placed && !hot && !splits(etp) && st.zero_memory == MoeZeroMemory::kOff)
          << "--moe-alltoall-mc2 with expert placement, hot-expert replicas, expert-TP or --moe-zero-memory";
      const size_t row_bytes = static_cast<size_t>(H) * dtype_size(x.dtype());
      const char* xs = static_cast<const char*>(x.raw());
      expert_in = mc2_dispatch(
          ep, plan, H, x.dtype(),
          [&](int64_t r, void* dst) { std::memcpy(dst, xs + token_of(permuted[r], k) * row_bytes, row_bytes); },
          in_flight);
      Mc2Rows back = mc2_combine(ep, plan, experts_forward(c, ops, locals, expert_in, plan.expert_offsets, etp, &st),
                                 saved != nullptr);
      moe_dispatch_counters().note_expert_rows(plan.num_received());
      mc2_weighted_unpermute(back, token_rows(permuted, T, k), permuted, probs, H, &y);
      if (saved) expert_out = back.rows;  // [R, H] permuted order (the routing-weight gradient's)
    } else {
      const Tensor to_send = hot ? gather_rows(x, hot->sent_slots(permuted).data(), plan.num_sent(), k)
                                 : gather_rows(x, permuted.data(), R, k);
      expert_in = dispatch_rows(ep, plan, to_send, in_flight);  // [N, H] local expert-major
      PendingRows back =
          combine_rows_async(ep, plan, experts_forward(c, ops, locals, expert_in, plan.expert_offsets, etp, &st));
      interleave_yield();
      expert_out = back.wait();
      const int64_t hot_rows = hot ? hot->num_rows() : 0;
      moe_dispatch_counters().note_expert_rows(plan.num_received() + hot_rows);
      moe_dispatch_counters().hot_rows_computed_locally += hot_rows;
      if (hot) expert_out = merge_rows(expert_out, hot->sent_rows, hot_out, hot->hot_rows, R);
      if (saved) saved->hot = hot;
      // ---- weighted un-permutation ----
      for (int64_t i = 0; i < R; ++i) {
        const int64_t r = row_order.empty() ? i : row_order[i];
        if (permuted[r] < 0) continue;  // a padding row: weight 0
        const int64_t t = permuted[r] / k;
        weighted_row_accumulate(y.data<float>() + t * H, expert_out.data<float>() + r * H,
                                probs.data<float>()[permuted[r]], H);
      }
    }
  } else {
    // ---- all-gather (Megatron's MoEAllGatherTokenDispatcher): every EP rank's tokens and
    // routing; the local experts take their rows of all of them in (rank, token) order; the
    // weighted outputs [EP·T, H] are reduce-scattered back to the tokens' ranks ----
    GALE_CHECK(routing.padding.empty()) << "--moe-pad-expert-input-to-capacity with the all-gather dispatcher";
    const int64_t P = ep->size(), El = E / P, first_expert = ep->rank() * El;
    Tensor my_experts = Tensor::empty({T * k}, DType::kI32);
    std::memcpy(my_experts.raw(), experts.data(), static_cast<size_t>(T * k) * sizeof(int32_t));
    Tensor all_x, all_experts;
    WorkPtr x_work;
    if (ops.moe_allgather_overlap) {
      // --moe-allgather-overlap-comm: the routing's all-gathers first, then the hidden states'
      // (they complete in issue order); the local rows' layout and the shared expert run while
      // the hidden states are in flight
      const Tensor flat_probs = probs.view({T * k});
      WorkPtr e_work = all_gather_rows_async(ep, my_experts, &all_experts);
      WorkPtr p_work = all_gather_rows_async(ep, flat_probs, &gathered_probs);
      x_work = all_gather_rows_async(ep, x, &all_x);
      if (overlap) overlap();
      e_work->wait();
      p_work->wait();
    } else {
      if (overlap) overlap();
      all_x = all_gather_rows(ep, x);  // [P·T, H]
      all_experts = all_gather_rows(ep, my_experts);  // [P·T·k]
      gathered_probs = all_gather_rows(ep, probs.view({T * k}));  // [P·T·k]
    }
    plan.ep_size = P;
    plan.local_experts = El;
    plan.expert_offsets.assign(static_cast<size_t>(El + 1), 0);
    const int32_t* ex = all_experts.data<int32_t>();
    for (int64_t i = 0; i < P * T * k; ++i)
      if (ex[i] >= first_expert && ex[i] < first_expert + El) ++plan.expert_offsets[ex[i] - first_expert + 1];
    for (int64_t j = 0; j < El; ++j) plan.expert_offsets[j + 1] += plan.expert_offsets[j];
    gathered_slot.resize(static_cast<size_t>(plan.expert_offsets[El]));
    {
      std::vector<int64_t> next(plan.expert_offsets.begin(), plan.expert_offsets.end() - 1);
      for (int64_t i = 0; i < P * T * k; ++i)
        if (ex[i] >= first_expert && ex[i] < first_expert + El) gathered_slot[next[ex[i] - first_expert]++] = i;
    }
    if (x_work) x_work->wait();
    expert_in = gather_rows(all_x, gathered_slot.data(), plan.expert_offsets[El], k);
    expert_out = experts_forward(c, ops, local_expert_set(ops, pb, w, c.lora.scaling()), expert_in, plan.expert_offsets, etp, &st);  // [N, H]
    Tensor partial = Tensor::zeros({P * T, H});
    for (int64_t r = 0; r < plan.expert_offsets[El]; ++r) {
      const float q = gathered_probs.data<float>()[gathered_slot[r]];
      const float* src = expert_out.data<float>() + r * H;
      float* dst = partial.data<float>() + gathered_slot[r] / k * H;
      for (int64_t h = 0; h < H; ++h) dst[h] += q * src[h];
    }
    y = reduce_scatter_rows(ep, partial);
  }
  if (saved) {
    saved->router = std::move(router_saved);
    saved->tokens_per_expert = global_counts;
    saved->x = x;
    saved->probs = probs;
    saved->experts = experts;
    saved->offsets = std::move(offsets);
    saved->permuted_slot = std::move(permuted);
    saved->row_order = std::move(row_order);
    saved->plan = std::move(plan);
    saved->gathered = gathered;
    saved->gathered_slot = std::move(gathered_slot);
    saved->gathered_probs = gathered_probs;
    saved->expert_in = st.expert_in;
    saved->etp = std::move(st.etp);
    saved->fc1_out = std::move(st.fc1_out);
    saved->act = std::move(st.act);
    saved->expert_out = expert_out;
    saved->zero_memory = st.zero_memory;
  }
  return y;
}

namespace {

// Backward of the all-to-all path (and of one EP rank): the permuted rows' output gradients go to
// the experts' ranks like the inputs, the input gradients come back like the outputs.
// Backward of y_t += q_slot · out_r for every expert row r (slot = slot_of[r], token slot / k):
// d_out[r] = q_slot · dy_t and dprobs[slot] = dy_t · out_r (summed in double). `dy` is [tokens, H].
// One row of it: the row's output `o` [H] -> its output gradient `d` [H] and dprobs[slot].
void weighted_output_row_backward(const float* dy, int64_t H, int64_t k, int64_t slot, const Tensor& probs,
                                  const float* o, float* d, Tensor* dprobs) {
  if (slot < 0) {  // a padding row: weight 0, no routing-weight gradient
    std::fill(d, d + H, 0.0f);
    return;
  }
  const int64_t t = slot / k;
  const float q = probs.data<float>()[slot];
  double dot = 0.0;
  for (int64_t h = 0; h < H; ++h) {
    dot += static_cast<double>(dy[t * H + h]) * o[h];
    d[h] = q * dy[t * H + h];
  }
  dprobs->data<float>()[slot] = static_cast<float>(dot);
}

void weighted_outputs_backward(const float* dy, int64_t H, int64_t k, const std::vector<int64_t>& slot_of,
                               const Tensor& probs, const Tensor& out, Tensor* d_out, Tensor* dprobs) {
  GALE_CHECK_EQ(out.size(0), static_cast<int64_t>(slot_of.size()));
  for (size_t r = 0; r < slot_of.size(); ++r) {
    const int64_t i = static_cast<int64_t>(r);
    weighted_output_row_backward(dy, H, k, slot_of[r], probs, out.data<float>() + i * H,
                                 d_out->data<float>() + i * H, dprobs);
  }
}

// Backward of the fused all-to-all path (--moe-alltoall-mc2, model/moe_mc2.h): each permuted
// row's output gradient (and its routing-weight gradient) written straight to its expert's rank
// (this rank's experts' rows in place), the experts' backward, then the input gradients sent
// straight from the expert-major rows and summed token by token where they land. The same
// products and sums in the same order as routed_experts_backward (bit-identical).
void mc2_routed_experts_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w,
                                 MoeSaved& s, const Tensor& dy, const Comm& ep, const Comm& etp, Tensor* dprobs_out,
                                 Tensor* dx_out, const std::function<void()>& overlap, WeightGradStore* defer) {
  GALE_CHECK(!s.hot && s.row_order.empty() && !splits(etp) && s.zero_memory == MoeZeroMemory::kOff)
      << "--moe-alltoall-mc2 with expert placement, hot-expert replicas, expert-TP or --moe-zero-memory";
  const int64_t T = dy.size(0), H = c.hidden, k = c.moe.topk;
  const float* g = dy.data<float>();
  GALE_CHECK_EQ(s.expert_out.size(0), static_cast<int64_t>(s.permuted_slot.size()));
  Tensor dprobs = Tensor::zeros({T, k});
  const float* out = s.expert_out.data<float>();
  Tensor d_local_out = mc2_dispatch(
      ep, s.plan, H, DType::kF32,
      [&](int64_t r, void* dst) {
        weighted_output_row_backward(g, H, k, s.permuted_slot[r], s.probs, out + r * H, static_cast<float*>(dst),
                                     &dprobs);
      },
      [&] {
        if (overlap) overlap();  // the shared expert's backward while the gradients are in flight
        interleave_yield();
      });
  s.expert_out = Tensor();
  std::vector<Tensor> du;
  const ExpertSet locals = local_expert_set(ops, pb, w, c.lora.scaling());
  Tensor d_expert_in =
      experts_backward_data(c, ops, locals, d_local_out, s.plan.expert_offsets, etp, s.x.dtype(), s, &du, defer);
  d_local_out = Tensor();
  experts_fc1_weight_grads(locals, s.expert_in, s.plan.expert_offsets, du, defer);
  s.expert_in = Tensor();
  Mc2Rows back = mc2_combine(ep, s.plan, d_expert_in, /*materialize=*/false);
  d_expert_in = Tensor();  // (back.local keeps this rank's chunks)
  Tensor dx = Tensor::empty({T, H});
  mc2_sum_token_rows(back, token_rows(s.permuted_slot, T, k), H, &dx);
  *dprobs_out = dprobs;
  *dx_out = dx;
}

void routed_experts_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w,
                             MoeSaved& s, const Tensor& dy, const Comm& ep, const Comm& etp, Tensor* dprobs_out,
                             Tensor* dx_out, const std::function<void()>& overlap, WeightGradStore* defer) {
  const int64_t T = dy.size(0), H = c.hidden, k = c.moe.topk;
  const float* g = dy.data<float>();
  // ---- un-permutation: d(routing weight) and each permuted row's output gradient ----
  const int64_t R = static_cast<int64_t>(s.permuted_slot.size());  // kept pairs (dropped ones: no row, no gradient)
  Tensor dprobs = Tensor::zeros({T, k});
  Tensor d_expert_out = Tensor::empty({R, H});
  weighted_outputs_backward(g, H, k, s.permuted_slot, s.probs, s.expert_out, &d_expert_out, &dprobs);
  s.expert_out = Tensor();
  // ---- the exchanges (issued in this order on every EP rank): --moe-zero-memory re-dispatches
  // the experts' input rows from x (level1 first: its fc1 recomputation needs them before the
  // experts' backward; level0 after: only the fc1 weight gradients need them) ----
  const bool level1 = s.zero_memory == MoeZeroMemory::kLevel1, redo = s.zero_memory != MoeZeroMemory::kOff;
  const auto redispatch = [&] { return dispatch_rows_async(ep, s.plan, gather_rows(s.x, s.permuted_slot.data(), R, k)); };
  PendingRows rows_again;
  if (level1) rows_again = redispatch();
  // --balanced-moe-experts: the hot rows' gradients stay here (their replicas' backward below)
  Tensor d_hot_out;
  if (s.hot) {
    d_hot_out = take_rows(d_expert_out, s.hot->hot_rows);
    d_expert_out = take_rows(d_expert_out, s.hot->sent_rows);
  }
  PendingRows grads = dispatch_rows_async(ep, s.plan, d_expert_out);  // to the experts' ranks
  if (redo && !level1) rows_again = redispatch();
  if (overlap) overlap();  // the shared expert's backward while they are in flight
  Tensor d_hot_in;         // the hot rows' input gradients, replica-major
  if (s.hot) {             // the replicas' backward while the other rows' gradients are in flight
    MoeHotPass& h = *s.hot;
    const ExpertSet replicas = replica_expert_set(ops, *h.experts, c.lora.scaling());
    std::vector<Tensor> du;
    d_hot_in = experts_backward_data(c, ops, replicas, d_hot_out, h.hot_offsets, nullptr, s.x.dtype(), h.state, &du,
                                     nullptr);
    d_hot_out = Tensor();
    experts_fc1_weight_grads(replicas, h.state.expert_in, h.hot_offsets, du, nullptr);
    h.state.expert_in = Tensor();
  }
  interleave_yield();      // --moe-fb-overlap: the other micro-batch of the pair computes meanwhile
  const bool split = splits(etp);
  const std::vector<int64_t>& offsets = expert_row_offsets(etp, s, s.plan.expert_offsets);
  Tensor rows = s.expert_in;
  if (level1) {
    rows = redispatched_rows(etp, s, rows_again);
    recompute_fc1(c, ops, local_expert_set(ops, pb, w, c.lora.scaling()), rows, offsets, c.moe.ffn / (split ? etp->size() : 1), s);
  }
  Tensor d_local_out = grads.wait();  // [N, H] local expert-major
  d_expert_out = Tensor();
  std::vector<Tensor> du;
  const ExpertSet locals = local_expert_set(ops, pb, w, c.lora.scaling());
  Tensor d_expert_in =
      experts_backward_data(c, ops, locals, d_local_out, s.plan.expert_offsets, etp, s.x.dtype(), s, &du, defer);
  d_local_out = Tensor();
  if (redo && !level1) rows = redispatched_rows(etp, s, rows_again);
  // ---- back to the token rows; --moe-alltoall-overlap-comm: the fc1 weight gradients meanwhile ----
  PendingRows back;
  if (ops.moe_alltoall_overlap) back = combine_rows_async(ep, s.plan, d_expert_in);
  experts_fc1_weight_grads(locals, rows, offsets, du, defer);
  rows = Tensor();
  s.expert_in = Tensor();
  if (!ops.moe_alltoall_overlap) back = combine_rows_async(ep, s.plan, d_expert_in);
  d_expert_in = Tensor();
  // --balanced-moe-experts: the replicas' gradients to the experts' owners while the combine is in flight
  if (s.hot) s.hot->experts->reduce_grads_to_owners(pb, w);
  interleave_yield();  // --moe-fb-overlap
  Tensor d_rows = back.wait();  // [R, H] this rank's permuted rows
  if (s.hot) d_rows = merge_rows(d_rows, s.hot->sent_rows, d_hot_in, s.hot->hot_rows, R);
  Tensor dx = Tensor::zeros({T, H});
  for (int64_t i = 0; i < R; ++i) {  // (a padding row's gradient is 0); global expert order
    const int64_t r = s.row_order.empty() ? i : s.row_order[i];
    if (s.permuted_slot[r] >= 0) add_inplace(dx.data<float>() + s.permuted_slot[r] / k * H, d_rows.data<float>() + r * H, H);
  }
  *dprobs_out = dprobs;
  *dx_out = dx;
}

// Backward of the all-gather path: the output gradients of every EP rank's tokens are gathered;
// this rank's experts give partial routing-weight and token gradients for all of them (zero where
// another rank's expert served the slot), reduce-scattered back to the tokens' ranks.
// With ops.moe_allgather_overlap (--moe-allgather-overlap-comm) the exchanges are issued without
// waiting: `overlap` (the shared expert's backward) runs while the output gradients are gathered,
// the experts' backward while the routing-weight gradients are reduce-scattered, and the experts'
// fc1 weight-gradient GEMMs while the token gradients are (issued after every expert's input
// gradient, the dx/dw split); without it `overlap` runs before the all-gather and every exchange
// is waited for at once. The same sums run on the same operands either way.
void gathered_experts_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w,
                               MoeSaved& s, const Tensor& dy, const Comm& ep, const Comm& etp, Tensor* dprobs_out,
                               Tensor* dx_out, const std::function<void()>& overlap, WeightGradStore* defer) {
  const int64_t T = dy.size(0), H = c.hidden, k = c.moe.topk, P = ep->size();
  const int64_t N = s.plan.expert_offsets.back();
  const bool async = ops.moe_allgather_overlap;
  Tensor all_dy;  // [P·T, H]
  if (async) {
    WorkPtr dy_work = all_gather_rows_async(ep, dy, &all_dy);
    if (overlap) overlap();
    dy_work->wait();
  } else {
    if (overlap) overlap();
    all_dy = all_gather_rows(ep, dy);
  }
  const float* g = all_dy.data<float>();
  Tensor dprobs_partial = Tensor::zeros({P * T * k});
  Tensor d_out = Tensor::empty({N, H});
  weighted_outputs_backward(g, H, k, s.gathered_slot, s.gathered_probs, s.expert_out, &d_out, &dprobs_partial);
  s.expert_out = Tensor();
  all_dy = Tensor();
  Tensor dprobs;
  WorkPtr dprobs_work;
  if (async) dprobs_work = reduce_scatter_rows_async(ep, dprobs_partial, &dprobs);
  std::vector<Tensor> du;
  const Tensor rows = s.expert_in;
  const ExpertSet locals = local_expert_set(ops, pb, w, c.lora.scaling());
  Tensor d_in = experts_backward_data(c, ops, locals, d_out, s.plan.expert_offsets, etp, rows.dtype(), s, &du, defer);
  d_out = Tensor();
  Tensor dx_partial = Tensor::zeros({P * T, H});
  for (int64_t r = 0; r < N; ++r)
    add_inplace(dx_partial.data<float>() + s.gathered_slot[r] / k * H, d_in.data<float>() + r * H, H);
  d_in = Tensor();
  Tensor dx;
  WorkPtr dx_work;
  if (async) dx_work = reduce_scatter_rows_async(ep, dx_partial, &dx);
  experts_fc1_weight_grads(locals, rows, expert_row_offsets(etp, s, s.plan.expert_offsets), du, defer);
  s.expert_in = Tensor();
  if (async) {
    dprobs_work->wait();
    dx_work->wait();
  } else {
    dx = reduce_scatter_rows(ep, dx_partial);
    dprobs = reduce_scatter_rows(ep, dprobs_partial);
  }
  *dx_out = dx;
  *dprobs_out = dprobs.view({T, k});
}

}  // namespace

Tensor moe_backward(const ModelConfig& c, const OpTable& ops, ParamBuffer& pb, const MoeParamIds& w, MoeSaved& s,
                    const Tensor& dy, double aux_scale, const Comm& ep, const Comm& etp,
                    const std::function<void()>& overlap, WeightGradStore* defer_weight_grads) {
  const int64_t T = dy.size(0), H = c.hidden;
  Tensor dprobs, dx;
  if (s.gathered) {
    gathered_experts_backward(c, ops, pb, w, s, dy, ep, etp, &dprobs, &dx, overlap, defer_weight_grads);
  } else if (ops.moe_alltoall_mc2) {
    mc2_routed_experts_backward(c, ops, pb, w, s, dy, ep, etp, &dprobs, &dx, overlap, defer_weight_grads);
  } else {
    routed_experts_backward(c, ops, pb, w, s, dy, ep, etp, &dprobs, &dx, overlap, defer_weight_grads);
  }
  // ---- router: routing weights and auxiliary losses -> logits ----
  const Tensor d_router_in = moe_router_backward(c, ops, pb, w.router(), s.router, s.x, dprobs, aux_scale);
  add_inplace(dx.data<float>(), d_router_in.data<float>(), T * H);
  s = MoeSaved{};
  return dx;
}

}  // namespace gale
