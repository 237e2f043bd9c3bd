// Feature resolution, application and reports.
#include "features/registry.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "kernels/cpu/isa.h"

namespace gale {

const char* feature_module_name(FeatureModule m) {
  switch (m) {
    case FeatureModule::kMegatron: return "megatron";
    case FeatureModule::kParallel: return "parallel";
    case FeatureModule::kMemory: return "memory";
    case FeatureModule::kFusedCompute: return "fused compute";
    case FeatureModule::kCommunication: return "communication";
    case FeatureModule::kKeyScenarios: return "key scenarios";
    case FeatureModule::kMultimodal: return "multimodal";
  }
  return "?";
}

std::string implementation_status(const Feature& f) {
  if (f.implemented()) return "implemented";
  return f.not_available_reason().empty() ? "not supported yet" : "not applicable (Ascend/PyTorch only)";
}

void FeatureRegistry::add(std::unique_ptr<Feature> feature) {
  GALE_CHECK(find(feature->name()) == nullptr) << "feature " << feature->name() << " registered twice";
  features_.push_back(std::move(feature));
  // Keep the registry ordered by module, then level, then name: the order of reports and docs,
  // and of apply().
  std::stable_sort(features_.begin(), features_.end(), [](const auto& a, const auto& b) {
    if (a->module() != b->module()) return a->module() < b->module();
    if (a->level() != b->level()) return a->level() < b->level();
    return a->name() < b->name();
  });
}

const Feature* FeatureRegistry::find(const std::string& name) const {
  for (const auto& f : features_)
    if (f->name() == name) return f.get();
  return nullptr;
}

void FeatureRegistry::register_args(ArgParser& parser) {
  parser.group("features (MindSpeed)");
  parser.add("--optimization-level", &optimization_level_,
             "0: plain reference engine; 1: + always-safe fused/vectorised kernels; 2 (default): + acceleration "
             "features, each enabled by its own flag");
  for (const auto& f : features_) {
    parser.group(str_cat("features (MindSpeed): ", feature_module_name(f->module())));
    if (f->implemented()) {
      f->register_args(parser);
      continue;
    }
    std::vector<std::string> flags = f->sub_flags();
    if (!f->flag().empty()) flags.insert(flags.begin(), f->flag());
    const std::string why = f->not_available_reason();
    for (const std::string& flag : flags) {
      if (why.empty())
        parser.add_unsupported(flag, f->description());
      else
        parser.add_rejected(flag, "not available in Gale (" + why + ")");
    }
  }
}

Status FeatureRegistry::resolve(const FeatureContext& ctx, std::vector<std::string>* notices) {
  if (optimization_level_ < 0 || optimization_level_ > 2)
    return InvalidArgument("--optimization-level: expected 0, 1 or 2, found ", optimization_level_);
  statuses_.assign(features_.size(), FeatureStatus{});
  Status first_error;
  for (size_t i = 0; i < features_.size(); ++i) {
    const Feature& f = *features_[i];
    FeatureStatus& st = statuses_[i];
    if (!f.implemented()) {
      st.why = implementation_status(f);
      continue;
    }
    const bool req = f.requested(ctx);
    const bool flag_given = !f.flag().empty() && ctx.parser->was_set(f.flag());
    if (f.level() > ctx.optimization_level) {
      st.why = str_cat("needs --optimization-level ", f.level(), " (given ", ctx.optimization_level, ")");
      if (flag_given && req) notices->push_back(str_cat(f.flag(), " is not active: it ", st.why));
      continue;
    }
    if (!req) {
      st.why = f.not_requested_reason(ctx);
      continue;
    }
    if (Status v = f.validate(ctx); !v.ok()) {
      st.why = "invalid: " + v.message();
      if (first_error.ok()) first_error = v;
      continue;
    }
    std::string why;
    if (!f.applicable(ctx, &why)) {
      st.why = why;
      if (flag_given) notices->push_back(str_cat(f.flag(), " is not active: ", why));
      continue;
    }
    st.active = true;
  }
  return first_error;
}

bool FeatureRegistry::active(const std::string& name) const {
  for (size_t i = 0; i < features_.size() && i < statuses_.size(); ++i)
    if (features_[i]->name() == name) return statuses_[i].active;
  return false;
}

Status FeatureRegistry::apply(const FeatureContext& ctx, EngineSetup& setup) const {
  for (size_t i = 0; i < features_.size(); ++i)
    if (i < statuses_.size() && statuses_[i].active) GALE_RETURN_IF_ERROR(features_[i]->apply(ctx, setup));
  return Status::Ok();
}

std::string FeatureRegistry::format_table() const {
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%-14s %-5s %-52s %s\n", "module", "level", "feature (flag)", "status");
  os << buf;
  for (size_t i = 0; i < features_.size(); ++i) {
    const Feature& f = *features_[i];
    std::string label = f.flag().empty()              ? f.name()
                        : f.flag() == "--" + f.name() ? f.flag()
                                                      : f.name() + " (" + f.flag() + ")";
    std::string status = "?";
    if (i < statuses_.size()) {
      const FeatureStatus& st = statuses_[i];
      status = st.active ? (st.why.empty() ? "active" : "active (" + st.why + ")") : "inactive: " + st.why;
    }
    std::snprintf(buf, sizeof buf, "%-14s %-5d %-52s %s\n", feature_module_name(f.module()), f.level(), label.c_str(),
                  status.c_str());
    os << buf;
  }
  return os.str();
}

std::string FeatureRegistry::format_markdown() const {
  std::ostringstream os;
  os << "# Gale features\n\n"
     << "Generated by `gale features --markdown` from the feature registry (`src/features/`); a test keeps\n"
     << "this file equal to that output, so it cannot drift. `gale features [--optimization-level N] [flags]`\n"
     << "shows which are active for a given command line.\n\n"
     << "Levels (MindSpeed's `--optimization-level`, default 2): **0** the plain reference engine; **1** adds\n"
     << "the always-safe fused and vectorised rewrites; **2** adds acceleration features, each enabled by its\n"
     << "own flag.\n\n"
     << "Status: **implemented**; **not supported yet** (planned: its flags are known and refused with that\n"
     << "reason); **not applicable (Ascend/PyTorch only)** (MindSpeed features that tune Ascend NPUs, their\n"
     << "networks and tools, or PyTorch itself: their flags are refused as \"not available in Gale\" with the\n"
     << "reason). MindSpeed flags that change nothing in Gale (e.g. `--use-cp-send-recv-overlap`: Gale's ring\n"
     << "always overlaps) are accepted with a start-up note; `gale pretrain --help` lists them.\n\n"
     << "| Feature | Flag | Module | Level | MindSpeed / Megatron counterpart | Status in Gale | What it does |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const auto& f : features_) {
    os << "| " << f->name() << " | " << (f->flag().empty() ? "—" : "`" + f->flag() + "`") << " | "
       << feature_module_name(f->module()) << " | " << f->level() << " | " << f->counterpart() << " | "
       << implementation_status(*f) << " | " << f->description()
       << (f->not_available_reason().empty() ? "" : " (" + f->not_available_reason() + ")") << " |\n";
  }
  return os.str();
}

FeatureContext make_feature_context(const Arguments& args, const ArgParser& parser, const FeatureRegistry& registry) {
  FeatureContext ctx;
  ctx.args = &args;
  ctx.parser = &parser;
  ctx.optimization_level = registry.optimization_level();
  ctx.cpu_isa = isa_name(detected_isa());
  return ctx;
}

}  // namespace gale
