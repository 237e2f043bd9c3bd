// Megatron main's unified --hybrid-layer-pattern: '|' between pipeline stages, '/' before MTP depths.
//
// Format (Megatron-LM main, megatron/core/models/hybrid/hybrid_layer_allocation.py):
//   "<main>/<mtp>/<mtp>/..."
// The main pattern holds one layer symbol per decoder layer (model/hybrid_layers.h: M G * + D - E)
// and may hold '|' between pipeline segments: "M-M-|M-M*-" puts "M-M-" on the first segment and
// "M-M*-" on the second. Segment k belongs to pipeline rank k mod PP, virtual stage k / PP (more
// segments than PP ranks: a virtual pipeline). Segments may be empty. Each "/<mtp>" after the main
// pattern is one multi-token-prediction depth; all of them must be the same symbols, without '|'.
// "M*M*/" and "M*M*//" (nothing after the separators) have no MTP.
//
// Errors are Megatron's (symbols not in the set, '*' with '+' or 'D' in one pattern, MTP depths that
// differ, segments not divisible among the pipeline ranks), each one line naming the flag.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

inline constexpr char kHybridPipe = '|';
inline constexpr char kHybridMtpSeparator = '/';

// A parsed --hybrid-layer-pattern.
struct HybridLayerPattern {
  std::string main;                 // the decoder's pattern as written, '|' included ("" when none)
  std::vector<std::string> stages;  // `main` split at '|': one entry (maybe empty) per pipeline segment
  std::string layers;               // `main` without '|': one symbol per decoder layer
  std::string mtp;                  // one MTP depth's symbols ("" without MTP)
  int64_t mtp_depths = 0;           // the number of MTP depths (0 without MTP)
};

// Parses `text` as Megatron's parse_hybrid_pattern, checking the main pattern first (as Megatron's
// get_hybrid_total_layer_count does) and then the MTP depths. `flag` names the flag in errors.
StatusOr<HybridLayerPattern> parse_hybrid_layer_pattern(const std::string& text, const std::string& flag);

// True when `text` holds a '|' or '/' separator (the unified format rather than one symbol per layer).
bool has_hybrid_separators(const std::string& text);

// True when the main pattern of `text` (before the first '/') holds a '|'.
bool has_hybrid_pipes(const std::string& text);

// The decoder layer symbols of `text`: the part before the first '/', without '|' (for a plain
// pattern, `text` itself). No checks.
std::string hybrid_pattern_layers(const std::string& text);

// The MTP depths of `text` (its "/<mtp>" blocks; 0 without any, or when `text` does not parse).
int64_t hybrid_pattern_mtp_depths(const std::string& text);

// The symbols of all MTP depths of `text`, depth after depth (global layer order after the
// decoder's; "" without MTP, or when `text` does not parse).
std::string hybrid_pattern_mtp_layers(const std::string& text);

// The decoder layers of every [pipeline rank][virtual stage] for `pp` pipeline ranks, from the
// segments of a pattern holding '|' (Megatron's select_pipeline_segment): segment k = v·PP + r is
// virtual stage v of rank r, so the segment count must be a multiple of `pp` (Megatron's error
// otherwise); the virtual stages per rank are segments / PP.
StatusOr<std::vector<std::vector<int64_t>>> hybrid_pattern_stage_layers(const HybridLayerPattern& pattern, int64_t pp,
                                                                        const std::string& flag);

}  // namespace gale
