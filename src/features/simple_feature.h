// A data-described feature: name, flag, module, level and a predicate on the arguments. Used for
// features whose behaviour lives in the engine core (parallel layouts, optimizer sharding) and
// for MindSpeed features that Gale lists but does not implement yet.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "features/feature.h"

namespace gale {

struct SimpleFeatureSpec {
  std::string name, flag;
  FeatureModule module = FeatureModule::kMegatron;
  int level = 0;
  std::string counterpart, description;
  bool implemented = true;
  // Whether the command line asks for it (for level 0/1 features: whether it is in use).
  std::function<bool(const Arguments&)> requested;
  std::string not_available;           // unimplemented: why it has no place in Gale ("" = planned)
  std::vector<std::string> sub_flags;  // unimplemented: its other flags, refused likewise
};

class SimpleFeature : public Feature {
 public:
  explicit SimpleFeature(SimpleFeatureSpec spec) : s_(std::move(spec)) {}
  std::string name() const override { return s_.name; }
  std::string flag() const override { return s_.flag; }
  FeatureModule module() const override { return s_.module; }
  int level() const override { return s_.level; }
  std::string counterpart() const override { return s_.counterpart; }
  std::string description() const override { return s_.description; }
  bool implemented() const override { return s_.implemented; }
  std::string not_available_reason() const override { return s_.not_available; }
  std::vector<std::string> sub_flags() const override { return s_.sub_flags; }
  bool requested(const FeatureContext& ctx) const override { return s_.requested && s_.requested(*ctx.args); }

 private:
  SimpleFeatureSpec s_;
};

}  // namespace gale
