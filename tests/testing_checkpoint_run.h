// A TestRun that saves and loads checkpoints (its flags' --save / --load) and reports its
// parameters as bits: the shared part of the resume, optimizer-state and sharding tests.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "testing_run.h"
#include "train/checkpointing.h"
#include "train/grad_sync.h"

namespace gale::testing {

// The bits of `run`'s first chunk's flat parameters (after any pending parameter all-gather).
inline std::vector<uint32_t> param_bits(const TestRun& run) {
  finish_param_sync(*run.engine);
  const Tensor& p = run.engine->chunks[0]->params().flat_params();
  std::vector<uint32_t> out(static_cast<size_t>(p.numel()));
  std::memcpy(out.data(), p.data<float>(), out.size() * sizeof(float));
  return out;
}

class CheckpointRun : public TestRun {
 public:
  using TestRun::TestRun;
  // Saves a checkpoint of the current iteration to --save.
  Status save() { return save_checkpoint(args, *engine, trainer->state()); }
  // Loads --load's checkpoint; NotFound when there is none.
  Status load() {
    bool loaded = false;
    GALE_RETURN_IF_ERROR(load_checkpoint(args, *engine, trainer->state(), &loaded));
    return loaded ? Status::Ok() : NotFound("no checkpoint in ", args.checkpoint.load);
  }
  std::vector<uint32_t> values() const { return param_bits(*this); }
};

}  // namespace gale::testing
