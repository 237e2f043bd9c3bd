// RecomputeFeature: flags, validation and the RecomputePlan it installs.
#include "features/recompute_feature.h"

#include "features/registry.h"

namespace gale {

void RecomputeFeature::register_args(ArgParser& parser) {
  parser.add_flag(flag(), &on_, s_.description);
  parser.add(num_layers_flag(), &num_layers_,
             str_cat("with ", flag(), ": only the first N layers of each model chunk (default: every layer)"));
}

bool RecomputeFeature::requested(const FeatureContext& ctx) const {
  return on_ || ctx.parser->was_set(num_layers_flag());
}

Status RecomputeFeature::validate(const FeatureContext& ctx) const {
  if (!on_) return InvalidArgument(num_layers_flag(), " requires ", flag());
  if (ctx.parser->was_set(num_layers_flag()) && num_layers_ < 1)
    return InvalidArgument(num_layers_flag(), ": expected a number of layers >= 1, found ", num_layers_);
  return Status::Ok();
}

Status RecomputeFeature::apply(const FeatureContext& ctx, EngineSetup& setup) const {
  if (setup.recompute == nullptr) return Status::Ok();  // an engine without a model (gale features)
  setup.recompute->*s_.layers = num_layers_ >= 1 ? num_layers_ : RecomputePlan::kAllLayers;
  return Status::Ok();
}

void register_recompute_feature(FeatureRegistry& registry, std::string name, std::string counterpart,
                                std::string description, int64_t RecomputePlan::*layers) {
  registry.add(std::make_unique<RecomputeFeature>(
      RecomputeFeatureSpec{std::move(name), std::move(counterpart), std::move(description), layers}));
}

}  // namespace gale
