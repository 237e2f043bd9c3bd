// --phase-transition-iterations: parsing, the phase of an iteration, its data offset.
#include "train/phase_transitions.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "ckpt/checkpoint_layout.h"
#include "train/arguments.h"

namespace gale {

StatusOr<std::vector<int64_t>> parse_phase_transition_iterations(const std::string& text) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    item = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    errno = 0;
    char* end = nullptr;
    const long long v = item.empty() ? 0 : std::strtoll(item.c_str(), &end, 10);
    if (item.empty() || errno != 0 || *end != '\0')
      return InvalidArgument("--phase-transition-iterations: expected comma-separated integers (iterations), found '",
                             item, "' in '", text, "'");
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  return out;
}

PhaseSpan phase_at(const std::vector<int64_t>& transitions, int64_t iteration, int64_t global_batch_size,
                   int64_t train_samples) {
  // Megatron: boundaries [0] + [t·G for t in transitions] + [train_samples].
  std::vector<int64_t> boundaries = {0};
  for (int64_t t : transitions) boundaries.push_back(t * global_batch_size);
  boundaries.push_back(train_samples);
  const int64_t current = iteration * global_batch_size;
  PhaseSpan p;
  p.first_sample = 0;
  bool has_next = false;
  int64_t next = 0;
  for (int64_t s : boundaries) {
    if (s <= current) p.first_sample = std::max(p.first_sample, s);
    if (s > current && (!has_next || s < next)) {
      next = s;
      has_next = true;
    }
  }
  p.end_sample = has_next ? next : p.first_sample;
  for (int64_t t : transitions)
    if (t <= iteration) p.first_iteration = std::max(p.first_iteration, t);
  return p;
}

bool is_phase_transition(const std::vector<int64_t>& transitions, int64_t iteration) {
  return std::find(transitions.begin(), transitions.end(), iteration) != transitions.end();
}

int64_t phase_sample_offset(const std::vector<int64_t>& transitions, int64_t iteration,
                            int64_t consumed_train_samples, int64_t global_batch_size) {
  int64_t last = 0;
  for (int64_t t : transitions)
    if (t <= iteration) last = std::max(last, t);
  return consumed_train_samples - (iteration - last) * global_batch_size;
}

StatusOr<int64_t> phase_resume_iteration_hint(const Arguments& a) {
  const CheckpointArgs& c = a.checkpoint;
  if (c.override_ckpt_iteration != kUnset) return c.override_ckpt_iteration;
  if (c.finetune || c.load.empty()) return int64_t{0};
  if (c.ckpt_step != kUnset) return c.ckpt_step;
  StatusOr<TrackerValue> tracker = read_tracker(c.load);
  if (!tracker.ok()) {
    if (tracker.status().code() == StatusCode::kNotFound) return int64_t{0};
    return tracker.status();
  }
  return tracker->release ? int64_t{0} : tracker->iteration;
}

}  // namespace gale
