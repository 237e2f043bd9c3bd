// The rules MindSpeed's two RiPipe features share (--recompute-in-advance, --recompute-in-bubble): exclusive, and only under the interleaved pipeline schedule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "train/arguments.h"

namespace gale {

// `flag` is the RiPipe flag being validated ("--recompute-in-advance" or "--recompute-in-bubble").
inline Status validate_ripipe_schedule(const Arguments& a, const std::string& flag) {
  if (a.model.recompute_in_advance && a.model.recompute_in_bubble)
    return InvalidArgument("--recompute-in-advance and --recompute-in-bubble are exclusive (as MindSpeed): advance "
                           "speeds up full recomputation, bubble adds recomputation where there is none");
  if (a.parallel.pipeline_model_parallel_size <= 1 || a.parallel.virtual_pipeline_model_parallel_size <= 1 ||
      a.parallel.schedules_method == "dualpipev")
    return InvalidArgument(flag, ": needs the interleaved pipeline schedule (--pipeline-model-parallel-size > 1 with "
                           "--num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, without "
                           "--schedules-method dualpipev), found pipeline size ",
                           a.parallel.pipeline_model_parallel_size, " with ",
                           std::max<int64_t>(1, a.parallel.virtual_pipeline_model_parallel_size),
                           " virtual stage(s) per rank", a.parallel.schedules_method.empty() ? "" : " (dualpipev)");
  return Status::Ok();
}

}  // namespace gale
