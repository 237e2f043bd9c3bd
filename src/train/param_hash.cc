// Megatron's check of parameter hashes across data-parallel replicas.
#include "train/param_hash.h"

#include <cstdio>
#include <cmath>
#include <cstring>

#include "core/log.h"

namespace gale {

uint64_t param_hash(const float* data, int64_t n) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a offset basis
  const auto* bytes = reinterpret_cast<const unsigned char*>(data);
  const size_t count = static_cast<size_t>(n) * sizeof(float);
  for (size_t i = 0; i < count; ++i) {
    h ^= bytes[i];
    h *= 1099511628211ull;  // FNV prime
  }
  return h;
}

namespace {

struct Hashed {
  size_t chunk;
  std::string name;
};

// Gathers `local` (one hash per parameter of `params`) over `group` and compares all ranks'.
// Returns the first difference from rank 0 as the error's detail, or "" when all agree.
std::string compare_over(const std::vector<Hashed>& params, const std::vector<uint64_t>& local, const Comm& group) {
  const int n = group->size();
  const size_t count = local.size();
  std::vector<uint64_t> all(count * static_cast<size_t>(n));
  // The same number of parameters on every rank of the group: DP replicas hold the same model.
  group->all_gather(local.data(), all.data(), static_cast<int64_t>(count), DType::kI64);
  auto hash_of = [&](int rank, size_t i) { return all[static_cast<size_t>(rank) * count + i]; };
  for (size_t i = 0; i < count; ++i)  // Megatron's log of this rank's differences from rank 0
    if (local[i] != hash_of(0, i))
      std::fprintf(stderr, "[Rank %d] Hash not matching for %s in model chunk%zu\n", log_rank(),
                   params[i].name.c_str(), params[i].chunk);
  // Cross check: all equal to all, i.e. all equal to rank 0.
  for (int r = 1; r < n; ++r)
    for (size_t i = 0; i < count; ++i)
      if (hash_of(r, i) != hash_of(0, i))
        return str_cat("data-parallel rank ", r, " differs from rank 0 in ", params[i].name, " of model chunk ",
                       params[i].chunk);
  return "";
}

}  // namespace

Status check_param_hashes_across_dp_replicas(const std::vector<const ParamBuffer*>& chunks, const Comm& dp,
                                             const Comm& expert_dp) {
  std::vector<Hashed> dense, expert;
  std::vector<uint64_t> dense_hashes, expert_hashes;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ParamBuffer& pb = *chunks[c];
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const Tensor values = pb.param_values(id);  // f32 (reconstructed under --reuse-fp32-param)
      const uint64_t h = param_hash(values.data<float>(), s.local_numel());
      (s.expert_parallel ? expert : dense).push_back({c, s.name});
      (s.expert_parallel ? expert_hashes : dense_hashes).push_back(h);
    }
  }
  std::string detail;
  if (!dense.empty()) detail = compare_over(dense, dense_hashes, dp);
  if (!expert.empty()) {
    if (!expert_dp)
      return InvalidArgument("check_param_hashes_across_dp_replicas: expert-parallel parameters need the "
                             "expert-data-parallel group");
    const std::string e = compare_over(expert, expert_hashes, expert_dp);
    if (detail.empty()) detail = e;
  }
  if (!detail.empty()) return Internal("Parameter hashes not matching across DP replicas (", detail, ")");
  return Status::Ok();
}

namespace {

bool is_qk_layernorm(const std::string& name) {
  return name.find("self_attention.q_layernorm.") != std::string::npos ||
         name.find("self_attention.k_layernorm.") != std::string::npos;
}

// Gathers the concatenated `values` over `group` and compares every rank's with rank 0's.
std::string compare_values(const std::vector<Hashed>& params, const std::vector<int64_t>& sizes,
                           const std::vector<float>& values, const Comm& group, const char* parallelism) {
  const int n = group->size();
  if (n == 1) return "";
  const size_t count = values.size();
  std::vector<float> all(count * static_cast<size_t>(n));
  group->all_gather(values.data(), all.data(), static_cast<int64_t>(count), DType::kF32);
  for (int r = 1; r < n; ++r) {
    size_t offset = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const float* a = all.data() + offset;
      const float* b = all.data() + static_cast<size_t>(r) * count + offset;
      const size_t len = static_cast<size_t>(sizes[i]);
      if (std::memcmp(a, b, len * sizeof(float)) != 0) {
        double sq = 0.0;
        for (size_t k = 0; k < len; ++k) sq += (static_cast<double>(b[k]) - a[k]) * (static_cast<double>(b[k]) - a[k]);
        return str_cat("--test-mode: discrepancy between ", params[i].name, " of model chunk ", params[i].chunk, " in ",
                       parallelism, " ranks ", r, " and 0 (norm of the difference ", std::sqrt(sq), ")");
      }
      offset += len;
    }
  }
  return "";
}

}  // namespace

Status check_qk_layernorm_replicas(const std::vector<const ParamBuffer*>& chunks, const Comm& dp, const Comm& tp) {
  std::vector<Hashed> params;
  std::vector<int64_t> sizes;
  std::vector<float> values;
  for (size_t c = 0; c < chunks.size(); ++c) {
    const ParamBuffer& pb = *chunks[c];
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      if (!is_qk_layernorm(s.name)) continue;
      const Tensor v = pb.param_values(id);
      const float* data = v.data<float>();
      params.push_back({c, s.name});
      sizes.push_back(s.local_numel());
      values.insert(values.end(), data, data + s.local_numel());
    }
  }
  if (params.empty()) return Status::Ok();
  std::string detail = compare_values(params, sizes, values, dp, "data-parallel");
  if (detail.empty() && tp) detail = compare_values(params, sizes, values, tp, "tensor-parallel");
  if (!detail.empty()) return Internal(detail);
  return Status::Ok();
}

}  // namespace gale
