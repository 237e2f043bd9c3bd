// What Megatron's DDP precision flags mean for the engine: the effective
// --ddp-reduce-scatter-with-fp32-accumulation, the parameters matched by
// --ddp-param-name-patterns-for-fp32-local-accumulation (fnmatch, 'all'), and Megatron's
// accumulate-allreduce-grads-in-fp32 as its validate_args leaves it.
#pragma once

#include <string>
#include <vector>

#include "model/params.h"
#include "train/arguments.h"

namespace gale {

// Megatron's args.accumulate_allreduce_grads_in_fp32 after validate_args: under --bf16, true unless
// the gradients are reduced in bf16 (--grad-reduce-in-bf16 or --main-grads-dtype bf16); otherwise
// as given (--accumulate-allreduce-grads-in-fp32). Megatron's ddp_config.grad_reduce_in_fp32.
bool accumulates_grads_in_fp32(const Arguments& args);

// --ddp-reduce-scatter-with-fp32-accumulation as Megatron keeps it: given, and the gradients do not
// already accumulate and reduce in fp32 (Megatron then sets it to False with a warning).
bool reduce_scatter_with_fp32_accumulation(const Arguments& args);

// Python's fnmatch.fnmatch(name, pattern) on POSIX: * (any run, dots included), ?, [seq], [!seq];
// a backslash is an ordinary character.
bool fnmatch_name(const std::string& name, const std::string& pattern);

// The ids of `params`' trainable parameters whose name matches one of `patterns` ('all': every one),
// ascending (Megatron's promotion of their main_grad to fp32); `matched`, when given, receives the
// first pattern each one matched.
std::vector<int> fp32_local_accumulation_params(const ParamBuffer& params, const std::vector<std::string>& patterns,
                                                std::vector<std::string>* matched = nullptr);

}  // namespace gale
