// --profile's kernel events: every op-table entry wrapped so that each call is a span of the trace
// (core/trace.h, category kernel), named after the entry ("gemm", "bf16_gemm", "attention_forward",
// "norm_backward", ...).
//
// install_op_tracing() replaces every function-pointer entry of the table with a wrapper that, when
// kernel events are recorded (a --profile window at --profile-level level0 or above), opens a span
// around the call, and otherwise only calls the entry it replaced (one relaxed load and a branch;
// without --profile nothing is wrapped at all). With the trace's `shapes` option
// (--profile-record-shapes, or level2) a span's arguments are the call's sizes: M, N, K (and
// trans_a, trans_b) of a GEMM with its FLOPs (2·M·N·K); B, NH, KV, Sq, Sk, HD of attention with its
// FLOPs (kernels/flop_counter.h's count); T, H, Vl of the LM head; otherwise the call's integer
// arguments in order as n0, n1, ... (rows and columns for the element-wise kernels, the element
// count for the optimizer's).
//
// The wrapped entries live in one process-wide slot (as --op-cal-tflops' counting wrappers): one
// tracing table per process at a time. Install it after the features (and the FLOP counter), so
// that the wrappers wrap what runs.
#pragma once

#include "kernels/op_table.h"

namespace gale {

// Wraps every entry of `ops`; records "traced" in ops->impl["trace"].
void install_op_tracing(OpTable* ops);
// Whether the entries of `ops` are the tracing wrappers.
bool traces_ops(const OpTable& ops);

}  // namespace gale
