// One parallel layout of a model against the single-process run of the same model: the shared body
// of the invariance suites parameterised by (layout, model variant) (MLA, QK-layernorm, MTP, Muon,
// sliding window, ALiBi).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/fused_ops.h"
#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/grad_sync.h"

namespace gale::testing {

// The reference ops, with the fused (flash) attention kernel when `flash`.
inline OpTable attention_ops(bool flash) {
  OpTable ops = reference_ops();
  if (flash) GALE_CHECK_OK(install_fused_kernel(ops, "attention", Isa::kAvx512));
  return ops;
}

// `model` plus the layout's flags that change the model rather than how it is spread over ranks
// (--reset-attention-mask, --num-layers N, --sliding-window W): what the single-process reference of
// that layout must run.
inline std::vector<std::string> reference_flags(const std::vector<std::string>& model, const Layout& layout) {
  std::vector<std::string> flags = model;
  if (std::find(layout.flags.begin(), layout.flags.end(), "--reset-attention-mask") != layout.flags.end())
    flags.push_back("--reset-attention-mask");
  for (const char* valued : {"--num-layers", "--sliding-window"}) {
    const auto it = std::find(layout.flags.begin(), layout.flags.end(), valued);
    if (it != layout.flags.end() && it + 1 != layout.flags.end()) flags.insert(flags.end(), it, it + 2);
  }
  return flags;
}

// The single-process run of `flags` (with flash attention when `flash`) trained `iterations` steps;
// made once per (flags, flash) and kept for the rest of the test program.
inline const TestRun& single_process_run(const std::vector<std::string>& flags, bool flash, int iterations) {
  static std::map<std::pair<std::vector<std::string>, bool>, std::unique_ptr<TestRun>> runs;
  std::unique_ptr<TestRun>& run = runs[{flags, flash}];
  if (!run) {
    run = std::make_unique<TestRun>(flags, make_self_communicator("world"), kTinyVocab, EngineOptions{},
                                    attention_ops(flash));
    run->train(iterations);
  }
  return *run;
}

// `model` under `layout` on the test's world, trained `iterations` steps (parameters gathered), and
// the single-process run it must reproduce. The caller skips layouts of another world size.
struct LayoutAndReference {
  std::unique_ptr<TestRun> run;
  const TestRun* reference = nullptr;
};
inline LayoutAndReference train_layout_and_reference(const std::vector<std::string>& model, const Layout& layout,
                                                     int iterations) {
  LayoutAndReference out;
  out.reference = &single_process_run(reference_flags(model, layout), layout.flash_attention, iterations);
  out.run = std::make_unique<TestRun>(join({model, layout.flags}), test::world(), kTinyVocab,
                                      EngineOptions{layout.bucket_size, layout.recompute},
                                      attention_ops(layout.flash_attention));
  out.run->train(iterations);
  finish_param_sync(*out.run->engine);
  return out;
}

// The whole check of layout `name` of `layouts` for `model`: skipped when the test's world has
// another size, else trained 5 steps beside its single-process reference, which it must reproduce
// (expect_matches_reference: losses and grad norms, parameters, gradients within `grad_tolerance`,
// `probe` a parameter whose gradient must be among those compared).
inline void expect_layout_matches_single_process(const std::vector<Layout>& layouts, const std::string& name,
                                                 const std::vector<std::string>& model, double grad_tolerance,
                                                 const std::string& probe) {
  const Layout* layout = find_layout(layouts, name);
  ASSERT_NE(layout, nullptr) << name;
  if (layout->world != test::world()->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  LayoutAndReference t = train_layout_and_reference(model, *layout, 5);
  EXPECT_GT(expect_matches_reference(*t.run, *t.reference, 5, grad_tolerance, probe), 0);
}

}  // namespace gale::testing
