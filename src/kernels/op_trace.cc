// The op table's tracing wrappers of --profile (one span per kernel call).
#include "kernels/op_trace.h"

#include <type_traits>

#include "core/trace.h"
#include "kernels/flop_counter.h"

namespace gale {

namespace {

OpTable g_inner;  // the entries the wrappers call (those found at installation)

// The sizes of one call as span arguments (the `shapes` option).
class ShapeArgs {
 public:
  explicit ShapeArgs(TraceScope* scope) : scope_(scope) {}
  template <class T>
  void add(const T& v) {
    using U = std::remove_cvref_t<T>;
    if constexpr (std::is_same_v<U, AttentionProblem>) {
      for (const TraceArg& a : {TraceArg{"B", v.B}, TraceArg{"NH", v.NH}, TraceArg{"KV", v.KV}, TraceArg{"Sq", v.Sq},
                                TraceArg{"Sk", v.Sk}, TraceArg{"HD", v.HD}})
        scope_->add_arg(a.key, a.value);
    } else if constexpr (std::is_same_v<U, LmHeadProblem>) {
      scope_->add_arg("T", v.T);
      scope_->add_arg("H", v.H);
      scope_->add_arg("Vl", v.Vl);
    } else if constexpr (std::is_same_v<U, int64_t>) {
      static constexpr const char* kKeys[] = {"n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7"};
      if (next_ < 8) scope_->add_arg(kKeys[next_++], v);
    }
  }

 private:
  TraceScope* scope_;
  int next_ = 0;
};

// Which FLOP count a span of the entry carries with its sizes: 1 attention forward, 2 backward.
template <auto Member>
constexpr int kAttentionFlops = 0;
template <>
constexpr int kAttentionFlops<&OpTable::attention_forward> = 1;
template <>
constexpr int kAttentionFlops<&OpTable::attention_backward> = 2;

template <class First, class... Rest>
const First& first_of(const First& f, const Rest&...) {
  return f;
}

template <auto Member, class Name, class Fn>
struct Traced;
template <auto Member, class Name, class R, class... A>
struct Traced<Member, Name, R (*)(A...)> {
  static R call(A... a) {
    if (!trace_active(TraceCategory::kKernel)) return (g_inner.*Member)(a...);
    TraceScope scope(TraceCategory::kKernel, Name::value());
    if (active_trace() && active_trace()->options().shapes) {
      ShapeArgs shapes(&scope);
      (shapes.add(a), ...);
      if constexpr (kAttentionFlops<Member> == 1) scope.add_arg("flops", attention_forward_flops(first_of(a...)));
      if constexpr (kAttentionFlops<Member> == 2) scope.add_arg("flops", attention_backward_flops(first_of(a...)));
    }
    return (g_inner.*Member)(a...);
  }
};

// GEMMs: M, N, K, the transposes and the FLOPs.
template <auto Member, class Name, class T>
void traced_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                 const T* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (!trace_active(TraceCategory::kKernel)) return (g_inner.*Member)(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb,
                                                                      beta, C, ldc);
  TraceScope scope(TraceCategory::kKernel, Name::value());
  if (active_trace() && active_trace()->options().shapes) {
    scope.add_arg("M", M);
    scope.add_arg("N", N);
    scope.add_arg("K", K);
    scope.add_arg("trans_a", trans_a);
    scope.add_arg("trans_b", trans_b);
    scope.add_arg("flops", gemm_flops(M, N, K));
  }
  (g_inner.*Member)(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

#define GALE_TRACE_ENTRY(entry)                                              \
  do {                                                                       \
    struct Name {                                                            \
      static const char* value() { return #entry; }                          \
    };                                                                       \
    ops->entry = &Traced<&OpTable::entry, Name, decltype(ops->entry)>::call; \
  } while (0)

bool traces_ops(const OpTable& ops) { return ops.impl.count("trace") != 0 && ops.impl.at("trace") == "traced"; }

void install_op_tracing(OpTable* ops) {
  if (traces_ops(*ops)) return;
  g_inner = *ops;
  {
    struct Name {
      static const char* value() { return "gemm"; }
    };
    ops->gemm = &traced_gemm<&OpTable::gemm, Name, float>;
  }
  {
    struct Name {
      static const char* value() { return "bf16_gemm"; }
    };
    ops->bf16_gemm = &traced_gemm<&OpTable::bf16_gemm, Name, bf16>;
  }
  GALE_TRACE_ENTRY(attention_forward);
  GALE_TRACE_ENTRY(attention_backward);
  GALE_TRACE_ENTRY(norm_forward);
  GALE_TRACE_ENTRY(norm_backward);
  GALE_TRACE_ENTRY(bias_dropout_add);
  GALE_TRACE_ENTRY(bias_dropout_add_backward);
  GALE_TRACE_ENTRY(bias_dropout_add_norm);
  GALE_TRACE_ENTRY(dropout);
  GALE_TRACE_ENTRY(gelu_forward);
  GALE_TRACE_ENTRY(gelu_backward);
  GALE_TRACE_ENTRY(gelu_tanh_forward);
  GALE_TRACE_ENTRY(gelu_tanh_backward);
  GALE_TRACE_ENTRY(squared_relu_forward);
  GALE_TRACE_ENTRY(squared_relu_backward);
  GALE_TRACE_ENTRY(swiglu_forward);
  GALE_TRACE_ENTRY(swiglu_backward);
  GALE_TRACE_ENTRY(glu_forward);
  GALE_TRACE_ENTRY(glu_backward);
  GALE_TRACE_ENTRY(rope_forward);
  GALE_TRACE_ENTRY(rope_backward);
  GALE_TRACE_ENTRY(dsa_sparse_attention_forward);
  GALE_TRACE_ENTRY(dsa_sparse_attention_backward);
  GALE_TRACE_ENTRY(embedding_forward);
  GALE_TRACE_ENTRY(embedding_backward);
  GALE_TRACE_ENTRY(lm_head_loss_forward);
  GALE_TRACE_ENTRY(lm_head_loss_backward);
  GALE_TRACE_ENTRY(adamw_step);
  GALE_TRACE_ENTRY(ema_adamw_step);
  GALE_TRACE_ENTRY(sum_of_squares);
  ops->impl["trace"] = "traced";
}

#undef GALE_TRACE_ENTRY

}  // namespace gale
