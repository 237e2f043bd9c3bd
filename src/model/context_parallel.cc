// Context parallelism in the model: micro-batch slicing.
#include "model/context_parallel.h"

#include "core/check.h"

namespace gale {

namespace {

// Copies the local positions of each sample: out[b·S_l + s] = in[b·S + pos[s]].
template <class T>
std::vector<T> slice_rows(const std::vector<T>& in, int64_t B, int64_t S, const std::vector<int32_t>& pos) {
  if (in.empty()) return {};
  GALE_CHECK_EQ(static_cast<int64_t>(in.size()), B * S);
  const int64_t Sl = static_cast<int64_t>(pos.size());
  std::vector<T> out(static_cast<size_t>(B * Sl));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < Sl; ++s) out[b * Sl + s] = in[b * S + pos[s]];
  return out;
}

}  // namespace

MicroBatch slice_micro_batch(const MicroBatch& full, const ContextSplit& split) {
  if (split.cp_size == 1) return full;
  GALE_CHECK_EQ(full.S, split.seq_length) << "a context-parallel slice needs whole sequences";
  const std::vector<int32_t> pos = split.local_positions();
  MicroBatch mb;
  mb.B = full.B;
  mb.S = split.local_length();
  mb.S_global = full.S;
  mb.tokens = slice_rows(full.tokens, full.B, full.S, pos);
  mb.labels = slice_rows(full.labels, full.B, full.S, pos);
  mb.loss_mask = slice_rows(full.loss_mask, full.B, full.S, pos);
  mb.position_ids = slice_rows(full.position_ids, full.B, full.S, pos);
  mb.document_ids = slice_rows(full.document_ids, full.B, full.S, pos);
  mb.key_document_ids = full.document_ids;
  mb.sample_ids = full.sample_ids;
  mb.seq_positions = pos;
  return mb;
}

}  // namespace gale
