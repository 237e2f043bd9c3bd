// Effective DDP precision settings and the fnmatch selection of fp32-local-accumulation parameters.
#include "train/ddp_precision.h"

#include <fnmatch.h>

namespace gale {

bool accumulates_grads_in_fp32(const Arguments& args) {
  const TrainingArgs& t = args.training;
  if (t.bf16) return !t.bf16_grad_reduce();
  return t.accumulate_allreduce_grads_in_fp32;
}

bool reduce_scatter_with_fp32_accumulation(const Arguments& args) {
  return args.parallel.ddp_reduce_scatter_with_fp32_accumulation && !accumulates_grads_in_fp32(args);
}

bool fnmatch_name(const std::string& name, const std::string& pattern) {
  // Python's fnmatch: no escapes, '*' crosses '.' and '/', a leading '.' is not special.
  return ::fnmatch(pattern.c_str(), name.c_str(), FNM_NOESCAPE) == 0;
}

std::vector<int> fp32_local_accumulation_params(const ParamBuffer& params, const std::vector<std::string>& patterns,
                                                std::vector<std::string>* matched) {
  std::vector<int> ids;
  if (matched) matched->clear();
  if (patterns.empty()) return ids;
  for (int id = 0; id < params.size(); ++id) {
    const ParamSpec& spec = params.spec(id);
    if (!spec.trainable) continue;
    for (const std::string& pattern : patterns)
      if (pattern == "all" || fnmatch_name(spec.name, pattern)) {
        ids.push_back(id);
        if (matched) matched->push_back(pattern);
        break;
      }
  }
  return ids;
}

}  // namespace gale
