// KernelFeature: flags, requirements and installation of fused kernels.
#include "features/kernel_feature.h"

#include "kernels/cpu/fused_ops.h"

namespace gale {

void KernelFeature::register_args(ArgParser& parser) {
  if (s_.level >= 2) {
    parser.add_flag(s_.flag, &on_, s_.description);
  } else {
    on_ = true;
    if (!s_.flag.empty()) parser.add_false(s_.flag, &on_, "switch off: " + s_.description);
  }
}

std::string KernelFeature::not_requested_reason(const FeatureContext& ctx) const {
  if (s_.level >= 2) return "not requested (" + s_.flag + ")";
  return "switched off by " + s_.flag;
}

Status KernelFeature::validate(const FeatureContext& ctx) const {
  if (s_.level >= 2 && s_.requirement_error) {
    std::string e = s_.requirement_error(*ctx.args);
    if (!e.empty()) return InvalidArgument(e);
  }
  return Status::Ok();
}

bool KernelFeature::applicable(const FeatureContext& ctx, std::string* why) const {
  if (s_.not_applicable) {
    std::string reason = s_.not_applicable(*ctx.args);
    if (!reason.empty()) {
      *why = reason;
      return false;
    }
  }
  return true;
}

Status KernelFeature::apply(const FeatureContext& ctx, EngineSetup& setup) const {
  for (const std::string& op : s_.ops) GALE_RETURN_IF_ERROR(install_fused_kernel(*setup.ops, op, Isa::kAvx512));
  return Status::Ok();
}

}  // namespace gale
