// The features manager: every feature, their flags, and which are active for a command line.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "features/feature.h"

namespace gale {

class FeatureRegistry {
 public:
  void add(std::unique_ptr<Feature> feature);
  const std::vector<std::unique_ptr<Feature>>& features() const { return features_; }
  const Feature* find(const std::string& name) const;

  // Registers --optimization-level and every feature's flags on `parser`.
  void register_args(ArgParser& parser);
  int optimization_level() const { return optimization_level_; }

  // Decides every feature's status for this command line. Returns the first validation error
  // (requirements or conflicts of a requested feature). `notices` receives one line per requested
  // feature that is inactive and why (never silently ignored).
  Status resolve(const FeatureContext& ctx, std::vector<std::string>* notices);
  const std::vector<FeatureStatus>& statuses() const { return statuses_; }
  bool active(const std::string& name) const;

  // Applies every active feature to the engine, in registry order.
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const;

  // The `gale features` table, and the Markdown of docs/features.md.
  std::string format_table() const;
  std::string format_markdown() const;

 private:
  std::vector<std::unique_ptr<Feature>> features_;
  std::vector<FeatureStatus> statuses_;
  int optimization_level_ = 2;
};

// "implemented", "not supported yet" (planned) or "not applicable (Ascend/PyTorch only)".
std::string implementation_status(const Feature& f);

// A registry holding every Gale feature (the build lists src/features/feature_*.cc).
std::unique_ptr<FeatureRegistry> make_feature_registry();

// The context for a parsed command line: level from the registry, the CPU's ISA.
FeatureContext make_feature_context(const Arguments& args, const ArgParser& parser, const FeatureRegistry& registry);

}  // namespace gale
