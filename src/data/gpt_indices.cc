// GPTDataset document / sample / shuffle indices.
#include "data/gpt_indices.h"

#include <cmath>
#include <numeric>

#include "data/numpy_random.h"

namespace gale {

int64_t gpt_num_epochs(int64_t tokens_per_epoch, const GptIndexParams& p) {
  if (p.num_samples < 0) return 1;
  int64_t requested = p.num_samples * p.seq_length + p.add_extra_token;
  if (tokens_per_epoch <= 0) return 0;  // caller reports the empty split
  int64_t e = (requested + tokens_per_epoch - 1) / tokens_per_epoch;
  return e < 1 ? 1 : e;
}

bool gpt_separate_final_epoch(int64_t num_epochs, int64_t tokens_per_epoch, const GptIndexParams& p) {
  if (num_epochs <= 1) return false;
  int64_t sans = ((num_epochs - 1) * tokens_per_epoch - p.add_extra_token) / p.seq_length;
  int64_t from_final = p.num_samples - sans;
  int64_t per = (tokens_per_epoch - p.add_extra_token) / p.seq_length;
  // Python: int(0.80 * per) truncates a float64 product.
  return from_final < static_cast<int64_t>(0.80 * static_cast<double>(per));
}

std::vector<int32_t> build_document_index(std::span<const int32_t> documents, int64_t num_epochs, NumpyRandomState& rng,
                                          bool separate_final_epoch) {
  if (!separate_final_epoch || num_epochs == 1) {
    std::vector<int32_t> out;
    out.reserve(documents.size() * static_cast<size_t>(num_epochs));
    for (int64_t e = 0; e < num_epochs; ++e) out.insert(out.end(), documents.begin(), documents.end());
    rng.shuffle(out.data(), static_cast<int64_t>(out.size()));
    return out;
  }
  std::vector<int32_t> first = build_document_index(documents, num_epochs - 1, rng, false);
  std::vector<int32_t> last = build_document_index(documents, 1, rng, false);
  first.insert(first.end(), last.begin(), last.end());
  return first;
}

std::vector<int64_t> build_sample_index(const UnalignedArray<int32_t>& sizes, std::span<const int32_t> document_index,
                                        int64_t seq_length, int64_t num_epochs, int64_t tokens_per_epoch,
                                        bool drop_last, int add_extra_token) {
  int64_t num_samples;
  if (drop_last) {
    num_samples = (num_epochs * tokens_per_epoch - add_extra_token) / seq_length;
  } else {
    num_samples = static_cast<int64_t>(std::ceil(static_cast<float>(num_epochs * tokens_per_epoch - add_extra_token) /
                                                 static_cast<float>(seq_length)));
  }
  if (num_samples < 0) num_samples = 0;
  std::vector<int64_t> out(2 * static_cast<size_t>(num_samples + 1));
  int64_t* idx = out.data();
  const int64_t last_position = static_cast<int64_t>(document_index.size()) - 1;
  int64_t position = 0, offset = 0;
  idx[0] = 0;
  idx[1] = 0;
  for (int64_t row = 1; row <= num_samples; ++row) {
    int64_t remaining = seq_length + add_extra_token;
    while (remaining != 0) {
      int64_t doc_len = static_cast<int64_t>(sizes[document_index[static_cast<size_t>(position)]]) - offset;
      remaining -= doc_len;
      if (remaining <= 0) {
        offset += remaining + doc_len - add_extra_token;
        remaining = 0;
      } else {
        if (position == last_position) {
          offset = sizes[document_index[static_cast<size_t>(position)]] - add_extra_token;
          break;
        }
        ++position;
        offset = 0;
      }
    }
    idx[2 * row] = position;
    idx[2 * row + 1] = offset;
  }
  return out;
}

std::vector<int64_t> build_shuffle_index(int64_t num_samples, int64_t total_size, NumpyRandomState& rng) {
  std::vector<int64_t> out(static_cast<size_t>(total_size));
  std::iota(out.begin(), out.end(), int64_t{0});
  rng.shuffle(out.data(), num_samples);
  if (num_samples == total_size) return out;
  rng.shuffle(out.data() + num_samples, total_size - num_samples);
  return out;
}

StatusOr<GptIndices> build_gpt_indices(const UnalignedArray<int32_t>& sizes, int64_t begin, int64_t end,
                                       const GptIndexParams& p, const std::string& name) {
  if (p.seq_length <= 1) return InvalidArgument("--seq-length: expected at least 2, found ", p.seq_length);
  if (p.add_extra_token != 0 && p.add_extra_token != 1) return InvalidArgument("add_extra_token must be 0 or 1");
  if (begin < 0 || end > sizes.size() || begin > end)
    return OutOfRange(name, ": split [", begin, ", ", end, ") outside the ", sizes.size(), " sequences");
  if (end - begin > int64_t{0x7FFFFFFF}) return Unimplemented(name, ": more than 2^31 sequences in one split");
  GptIndices g;
  int64_t tokens = 0;
  for (int64_t i = begin; i < end; ++i) tokens += sizes[i];
  g.tokens_per_epoch = tokens;
  if (tokens <= p.add_extra_token) {
    return FailedPrecondition(name, ": the split has ", end - begin, " sequences and ", tokens,
                              " tokens; a sample needs more than ", p.add_extra_token,
                              " (Megatron would loop forever here). Use more data or change --split");
  }
  g.num_epochs = gpt_num_epochs(tokens, p);
  if (g.num_epochs > int64_t{0x7FFFFFFF}) return InvalidArgument(name, ": more than 2^31 epochs needed");
  g.separate_final_epoch = gpt_separate_final_epoch(g.num_epochs, tokens, p);
  std::vector<int32_t> documents(static_cast<size_t>(end - begin));
  std::iota(documents.begin(), documents.end(), static_cast<int32_t>(begin));
  NumpyRandomState rng(p.seed);
  g.document_index = build_document_index(documents, g.num_epochs, rng, g.separate_final_epoch);
  g.sample_index =
      build_sample_index(sizes, g.document_index, p.seq_length, g.num_epochs, tokens, p.drop_last, p.add_extra_token);
  int64_t total = static_cast<int64_t>(g.sample_index.size() / 2) - 1;
  if (g.separate_final_epoch) {
    int64_t sans = ((g.num_epochs - 1) * tokens - p.add_extra_token) / p.seq_length;
    g.shuffle_index = build_shuffle_index(sans, total, rng);
  } else {
    g.shuffle_index = build_shuffle_index(total, total, rng);
  }
  return g;
}

}  // namespace gale
