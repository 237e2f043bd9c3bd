// --auto-settings' search over the target's layouts.
#include "train/auto_settings_search.h"

#include <algorithm>

#include "core/status.h"

namespace gale {

std::string layout_exclusion(const AutoSearchSpace& s, const AutoLayout& l) {
  if (s.num_attention_heads % l.tp != 0)
    return str_cat("TP ", l.tp, " does not divide the ", s.num_attention_heads, " attention heads");
  if (s.num_query_groups % l.tp != 0) return str_cat("TP ", l.tp, " does not divide the ", s.num_query_groups, " query groups");
  if (s.ffn_hidden_size % l.tp != 0) return str_cat("TP ", l.tp, " does not divide the FFN size ", s.ffn_hidden_size);
  if (s.num_layers % l.pp != 0) return str_cat("PP ", l.pp, " does not divide the ", s.num_layers, " layers");
  if (l.pp > 1 && s.num_layers / l.pp < 1) return str_cat("PP ", l.pp, " leaves a stage without layers");
  if (l.cp > 1) {
    if (s.cp_algo == "ulysses_cp_algo") {
      if ((s.num_attention_heads / l.tp) % l.cp != 0)
        return str_cat("Ulysses CP ", l.cp, " does not divide the ", s.num_attention_heads / l.tp, " heads per TP rank");
    } else if (s.seq_length % (2 * l.cp) != 0) {
      return str_cat("CP ", l.cp, ": the sequence length ", s.seq_length, " is not a multiple of 2·CP");
    }
  }
  if (s.global_batch_size % (s.micro_batch_size * l.dp) != 0)
    return str_cat("the global batch ", s.global_batch_size, " is not a multiple of micro-batch ", s.micro_batch_size,
                   " × DP ", l.dp);
  return "";
}

AutoSearchResult search_layouts(const AutoModels& m, const AutoSearchSpace& s) {
  AutoSearchResult out;
  const int64_t w = s.world_size;
  for (int64_t tp = 1; tp <= w; ++tp) {
    if (w % tp) continue;
    for (int64_t cp = 1; cp <= w / tp; ++cp) {
      if ((w / tp) % cp) continue;
      for (int64_t pp = 1; pp <= w / (tp * cp); ++pp) {
        if ((w / (tp * cp)) % pp) continue;
        AutoLayout l{tp, cp, pp, w / (tp * cp * pp)};
        const std::string why = layout_exclusion(s, l);
        if (!why.empty()) {
          out.excluded.push_back(str_cat("tp=", tp, " cp=", cp, " pp=", pp, " dp=", l.dp, ": ", why));
          continue;
        }
        AutoCandidate c{l, predict(m, l), false};
        c.fits = c.prediction.peak_bytes <= s.memory_limit_bytes;
        (c.fits ? out.ranked : out.over_memory).push_back(c);
      }
    }
  }
  std::sort(out.ranked.begin(), out.ranked.end(), [](const AutoCandidate& a, const AutoCandidate& b) {
    if (a.prediction.step_seconds != b.prediction.step_seconds) return a.prediction.step_seconds < b.prediction.step_seconds;
    if (a.prediction.peak_bytes != b.prediction.peak_bytes) return a.prediction.peak_bytes < b.prediction.peak_bytes;
    if (a.layout.tp != b.layout.tp) return a.layout.tp < b.layout.tp;
    return a.layout.pp < b.layout.pp;
  });
  std::sort(out.over_memory.begin(), out.over_memory.end(), [](const AutoCandidate& a, const AutoCandidate& b) {
    return a.prediction.peak_bytes < b.prediction.peak_bytes;
  });
  return out;
}

}  // namespace gale
