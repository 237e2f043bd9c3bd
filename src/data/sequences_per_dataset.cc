// Reading and checking --per-dataset-sequences-path.
#include "data/sequences_per_dataset.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gale {

StatusOr<SequencesPerDataset> load_sequences_per_dataset(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound("--per-dataset-sequences-path ", path, ": cannot open file");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("--per-dataset-sequences-path ", path,
                           ": expected a JSON object {prefix: [sequence_count, document_count]}, found ",
                           j.is_discarded() ? std::string("text that is not JSON") : std::string(j.type_name()));
  SequencesPerDataset out;
  out.path = path;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& v = it.value();
    bool ok = v.is_array() && v.size() == 2;
    for (size_t i = 0; ok && i < 2; ++i) ok = v[i].is_number_integer() && v[i].get<int64_t>() >= 0;
    if (!ok)
      return InvalidArgument("--per-dataset-sequences-path ", path, ": expected '", it.key(),
                             "' to map to [sequence_count, document_count] (two non-negative integers), found ",
                             v.dump());
    out.counts[it.key()] = {v[0].get<int64_t>(), v[1].get<int64_t>()};
  }
  return out;
}

TokenDType sequences_per_dataset_dtype(int64_t vocab_size) {
  return vocab_size > 65536 ? TokenDType::kInt32 : TokenDType::kUInt16;
}

Status check_declared_index(const SequencesPerDataset& file, const IndexedDataset& dataset, int64_t vocab_size) {
  const std::string& prefix = dataset.prefix();
  auto it = file.counts.find(prefix);
  if (it == file.counts.end())
    return NotFound("--per-dataset-sequences-path ", file.path, ": no entry for dataset prefix '", prefix,
                    "' (regenerate the file for this blend)");
  const auto [sequences, documents] = it->second;
  if (sequences != dataset.num_sequences() || documents != dataset.num_documents() + 1)
    return FailedPrecondition("--per-dataset-sequences-path ", file.path, ": '", prefix, "' is listed with [",
                              sequences, ", ", documents, "] but ", idx_path(prefix), " holds [",
                              dataset.num_sequences(), ", ", dataset.num_documents() + 1,
                              "] (sequence_count, document_count); the file is stale, regenerate it");
  const TokenDType dtype = sequences_per_dataset_dtype(vocab_size);
  if (dtype != dataset.dtype())
    return FailedPrecondition("--per-dataset-sequences-path: ", idx_path(prefix), " holds ",
                              token_dtype_name(dataset.dtype()), " tokens but with this file Megatron reads them as ",
                              token_dtype_name(dtype), " (its choice for a vocabulary of ", vocab_size,
                              "); drop --per-dataset-sequences-path for this data");
  return Status::Ok();
}

}  // namespace gale
