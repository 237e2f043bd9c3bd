// --mla-down-proj-fusion: the input norm and both MLA down projections as one norm pass + one GEMM.
#include "model/mla_down_proj.h"

#include <cstring>

#include "core/check.h"
#include "core/threads.h"
#include "kernels/cpu/norm_gemm_input.h"
#include "model/linear.h"
#include "model/norm_weight.h"

namespace gale {

namespace {

LinearWeight weight(const LayerRuntime& rt, const ParamBuffer& pb, int id) {
  LinearWeight w = linear_weight(pb, id, rt.ops->gemm, rt.ops->bf16_gemm);
  w.defer = rt.weight_grads;
  return w;
}

// [a; b] as one [na + nb, in] matrix: `a` itself when b follows it in memory, else a copy in *keep.
template <class T>
const T* concatenated(const T* a, const T* b, int64_t na, int64_t nb, DType dtype, Tensor* keep) {
  if (a == nullptr && b == nullptr) return nullptr;
  GALE_CHECK(a != nullptr && b != nullptr) << "--mla-down-proj-fusion: the two down projections' " << dtype_name(dtype)
                                           << " values exist for one of them only";
  if (a + na == b) return a;
  *keep = Tensor::empty({na + nb}, dtype);
  std::memcpy(keep->raw(), a, static_cast<size_t>(na) * sizeof(T));
  std::memcpy(static_cast<char*>(keep->raw()) + na * sizeof(T), b, static_cast<size_t>(nb) * sizeof(T));
  return static_cast<const T*>(keep->raw());
}

// The concatenated weight [q_down; kv_down] [Cq + Ckv + R, H] and what it keeps alive.
struct CatWeight {
  LinearWeight q, kv, cat;
  Tensor keep_w, keep_bf16, keep_f16;
  bool grad_in_place = false;  // cat.grad is [dW_q; dW_kv] in place (else dW is accumulated per half)
};

CatWeight cat_weight(const LayerRuntime& rt, const ParamBuffer& pb, const MlaDownProjIds& ids) {
  CatWeight c;
  c.q = weight(rt, pb, ids.q_down);
  c.kv = weight(rt, pb, ids.kv_down);
  GALE_CHECK(!c.q.fp8.active() && !c.kv.fp8.active() && !c.q.qat_w.defined() && !c.kv.qat_w.defined())
      << "--mla-down-proj-fusion: FP8 or QAT down projections (refused by the argument checks)";
  GALE_CHECK_EQ(c.q.in, c.kv.in);
  const int64_t nq = c.q.out * c.q.in, nkv = c.kv.out * c.kv.in;
  c.cat = c.q;
  c.cat.out = c.q.out + c.kv.out;
  c.cat.w = concatenated(c.q.w, c.kv.w, nq, nkv, DType::kF32, &c.keep_w);
  c.cat.w_bf16 = concatenated(c.q.w_bf16, c.kv.w_bf16, nq, nkv, DType::kBF16, &c.keep_bf16);
  c.cat.w_f16 = concatenated(c.q.w_f16, c.kv.w_f16, nq, nkv, DType::kF16, &c.keep_f16);
  c.grad_in_place = (c.q.grad == nullptr && c.kv.grad == nullptr) ||
                    (c.q.grad != nullptr && c.kv.grad != nullptr && c.q.grad + nq == c.kv.grad);
  c.cat.grad = c.grad_in_place ? c.q.grad : nullptr;
  return c;
}

// Columns [c0, c0 + n) of a [rows, cols] f32 tensor.
Tensor columns(const Tensor& x, int64_t c0, int64_t n) {
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor y = Tensor::empty({rows, n});
  parallel_for(rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t)
      std::memcpy(y.data<float>() + t * n, x.data<float>() + t * cols + c0, static_cast<size_t>(n) * sizeof(float));
  });
  return y;
}

}  // namespace

Tensor mla_down_proj_forward(const LayerRuntime& rt, const ParamBuffer& pb, const MlaDownProjIds& w, const Tensor& x_in,
                             MlaDownProjSaved* saved) {
  const ModelConfig& c = *rt.config;
  GALE_CHECK(x_in.dtype() == DType::kF32 && x_in.ndim() == 2 && x_in.size(1) == c.hidden)
      << "--mla-down-proj-fusion: the layer input " << x_in.shape_string() << " (expected f32 [rows, " << c.hidden
      << "])";
  const int64_t rows = x_in.size(0), H = c.hidden;
  Tensor xn = Tensor::empty({rows, H}, c.gemm_dtype());
  Tensor stats = Tensor::empty({c.rms_norm ? 1 : 2, rows});
  norm_to_gemm_input(NormSpec{c.rms_norm, c.norm_eps}, x_in.data<float>(), NormScale(c, pb, w.norm_w).data(),
                     w.norm_b >= 0 ? pb.param_data(w.norm_b) : nullptr, xn.raw(), xn.dtype(), stats.data<float>(),
                     rows, H);
  const CatWeight cw = cat_weight(rt, pb, w);
  Tensor y = linear_forward(xn, cw.cat);  // [rows, Cq + Ckv + R]: one GEMM
  if (saved) {
    saved->x_in = x_in;
    saved->stats = stats;
    saved->xn = xn;
  }
  return y;
}

Tensor mla_down_proj_backward(const LayerRuntime& rt, ParamBuffer& pb, const MlaDownProjIds& w, MlaDownProjSaved& s,
                              const Tensor& dy) {
  const ModelConfig& c = *rt.config;
  GALE_CHECK(s.xn.defined() && s.x_in.defined()) << "--mla-down-proj-fusion: backward without its forward's state";
  const CatWeight cw = cat_weight(rt, pb, w);
  Tensor dxn = linear_backward(dy, s.xn, cw.cat);  // dxn = dy·W (and dW += dyᵀ·xn in place): one GEMM each
  if (!cw.grad_in_place) {  // the gradients are not adjacent: dW per half, same products
    linear_backward_weight(to_gemm_input(columns(dy, 0, cw.q.out), s.xn.dtype()), s.xn, cw.q);
    linear_backward_weight(to_gemm_input(columns(dy, cw.q.out, cw.kv.out), s.xn.dtype()), s.xn, cw.kv);
  }
  const int64_t rows = s.x_in.size(0), H = c.hidden;
  Tensor dx = Tensor::empty({rows, H});
  rt.ops->norm_backward(NormSpec{c.rms_norm, c.norm_eps}, dxn.data<float>(), s.x_in.data<float>(),
                        NormScale(c, pb, w.norm_w).data(), s.stats.data<float>(), dx.data<float>(),
                        pb.grad_data(w.norm_w), w.norm_b >= 0 ? pb.grad_data(w.norm_b) : nullptr, rows, H);
  s = MlaDownProjSaved();
  return dx;
}

}  // namespace gale
