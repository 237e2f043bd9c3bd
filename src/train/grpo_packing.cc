// GRPO's training rows, unpacked or packed into bins (train/grpo_packing.h).
#include "train/grpo_packing.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"

namespace gale {

std::vector<int64_t> grpo_sequence_lengths(const GrpoRollouts& r, int32_t pad) {
  const int64_t S = r.seq_length;
  std::vector<int64_t> lengths(static_cast<size_t>(r.rows), 0);
  for (int64_t row = 0; row < r.rows; ++row)
    for (int64_t s = S; s > 0; --s)
      if (r.tokens[row * S + s - 1] != pad) {
        lengths[row] = s;
        break;
      }
  return lengths;
}

namespace {

// Empty rows of S positions: pad tokens, loss 0, position ids 0..S−1 (packed: 0, as Megatron's bins
// outside their rollouts and its empty bins).
GrpoTrainingRows empty_rows(int64_t rows, int64_t S, int32_t pad, bool inference, bool packed) {
  GrpoTrainingRows t;
  t.rows = rows;
  t.S = S;
  const size_t n = static_cast<size_t>(rows * S);
  t.tokens.assign(n, pad);
  t.position_ids.assign(n, 0);
  if (!packed)
    for (size_t i = 0; i < n; ++i) t.position_ids[i] = static_cast<int32_t>(i % static_cast<size_t>(S));
  if (packed) t.document_ids.assign(n, 0);
  t.loss_mask.assign(n, 0.0f);
  if (inference) t.inference_logprobs.assign(n, 0.0);
  t.advantages.assign(n, 0.0);
  t.members.resize(static_cast<size_t>(rows));
  return t;
}

// Rollout `from`'s first `length` positions into row `to` of `t` from position `start`.
void place(const GrpoRollouts& r, int64_t from, int64_t length, GrpoTrainingRows& t, int64_t to, int64_t start,
           int32_t document) {
  const int64_t S = r.seq_length;
  for (int64_t s = 0; s < length; ++s) {
    const int64_t i = to * S + start + s, j = from * S + s;
    t.tokens[i] = r.tokens[j];
    t.position_ids[i] = static_cast<int32_t>(s);
    if (!t.document_ids.empty()) t.document_ids[i] = document;
    t.loss_mask[i] = r.loss_mask[j];
    if (!t.inference_logprobs.empty()) t.inference_logprobs[i] = r.inference_logprobs[j];
    t.advantages[i] = r.advantages[from];
  }
  t.members[to].push_back(from);
}

}  // namespace

GrpoTrainingRows grpo_unpacked_rows(const GrpoRollouts& r, int64_t dp, int64_t dp_rank) {
  GALE_CHECK(dp > 0 && r.rows % dp == 0 && dp_rank >= 0 && dp_rank < dp) << r.rows << " rows over " << dp;
  const int64_t local = r.rows / dp, S = r.seq_length;
  GrpoTrainingRows t = empty_rows(local, S, 0, !r.inference_logprobs.empty(), /*packed=*/false);
  for (int64_t row = 0; row < local; ++row) place(r, dp_rank * local + row, S, t, row, 0, 0);
  return t;
}

StatusOr<GrpoTrainingRows> grpo_packed_rows(const GrpoRollouts& r, int32_t pad, const GrpoPackingOptions& o, int64_t dp,
                                            int64_t dp_rank) {
  const int64_t S = r.seq_length;
  if (o.max_sequences_per_bin < 1)
    return InvalidArgument("--rl-sequence-packing-max-sequences-per-bin: expected a positive number, found ",
                           o.max_sequences_per_bin);
  if (o.algo != "fifo" && o.algo != "round-robin")
    return InvalidArgument("--rl-sequence-packing-algo: expected fifo or round-robin, found '", o.algo, "'");
  const int64_t multiple = o.seq_length_multiple;
  if (multiple < 1 || S % multiple != 0)
    return InvalidArgument("--seq-length ", S, ": expected a multiple of ", multiple,
                           " (2 x --context-parallel-size: each packed rollout's slot splits over the cp ranks)");
  const std::vector<int64_t> lengths = grpo_sequence_lengths(r, pad);
  auto slot = [&](int64_t row) { return (lengths[row] + multiple - 1) / multiple * multiple; };
  std::vector<int64_t> order(static_cast<size_t>(r.rows));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  // Next-fit into bins of S positions.
  std::vector<std::vector<int64_t>> bins;
  int64_t used = 0;
  for (int64_t row : order) {
    if (slot(row) > S) return Internal("a GRPO rollout of ", lengths[row], " tokens does not fit --seq-length ", S);
    if (bins.empty() || used + slot(row) > S || static_cast<int64_t>(bins.back().size()) >= o.max_sequences_per_bin) {
      bins.emplace_back();
      used = 0;
    }
    bins.back().push_back(row);
    used += slot(row);
  }
  const int64_t num_bins = static_cast<int64_t>(bins.size());
  // This rank's bins, padded with empty ones to ceil(num_bins / DP).
  std::vector<int64_t> mine;
  if (o.algo == "round-robin") {
    for (int64_t b = dp_rank; b < num_bins; b += dp) mine.push_back(b);
  } else {
    const int64_t per = num_bins / dp, extra = num_bins % dp;
    const int64_t first = dp_rank < extra ? dp_rank * (per + 1) : dp_rank * per + extra;
    const int64_t count = per + (dp_rank < extra ? 1 : 0);
    for (int64_t b = first; b < first + count; ++b) mine.push_back(b);
  }
  const int64_t rows = (num_bins + dp - 1) / dp;
  GrpoTrainingRows t = empty_rows(rows, S, pad, !r.inference_logprobs.empty(), /*packed=*/true);
  for (size_t k = 0; k < mine.size(); ++k) {
    const int64_t to = static_cast<int64_t>(k);
    int64_t start = 0;
    int32_t document = 0;
    for (int64_t row : bins[static_cast<size_t>(mine[k])]) {
      place(r, row, lengths[row], t, to, start, document);
      for (int64_t s = start + lengths[row]; s < start + slot(row); ++s) t.document_ids[to * S + s] = document;
      ++document;
      start += slot(row);
    }
    for (int64_t s = start; s < S; ++s) t.document_ids[to * S + s] = document;  // the tail: a document of its own
  }
  t.total_bins = num_bins;
  t.min_per_bin = r.rows;
  for (const auto& b : bins) {
    t.min_per_bin = std::min<int64_t>(t.min_per_bin, static_cast<int64_t>(b.size()));
    t.max_per_bin = std::max<int64_t>(t.max_per_bin, static_cast<int64_t>(b.size()));
  }
  t.mean_per_bin = num_bins > 0 ? static_cast<double>(r.rows) / static_cast<double>(num_bins) : 0.0;
  for (int64_t n : lengths) t.collection_tokens += n;
  for (const auto& members : t.members)
    for (int64_t row : members) t.rank_tokens += lengths[row];
  return t;
}

MicroBatch grpo_rows_micro_batch(const GrpoTrainingRows& t, int64_t first, int64_t n, int32_t pad, int64_t id0) {
  const int64_t S = t.S;
  GALE_CHECK(first >= 0 && n > 0 && first + n <= t.rows) << "rows " << first << " + " << n << " of " << t.rows;
  MicroBatch mb;
  mb.B = n;
  mb.S = S;
  const auto from = static_cast<std::ptrdiff_t>(first * S), to = static_cast<std::ptrdiff_t>((first + n) * S);
  mb.tokens.assign(t.tokens.begin() + from, t.tokens.begin() + to);
  mb.loss_mask.assign(t.loss_mask.begin() + from, t.loss_mask.begin() + to);
  mb.position_ids.assign(t.position_ids.begin() + from, t.position_ids.begin() + to);
  if (!t.document_ids.empty()) {
    mb.document_ids.assign(t.document_ids.begin() + from, t.document_ids.begin() + to);
    mb.packed_sequences = true;  // Megatron's packed_seq_params: the recurrent layers and MTP restart per rollout
  }
  mb.labels.resize(static_cast<size_t>(n * S));
  mb.sample_ids.resize(static_cast<size_t>(n));
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t s = 0; s < S; ++s) mb.labels[b * S + s] = s + 1 < S ? mb.tokens[b * S + s + 1] : pad;
    mb.sample_ids[b] = id0 + b;
  }
  return mb;
}

}  // namespace gale
