// Fused kernel sets per ISA, and their installation into an OpTable by op group.
#include "kernels/cpu/fused_ops.h"

#include <atomic>

namespace gale {

namespace {

FusedKernelSet build_set(Isa isa) {
  FusedKernelSet s;
  s.isa = isa_name(isa);
  switch (isa) {
    case Isa::kScalar:
      add_elementwise_kernels_scalar(&s);
      add_attention_kernels_scalar(&s);
      add_lm_head_kernels_scalar(&s);
      break;
    case Isa::kAvx2:
      add_elementwise_kernels_avx2(&s);
      add_attention_kernels_avx2(&s);
      add_lm_head_kernels_avx2(&s);
      break;
    case Isa::kAvx512:
      add_elementwise_kernels_avx512(&s);
      add_attention_kernels_avx512(&s);
      add_lm_head_kernels_avx512(&s);
      break;
  }
  return s;
}

const char* const kOps[] = {"gemm",      "norm",      "bias_dropout_add", "bias_dropout_add_norm",
                            "gelu",      "swiglu",    "geglu",            "rope",
                            "attention", "embedding", "lm_head_loss",     "adamw"};

bool known_op(const std::string& op) {
  for (const char* name : kOps)
    if (op == name) return true;
  return false;
}

Status unknown_op(const std::string& op) {
  std::string list;
  for (const char* name : kOps) list += list.empty() ? name : str_cat(", ", name);
  return InvalidArgument("fused kernel op group: expected one of ", list, ", found '", op, "'");
}

std::atomic<int64_t> lm_head_chunk_tokens{0};

}  // namespace

void set_lm_head_chunk_tokens(int64_t tokens) { lm_head_chunk_tokens.store(tokens < 0 ? 0 : tokens); }
int64_t lm_head_chunk_tokens_setting() { return lm_head_chunk_tokens.load(); }

const FusedKernelSet* fused_kernel_set(Isa isa) {
  // Built on first use, and only for the ISAs this CPU runs: the add_*_kernels_<isa> functions live in
  // files compiled with that ISA's flags, and the compiler may use its vector registers even to fill
  // a table of pointers (GCC stores them with zmm moves), so calling them on a lesser CPU is SIGILL.
  static const Isa hardware = hardware_isa();
  static const FusedKernelSet sets[3] = {
      build_set(Isa::kScalar),
      hardware >= Isa::kAvx2 ? build_set(Isa::kAvx2) : FusedKernelSet{},
      hardware >= Isa::kAvx512 ? build_set(Isa::kAvx512) : FusedKernelSet{},
  };
  if (static_cast<int>(isa) > static_cast<int>(hardware)) return nullptr;
  return &sets[static_cast<int>(isa)];
}

double fused_sum_of_squares(const float* x, int64_t n) {
  return fused_kernel_set(detected_isa())->sum_of_squares(x, n);
}

std::vector<std::string> fused_kernel_ops() { return std::vector<std::string>(std::begin(kOps), std::end(kOps)); }

std::string fused_kernel_name(const std::string& op, Isa isa) {
  return op == "gemm" ? "partitioned" : str_cat("fused-", isa_name(isa));
}

StatusOr<Isa> fused_kernel_isa(const std::string& op, Isa max_isa) {
  if (!known_op(op)) return unknown_op(op);
  return min_isa(max_isa, detected_isa());
}

Status install_fused_kernel(OpTable& table, const std::string& op, Isa max_isa) {
  GALE_ASSIGN_OR_RETURN(Isa isa, fused_kernel_isa(op, max_isa));
  const FusedKernelSet& s = *fused_kernel_set(isa);
  if (op == "gemm") {  // a threading rewrite around oneDNN, the same for every ISA
    table.gemm = sgemm_partitioned;
  } else if (op == "norm") {
    table.norm_forward = s.norm_forward;
    table.norm_backward = s.norm_backward;
  } else if (op == "bias_dropout_add") {
    table.bias_dropout_add = s.bias_dropout_add;
    table.bias_dropout_add_backward = s.bias_dropout_add_backward;
    table.dropout = s.dropout;
  } else if (op == "bias_dropout_add_norm") {
    table.bias_dropout_add_norm = s.bias_dropout_add_norm;
  } else if (op == "gelu") {
    table.gelu_forward = s.gelu_forward;
    table.gelu_backward = s.gelu_backward;
    table.glu_forward = s.glu_forward;  // --quick-geglu (bias_gelu_fusion in Megatron)
    table.glu_backward = s.glu_backward;
  } else if (op == "swiglu") {
    table.swiglu_forward = s.swiglu_forward;
    table.swiglu_backward = s.swiglu_backward;
    table.glu_forward = s.glu_forward;  // clamped / offset SwiGLU
    table.glu_backward = s.glu_backward;
  } else if (op == "geglu") {
    // No OpTable entries: the model resolves impl["geglu"] with geglu_kernels() (kernels/cpu/fused_geglu.h).
  } else if (op == "rope") {
    table.rope_forward = s.rope_forward;
    table.rope_backward = s.rope_backward;
  } else if (op == "attention") {
    table.attention_forward = s.attention_forward;
    table.attention_backward = s.attention_backward;
  } else if (op == "embedding") {
    table.embedding_forward = s.embedding_forward;
    table.embedding_backward = s.embedding_backward;
  } else if (op == "lm_head_loss") {
    table.lm_head_loss_forward = s.lm_head_loss_forward;
    table.lm_head_loss_backward = s.lm_head_loss_backward;
  } else if (op == "adamw") {
    table.adamw_step = s.adamw_step;
    table.ema_adamw_step = s.ema_adamw_step;  // --optimizer-selection fused_ema_adamw
    table.sum_of_squares = s.sum_of_squares;  // the gradient norm before the step
  }
  table.impl[op] = fused_kernel_name(op, isa);
  return Status::Ok();
}

Status install_all_fused_kernels(OpTable& table, Isa max_isa) {
  for (const char* op : kOps) GALE_RETURN_IF_ERROR(install_fused_kernel(table, op, max_isa));
  return Status::Ok();
}

}  // namespace gale
