// Megatron-LM's cached teacher logits (--logits-save-dir / --logits-load-dir): the saver's top-K
// (and top-P) selection of log-probabilities, and the on-disk shards, written and read exactly as
// megatron/training/distillation/{logits_saver,utils_logits}.py do (docs/formats/cached-logits.md).
//
// A shard is the tar  <dir>/cp{C}_dp{D}__{I}.tar  (CP rank C, DP rank D of the saving run, I its
// last iteration) whose first member "_meta.json" holds {"hash", "identifiers", "saver"} and whose
// other members "{iteration}.pt.zst" are zstd frames (level 3) of a torch.save archive of
// {'values': [per micro-batch [S, B, K] fp16|bf16|fp32 log-probabilities],
//  'indices_low': [uint16 low 16 bits of the vocabulary index], 'bit_17': [bool 17th bit]}.
// Samples are found again by (CP rank, DP rank, iteration, micro-batch) under the same seed and
// data flags (the hash); a student at another DP size remaps ranks as Megatron does
// (cached_logits_dp_remap).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gale {

enum class LogitsSaveDtype { kF16, kBF16, kF32 };  // --logits-save-dtype fp16 | bf16 | fp32
// "fp16" | "bf16" | "fp32", else an error naming --logits-save-dtype.
StatusOr<LogitsSaveDtype> parse_logits_save_dtype(const std::string& name);
const char* logits_save_dtype_name(LogitsSaveDtype d);

// Megatron's 17-bit index packing: vocabularies above 2^17 entries cannot be saved.
inline constexpr int64_t kCachedLogitsMaxVocab = int64_t{1} << 17;
// Megatron's packed index of a top-P-masked entry (-1 & 0xFFFF with bit 17 set).
inline constexpr int64_t kCachedLogitsMaskedIndex = kCachedLogitsMaxVocab - 1;

// One micro-batch's teacher top-K: [S, B, K] row-major (token t = s·B + b, Gale's and Megatron's
// sequence-first order), log-probabilities as stored (rounded to the save dtype) and global
// vocabulary indices.
struct TopKLogProbs {
  int64_t S = 0, B = 0, K = 0;
  std::vector<float> logprobs;
  std::vector<int64_t> indices;
};

// The saver's selection from one micro-batch's whole-vocabulary logits [S·B, V] (f32): the top
// `k` logits of each token (min(k, V)), their log-probabilities over the whole vocabulary, then
// with `top_p` the nucleus mask (an entry is kept while the mass before it is < p, at least
// min(min_k, K) per token), K cut to the largest kept count and the masked entries set to the
// sentinels (-1000, kCachedLogitsMaskedIndex); values rounded to `dtype`. `mean_kept` (optional):
// the tokens' mean kept count (Megatron's avg-logprobs-kept). Errors: V > 2^17, k < 1.
StatusOr<TopKLogProbs> select_topk_logprobs(const float* logits, int64_t S, int64_t B, int64_t V, int64_t k,
                                            std::optional<double> top_p, int64_t min_k, LogitsSaveDtype dtype,
                                            double* mean_kept = nullptr);

// What determines the sample stream (Megatron's compute_dataset_hash): the seed, the sequence
// length, the training samples (--train-samples, else train iterations × global batch size, else
// unknown) and the train blend as (weight, file stem) pairs. Megatron's three kinds: "blend"
// (--data-path / --data-args-path; `blend` its entries), "blend_per_split" (--train-data-path and
// the other per-split flags, `per_split` true; `blend` the train split's entries, empty: "train":
// null) and "mock" (neither: `blend` empty, `per_split` false).
struct LogitsDatasetIdentity {
  int64_t seed = 1234;
  int64_t seq_length = 0;
  std::optional<int64_t> train_samples;
  std::vector<std::pair<double, std::string>> blend;
  bool per_split = false;
};
struct LogitsSaverSettings {
  int64_t k = 0;
  std::optional<double> p;
  int64_t min_k = 1;
  LogitsSaveDtype dtype = LogitsSaveDtype::kF16;
};
// md5 of the identifiers' compact JSON, as Megatron's hash.
std::string cached_logits_dataset_hash(const LogitsDatasetIdentity& id);
// The "_meta.json" member's bytes.
std::string cached_logits_meta_json(const LogitsDatasetIdentity& id, const LogitsSaverSettings& saver);

// One "{iteration}.pt.zst" member's bytes from an iteration's micro-batches, and back (`what`
// names the member in errors).
StatusOr<std::string> encode_cached_logits_iteration(const std::vector<TopKLogProbs>& microbatches,
                                                     LogitsSaveDtype dtype);
StatusOr<std::vector<TopKLogProbs>> decode_cached_logits_iteration(std::string_view member, const std::string& what);

// "cp{C}_dp{D}__{I}.tar"; parses one back (false: not a shard name).
std::string cached_logits_tar_name(int cp_rank, int dp_rank, int64_t last_iteration);
bool parse_cached_logits_tar_name(const std::string& name, int* cp_rank, int* dp_rank, int64_t* last_iteration);

// A shard: the metadata bytes and its iterations' members in file order.
struct CachedLogitsTar {
  std::string meta;
  std::vector<std::pair<int64_t, std::string>> iterations;
};
// Written to `path`.tmp and renamed (Megatron's atomic publish).
Status write_cached_logits_tar(const std::string& path, const CachedLogitsTar& tar);
// Read; `expected_hash` non-empty: the metadata's hash must equal it (else an error saying the
// data does not align). A tar without a leading _meta.json is an error.
StatusOr<CachedLogitsTar> read_cached_logits_tar(const std::string& path, const std::string& expected_hash);

// Megatron's DP remapping of a student at DP size `dp_size` reading shards saved at `saved_dp_size`
// (one divides the other, else an error): the saved DP ranks this rank reads (several when the
// student has fewer ranks: their micro-batches interleave), and when it has more, the stride and
// offset of its micro-batches in the one saved rank's list.
struct CachedLogitsDpRemap {
  std::vector<int> source_dp_ranks;
  int stride = 1, offset = 0;
};
StatusOr<CachedLogitsDpRemap> cached_logits_dp_remap(int dp_rank, int dp_size, int saved_dp_size);

// The student's side: this rank's teacher micro-batches per iteration from --logits-load-dir.
class CachedLogitsReader {
 public:
  // Lists the shards (their names give the saved DP size: the largest DP rank + 1, and the saved CP
  // size: the largest CP rank + 1). `cp_size` (> 0) is this run's CP size: when the saved one
  // differs, every saved CP rank's shards are read and each micro-batch is resharded
  // (cached_logits_cp_reshard; beyond Megatron, which needs the teacher's CP layout); 0: this CP
  // rank's shards are read as they are. Errors: a missing or unreadable directory, no shard for a
  // CP rank read, DP sizes that do not divide.
  static StatusOr<CachedLogitsReader> open(const std::string& dir, int cp_rank, int dp_rank, int dp_size,
                                           const std::string& expected_hash, int cp_size = 0);
  // This rank's micro-batches of `iteration` (remapped), or an error naming the directory, the
  // shard and the iteration when it is not there.
  StatusOr<std::vector<TopKLogProbs>> iteration(int64_t iteration);
  int saved_dp_size() const { return saved_dp_size_; }
  int saved_cp_size() const { return saved_cp_size_; }

 private:
  // Source DP rank `source`'s micro-batches (this CP rank's, resharded when the CP sizes differ).
  StatusOr<std::vector<TopKLogProbs>> from_source(int source_dp, int64_t iteration);
  StatusOr<std::vector<TopKLogProbs>> from_shard(size_t shard_list, int64_t iteration);
  std::string dir_, hash_;
  int cp_rank_ = 0, cp_size_ = 1, saved_dp_size_ = 1, saved_cp_size_ = 1;
  std::vector<int> cp_sources_;  // the saved CP ranks read: {cp_rank} or all of them (resharding)
  CachedLogitsDpRemap remap_;
  // Per (source DP rank, saved CP rank read), source-major: (last iteration, path) of its shards,
  // ascending; the decoded shard cached.
  std::vector<std::vector<std::pair<int64_t, std::string>>> shards_;
  std::vector<std::pair<std::string, CachedLogitsTar>> loaded_;
};

// One micro-batch list per saved CP rank (`per_saved_cp[c]`: rank c's micro-batches, [S/C', B, K_c]
// each, in Megatron's load-balanced order) resharded for CP rank `cp_rank` of `cp_size`: the whole
// sequences put back together, then this rank's positions (parallel/context_split.h) taken in its
// order; K is the largest K_c, shorter rows padded with the top-P sentinels (-1000,
// kCachedLogitsMaskedIndex), which count for nothing in the KL. Errors: lists of different lengths,
// [S, B] that differ between the saved ranks, a whole length not a multiple of 2·cp_size.
StatusOr<std::vector<TopKLogProbs>> cached_logits_cp_reshard(const std::vector<std::vector<TopKLogProbs>>& per_saved_cp,
                                                             int cp_rank, int cp_size);

// Megatron's mix of one training micro-batch's losses (LossFuncCallable): lm = Σ mask·ℓ and kd =
// Σ mask·kl (model/topk_kl.h), total = α·kd + (1 − α)·lm (--logits-load-kd-loss-alpha), with the
// gradient coefficients of the two terms. A KD error (e.g. a sample missing from --logits-load-dir)
// is returned as is, or with `ignore_errors` (--logits-load-ignore-errors) warned about (rank 0)
// and replaced by the lm loss alone (lm coefficient 1, kd 0, kd_used false).
struct KdMicroBatchLoss {
  double lm = 0.0, kd = 0.0, total = 0.0;
  double lm_coef = 1.0, kd_coef = 0.0;
  bool kd_used = false;
};
StatusOr<KdMicroBatchLoss> mix_kd_loss(double lm, const StatusOr<double>& kd, double alpha, bool ignore_errors);

}  // namespace gale
