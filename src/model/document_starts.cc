// Each activation row's document start (model/document_starts.h).
#include "model/document_starts.h"

#include "core/check.h"

namespace gale {

std::vector<int32_t> document_starts(const int32_t* document_ids, int64_t B, int64_t S) {
  std::vector<int32_t> starts(static_cast<size_t>(S * B), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* doc = document_ids + b * S;
    int32_t start = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (s > 0 && doc[s] != doc[s - 1]) start = static_cast<int32_t>(s);
      starts[static_cast<size_t>(s * B + b)] = start;
    }
  }
  return starts;
}

std::vector<int32_t> scan_document_starts(const MicroBatch& mb) {
  if (!mb.packed_sequences || mb.document_ids.empty()) return {};
  const int64_t S = mb.global_length();
  const std::vector<int32_t>& ids = mb.key_document_ids.empty() ? mb.document_ids : mb.key_document_ids;
  GALE_CHECK_EQ(static_cast<int64_t>(ids.size()), mb.B * S) << "packed sequences: document ids of the whole sequences";
  return document_starts(ids.data(), mb.B, S);
}

}  // namespace gale
