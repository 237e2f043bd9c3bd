// Megatron's cached teacher logits: top-K/top-P selection, shard writing and reading, DP remapping
// (train/cached_logits.h).
#include "train/cached_logits.h"

#include <zstd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <regex>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/pickle.h"
#include "ckpt/torch_file.h"
#include "core/dtype.h"
#include "core/log.h"
#include "core/md5.h"
#include "core/tensor.h"
#include "model/topk_kl.h"
#include "parallel/context_split.h"

namespace gale {

StatusOr<LogitsSaveDtype> parse_logits_save_dtype(const std::string& name) {
  if (name == "fp16") return LogitsSaveDtype::kF16;
  if (name == "bf16") return LogitsSaveDtype::kBF16;
  if (name == "fp32") return LogitsSaveDtype::kF32;
  return InvalidArgument("--logits-save-dtype: expected one of fp16, bf16, fp32, found '", name, "'");
}

const char* logits_save_dtype_name(LogitsSaveDtype d) {
  switch (d) {
    case LogitsSaveDtype::kF16: return "fp16";
    case LogitsSaveDtype::kBF16: return "bf16";
    case LogitsSaveDtype::kF32: return "fp32";
  }
  return "?";
}

namespace {

float round_to(float x, LogitsSaveDtype d) {
  switch (d) {
    case LogitsSaveDtype::kF16: return f16_to_float(float_to_f16(x));
    case LogitsSaveDtype::kBF16: return bf16_to_float(float_to_bf16(x));
    case LogitsSaveDtype::kF32: return x;
  }
  return x;
}

DType dtype_of(LogitsSaveDtype d) {
  switch (d) {
    case LogitsSaveDtype::kF16: return DType::kF16;
    case LogitsSaveDtype::kBF16: return DType::kBF16;
    case LogitsSaveDtype::kF32: return DType::kF32;
  }
  return DType::kF32;
}

}  // namespace

StatusOr<TopKLogProbs> select_topk_logprobs(const float* logits, int64_t S, int64_t B, int64_t V, int64_t k,
                                            std::optional<double> top_p, int64_t min_k, LogitsSaveDtype dtype,
                                            double* mean_kept) {
  if (V > kCachedLogitsMaxVocab)
    return InvalidArgument("--logits-save-dir: the vocabulary has ", V, " entries; the saved indices hold 17 bits (at most ",
                           kCachedLogitsMaxVocab, ")");
  if (k < 1) return InvalidArgument("--logits-save-top-k: expected a positive count, found ", k);
  const int64_t T = S * B, K = std::min(k, V);
  std::vector<float> vals(static_cast<size_t>(T * K));
  std::vector<int64_t> idx(static_cast<size_t>(T * K));
  std::vector<int64_t> order(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    const float* z = logits + t * V;
    double m = -INFINITY, s = 0.0;
    for (int64_t v = 0; v < V; ++v) m = std::max(m, static_cast<double>(z[v]));
    for (int64_t v = 0; v < V; ++v) s += std::exp(static_cast<double>(z[v]) - m);
    const double lse = m + std::log(s);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int64_t a, int64_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
    for (int64_t j = 0; j < K; ++j) {
      vals[t * K + j] = static_cast<float>(static_cast<double>(z[order[j]]) - lse);
      idx[t * K + j] = order[j];
    }
  }
  TopKLogProbs out;
  out.S = S;
  out.B = B;
  int64_t Kout = K;
  std::vector<char> keep(static_cast<size_t>(T * K), 1);
  double kept_sum = static_cast<double>(T * K);
  if (top_p) {
    const int64_t floor_k = std::min(min_k, K);
    Kout = 0;
    kept_sum = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      float cum = 0.0f;
      int64_t kept = 0;
      for (int64_t j = 0; j < K; ++j) {
        const float p = std::exp(vals[t * K + j]);
        keep[t * K + j] = cum < static_cast<float>(*top_p) || j < floor_k;  // the mass before entry j
        cum += p;
        kept += keep[t * K + j];
      }
      Kout = std::max(Kout, kept);
      kept_sum += static_cast<double>(kept);
    }
  }
  if (mean_kept) *mean_kept = T > 0 ? kept_sum / static_cast<double>(T) : 0.0;
  out.K = Kout;
  out.logprobs.resize(static_cast<size_t>(T * Kout));
  out.indices.resize(static_cast<size_t>(T * Kout));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < Kout; ++j) {
      const bool kept = keep[t * K + j];
      out.logprobs[t * Kout + j] = kept ? round_to(vals[t * K + j], dtype) : kCachedLogitsLogprobSentinel;
      out.indices[t * Kout + j] = kept ? idx[t * K + j] : kCachedLogitsMaskedIndex;
    }
  return out;
}

namespace {

nlohmann::ordered_json identifiers_json(const LogitsDatasetIdentity& id) {
  nlohmann::ordered_json j;
  j["seed"] = id.seed;
  j["sequence_length"] = id.seq_length;
  j["train_samples"] = id.train_samples ? nlohmann::ordered_json(*id.train_samples) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json blend;
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const auto& [w, stem] : id.blend) list.push_back(nlohmann::ordered_json::array({w, stem}));
  if (id.per_split) {  // Megatron's blend_per_split[0], the train split (null without one)
    blend["kind"] = "blend_per_split";
    blend["train"] = id.blend.empty() ? nlohmann::ordered_json(nullptr) : list;
  } else if (id.blend.empty()) {
    blend["kind"] = "mock";
    blend["mock"] = true;
  } else {
    blend["kind"] = "blend";
    blend["blend"] = list;
  }
  j["blend"] = blend;
  return j;
}

}  // namespace

std::string cached_logits_dataset_hash(const LogitsDatasetIdentity& id) { return md5_hex(identifiers_json(id).dump()); }

std::string cached_logits_meta_json(const LogitsDatasetIdentity& id, const LogitsSaverSettings& saver) {
  nlohmann::ordered_json j;
  j["hash"] = cached_logits_dataset_hash(id);
  j["identifiers"] = identifiers_json(id);
  nlohmann::ordered_json s;
  s["k"] = saver.k;
  s["p"] = saver.p ? nlohmann::ordered_json(*saver.p) : nlohmann::ordered_json(nullptr);
  s["min_k"] = saver.min_k;
  s["save_dtype"] = logits_save_dtype_name(saver.dtype);
  j["saver"] = s;
  return j.dump();
}

StatusOr<std::string> encode_cached_logits_iteration(const std::vector<TopKLogProbs>& microbatches,
                                                     LogitsSaveDtype dtype) {
  PyRef values = PyValue::list(), low = PyValue::list(), bit17 = PyValue::list();
  for (const TopKLogProbs& mb : microbatches) {
    const Shape shape = {mb.S, mb.B, mb.K};
    const int64_t n = mb.S * mb.B * mb.K;
    Tensor v = Tensor::empty(shape, dtype_of(dtype));
    Tensor lo = Tensor::empty(shape, DType::kU16);
    Tensor hi = Tensor::empty(shape, DType::kU8);
    for (int64_t i = 0; i < n; ++i) {
      const float x = mb.logprobs[i];
      switch (dtype) {
        case LogitsSaveDtype::kF16: v.data<f16>()[i] = float_to_f16(x); break;
        case LogitsSaveDtype::kBF16: v.data<bf16>()[i] = float_to_bf16(x); break;
        case LogitsSaveDtype::kF32: v.data<float>()[i] = x; break;
      }
      const int64_t index = mb.indices[i];
      if (index < 0 || index >= kCachedLogitsMaxVocab)
        return InvalidArgument("cached logits: vocabulary index ", index, " does not fit 17 bits");
      static_cast<uint16_t*>(lo.raw())[i] = static_cast<uint16_t>(index & 0xFFFF);
      static_cast<uint8_t*>(hi.raw())[i] = static_cast<uint8_t>(index >> 16);
    }
    values->items.push_back(PyValue::tensor(std::move(v)));
    low->items.push_back(PyValue::tensor(std::move(lo)));
    PyRef h = PyValue::tensor(std::move(hi));
    h->storage_type = "BoolStorage";
    bit17->items.push_back(h);
  }
  PyRef root = PyValue::dict();
  root->set("values", values);
  root->set("indices_low", low);
  root->set("bit_17", bit17);
  GALE_ASSIGN_OR_RETURN(std::string raw, write_torch_bytes(*root, "archive"));
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  const size_t n = ZSTD_compress(out.data(), out.size(), raw.data(), raw.size(), 3);
  if (ZSTD_isError(n)) return DataLoss("cached logits: zstd compression failed: ", ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

namespace {

StatusOr<std::string> zstd_decompress(std::string_view in, const std::string& what) {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  std::string out;
  std::vector<char> buf(ZSTD_DStreamOutSize());
  ZSTD_inBuffer ib{in.data(), in.size(), 0};
  size_t ret = 1;
  while (ib.pos < ib.size) {
    ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
    ret = ZSTD_decompressStream(ctx, &ob, &ib);
    if (ZSTD_isError(ret)) {
      ZSTD_freeDCtx(ctx);
      return DataLoss(what, ": not a valid zstd frame (", ZSTD_getErrorName(ret), ")");
    }
    out.append(buf.data(), ob.pos);
    if (ob.pos == 0 && ret != 0 && ib.pos == ib.size) break;
  }
  // Drain what the decoder still holds.
  while (ret != 0) {
    ZSTD_outBuffer ob{buf.data(), buf.size(), 0};
    ret = ZSTD_decompressStream(ctx, &ob, &ib);
    if (ZSTD_isError(ret) || ob.pos == 0) break;
    out.append(buf.data(), ob.pos);
  }
  ZSTD_freeDCtx(ctx);
  if (ret != 0) return DataLoss(what, ": truncated zstd frame");
  return out;
}

const PyValue* tensor_list(const PyValue& root, const char* key, const std::string& what, Status* st) {
  const PyValue* l = root.kind == PyValue::kDict ? root.get(key) : nullptr;
  if (l == nullptr || l->kind != PyValue::kList) *st = DataLoss(what, ": expected a dict with a list '", key, "'");
  return l;
}

}  // namespace

StatusOr<std::vector<TopKLogProbs>> decode_cached_logits_iteration(std::string_view member, const std::string& what) {
  GALE_ASSIGN_OR_RETURN(std::string raw, zstd_decompress(member, what));
  GALE_ASSIGN_OR_RETURN(PyRef root, read_torch_bytes(std::move(raw), what));
  Status st = Status::Ok();
  const PyValue* values = tensor_list(*root, "values", what, &st);
  const PyValue* low = values ? tensor_list(*root, "indices_low", what, &st) : nullptr;
  const PyValue* hi = low ? tensor_list(*root, "bit_17", what, &st) : nullptr;
  if (!st.ok()) return st;
  if (low->items.size() != values->items.size() || hi->items.size() != values->items.size())
    return DataLoss(what, ": 'values', 'indices_low' and 'bit_17' hold ", values->items.size(), ", ",
                    low->items.size(), " and ", hi->items.size(), " micro-batches");
  std::vector<TopKLogProbs> out;
  for (size_t m = 0; m < values->items.size(); ++m) {
    const PyValue &v = *values->items[m], &lo = *low->items[m], &h = *hi->items[m];
    if (v.kind != PyValue::kTensor || lo.kind != PyValue::kTensor || h.kind != PyValue::kTensor ||
        v.shape.size() != 3 || v.shape != lo.shape || v.shape != h.shape)
      return DataLoss(what, ": micro-batch ", m, ": expected three [S, B, K] tensors of one shape");
    if (lo.data.dtype() != DType::kU16 || h.data.dtype() != DType::kU8)
      return DataLoss(what, ": micro-batch ", m, ": expected uint16 'indices_low' and bool 'bit_17', found ",
                      dtype_name(lo.data.dtype()), " and ", dtype_name(h.data.dtype()));
    TopKLogProbs mb;
    mb.S = v.shape[0];
    mb.B = v.shape[1];
    mb.K = v.shape[2];
    const int64_t n = mb.S * mb.B * mb.K;
    mb.logprobs.resize(static_cast<size_t>(n));
    mb.indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      switch (v.data.dtype()) {
        case DType::kF16: mb.logprobs[i] = f16_to_float(v.data.data<f16>()[i]); break;
        case DType::kBF16: mb.logprobs[i] = bf16_to_float(v.data.data<bf16>()[i]); break;
        case DType::kF32: mb.logprobs[i] = v.data.data<float>()[i]; break;
        default: return DataLoss(what, ": 'values' of dtype ", dtype_name(v.data.dtype()), " (expected fp16, bf16 or fp32)");
      }
      const int64_t bit = static_cast<const uint8_t*>(h.data.raw())[i] != 0 ? 1 : 0;
      mb.indices[i] = (bit << 16) | static_cast<const uint16_t*>(lo.data.raw())[i];
    }
    out.push_back(std::move(mb));
  }
  return out;
}

std::string cached_logits_tar_name(int cp_rank, int dp_rank, int64_t last_iteration) {
  return "cp" + std::to_string(cp_rank) + "_dp" + std::to_string(dp_rank) + "__" + std::to_string(last_iteration) + ".tar";
}

bool parse_cached_logits_tar_name(const std::string& name, int* cp_rank, int* dp_rank, int64_t* last_iteration) {
  static const std::regex re(R"(^cp(\d+)_dp(\d+)__(\d+)\.tar$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  *cp_rank = std::stoi(m[1]);
  *dp_rank = std::stoi(m[2]);
  *last_iteration = std::stoll(m[3]);
  return true;
}

namespace {

// One ustar header block of a regular file (mode 0644, as Python's TarInfo).
std::string tar_header(const std::string& name, size_t size) {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  auto octal = [&](size_t off, size_t width, uint64_t value) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%0*llo", static_cast<int>(width - 1), static_cast<unsigned long long>(value));
    std::memcpy(h.data() + off, buf, width - 1);
  };
  octal(100, 8, 0644);
  octal(108, 8, 0);
  octal(116, 8, 0);
  octal(124, 12, size);
  octal(136, 12, 0);
  h[156] = '0';
  std::memcpy(h.data() + 257, "ustar\0" "00", 8);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  char buf[8];
  std::snprintf(buf, sizeof buf, "%06o", sum);
  std::memcpy(h.data() + 148, buf, 6);
  h[154] = '\0';
  h[155] = ' ';
  return h;
}

void tar_add(std::string& out, const std::string& name, std::string_view data) {
  out += tar_header(name, data.size());
  out.append(data.data(), data.size());
  out.append((512 - data.size() % 512) % 512, '\0');
}

}  // namespace

Status write_cached_logits_tar(const std::string& path, const CachedLogitsTar& tar) {
  if (path.size() > 0 && std::filesystem::path(path).filename().string().size() > 100)
    return InvalidArgument(path, ": a shard name longer than 100 characters");
  std::string out;
  tar_add(out, "_meta.json", tar.meta);
  for (const auto& [it, data] : tar.iterations) tar_add(out, std::to_string(it) + ".pt.zst", data);
  out.append(1024, '\0');  // the end-of-archive marker
  return write_file_atomically(path, out);
}

StatusOr<CachedLogitsTar> read_cached_logits_tar(const std::string& path, const std::string& expected_hash) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the cached-logits shard");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  CachedLogitsTar tar;
  bool meta_seen = false;
  static const std::regex member_re(R"(^(\d+)\.pt\.zst$)");
  size_t off = 0;
  while (off + 512 <= bytes.size()) {
    const char* h = bytes.data() + off;
    if (std::all_of(h, h + 512, [](char c) { return c == '\0'; })) break;
    const std::string name(h, strnlen(h, 100));
    const std::string size_field(h + 124, strnlen(h + 124, 12));
    uint64_t size = 0;
    for (char c : size_field)
      if (c >= '0' && c <= '7') size = size * 8 + static_cast<uint64_t>(c - '0');
    const char type = h[156];
    off += 512;
    if (off + size > bytes.size()) return DataLoss(path, ": member '", name, "' is truncated");
    const std::string_view data(bytes.data() + off, size);
    off += (size + 511) / 512 * 512;
    if (type != '0' && type != '\0') continue;  // directories, pax headers, ...
    if (name == "_meta.json") {
      if (!expected_hash.empty()) {
        const nlohmann::json meta = nlohmann::json::parse(data, nullptr, false);
        const std::string saved = meta.is_object() && meta.contains("hash") && meta["hash"].is_string()
                                      ? meta["hash"].get<std::string>() : std::string("(none)");
        if (saved != expected_hash)
          return FailedPrecondition("--logits-load-dir: teacher shard ", path, " was saved with dataset hash ", saved,
                                    " but this run has ", expected_hash,
                                    " (seed, --seq-length, training samples and data blend must match the teacher's): "
                                    "the data does not align");
      }
      tar.meta = std::string(data);
      meta_seen = true;
      continue;
    }
    std::smatch m;
    if (!std::regex_match(name, m, member_re)) continue;
    if (!meta_seen) return DataLoss(path, ": no leading _meta.json member; cannot verify data alignment");
    tar.iterations.emplace_back(std::stoll(m[1]), std::string(data));
  }
  if (!meta_seen) return DataLoss(path, ": no _meta.json member; cannot verify data alignment");
  return tar;
}

StatusOr<CachedLogitsDpRemap> cached_logits_dp_remap(int dp_rank, int dp_size, int saved_dp_size) {
  CachedLogitsDpRemap r;
  if (saved_dp_size == dp_size) {
    r.source_dp_ranks = {dp_rank};
  } else if (saved_dp_size < dp_size) {
    if (dp_size % saved_dp_size != 0)
      return InvalidArgument("--logits-load-dir: this run's data-parallel size ", dp_size,
                             " is not a multiple of the saved data-parallel size ", saved_dp_size);
    r.source_dp_ranks = {dp_rank % saved_dp_size};
    r.stride = dp_size / saved_dp_size;
    r.offset = dp_rank / saved_dp_size;
  } else {
    if (saved_dp_size % dp_size != 0)
      return InvalidArgument("--logits-load-dir: the saved data-parallel size ", saved_dp_size,
                             " is not a multiple of this run's data-parallel size ", dp_size);
    for (int i = 0; i < saved_dp_size / dp_size; ++i) r.source_dp_ranks.push_back(dp_rank + i * dp_size);
  }
  return r;
}

StatusOr<CachedLogitsReader> CachedLogitsReader::open(const std::string& dir, int cp_rank, int dp_rank, int dp_size,
                                                      const std::string& expected_hash, int cp_size) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec))
    return NotFound("--logits-load-dir: '", dir, "' is not a directory");
  CachedLogitsReader r;
  r.dir_ = dir;
  r.hash_ = expected_hash;
  r.cp_rank_ = cp_rank;
  std::vector<std::tuple<int, int, int64_t, std::string>> found;
  int max_dp = -1, max_cp = -1;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    int cp = 0, dp = 0;
    int64_t last = 0;
    if (!parse_cached_logits_tar_name(e.path().filename().string(), &cp, &dp, &last)) continue;
    found.emplace_back(cp, dp, last, e.path().string());
    max_dp = std::max(max_dp, dp);
    max_cp = std::max(max_cp, cp);
  }
  if (ec) return NotFound("--logits-load-dir: cannot list '", dir, "': ", ec.message());
  if (max_dp < 0) return NotFound("--logits-load-dir: no cached-logits shards (cp{C}_dp{D}__{I}.tar) in '", dir, "'");
  r.saved_dp_size_ = max_dp + 1;
  r.saved_cp_size_ = max_cp + 1;
  r.cp_size_ = cp_size > 0 ? cp_size : r.saved_cp_size_;
  if (cp_size > 0 && r.saved_cp_size_ != cp_size) {
    for (int c = 0; c < r.saved_cp_size_; ++c) r.cp_sources_.push_back(c);
    print_rank0(str_cat("> --logits-load-dir: teacher logits saved at context-parallel size ", r.saved_cp_size_,
                        ", resharded for this run's ", cp_size));
  } else {
    r.cp_sources_ = {cp_rank};
  }
  GALE_ASSIGN_OR_RETURN(r.remap_, cached_logits_dp_remap(dp_rank, dp_size, r.saved_dp_size_));
  for (int src : r.remap_.source_dp_ranks)
    for (int c : r.cp_sources_) {
      std::vector<std::pair<int64_t, std::string>> list;
      for (const auto& [cp, dp, last, path] : found)
        if (cp == c && dp == src) list.emplace_back(last, path);
      if (list.empty()) return NotFound("--logits-load-dir: no shards for cp", c, "_dp", src, " in '", dir, "'");
      std::sort(list.begin(), list.end());
      r.shards_.push_back(std::move(list));
    }
  r.loaded_.resize(r.shards_.size());
  return r;
}

StatusOr<std::vector<TopKLogProbs>> CachedLogitsReader::from_source(int source, int64_t iteration) {
  const size_t n = cp_sources_.size();
  if (saved_cp_size_ == cp_size_) return from_shard(static_cast<size_t>(source), iteration);  // this rank's own
  std::vector<std::vector<TopKLogProbs>> per_cp;
  for (size_t j = 0; j < n; ++j) {
    GALE_ASSIGN_OR_RETURN(std::vector<TopKLogProbs> mbs, from_shard(static_cast<size_t>(source) * n + j, iteration));
    per_cp.push_back(std::move(mbs));
  }
  return cached_logits_cp_reshard(per_cp, cp_rank_, cp_size_);
}

StatusOr<std::vector<TopKLogProbs>> CachedLogitsReader::from_shard(size_t index, int64_t iteration) {
  const auto& list = shards_[index];
  auto it = std::lower_bound(list.begin(), list.end(), std::make_pair(iteration, std::string()));
  const int src_dp = remap_.source_dp_ranks[index / cp_sources_.size()];
  const int src_cp = cp_sources_[index % cp_sources_.size()];
  if (it == list.end())
    return NotFound("--logits-load-dir: no teacher logits for iteration ", iteration, " of cp", src_cp, "_dp", src_dp,
                    " in '", dir_, "' (its last shard ends at iteration ", list.back().first, ")");
  auto& [loaded_path, tar] = loaded_[index];
  if (loaded_path != it->second) {
    GALE_ASSIGN_OR_RETURN(tar, read_cached_logits_tar(it->second, hash_));
    loaded_path = it->second;
  }
  for (const auto& [i, data] : tar.iterations)
    if (i == iteration) return decode_cached_logits_iteration(data, it->second + ":" + std::to_string(i) + ".pt.zst");
  return NotFound("--logits-load-dir: no teacher logits for iteration ", iteration, " in ", it->second);
}

StatusOr<std::vector<TopKLogProbs>> CachedLogitsReader::iteration(int64_t iteration) {
  if (remap_.source_dp_ranks.size() == 1) {
    GALE_ASSIGN_OR_RETURN(std::vector<TopKLogProbs> mbs, from_source(0, iteration));
    if (remap_.stride == 1) return mbs;
    if (mbs.size() % static_cast<size_t>(remap_.stride) != 0)
      return InvalidArgument("--logits-load-dir: iteration ", iteration, " holds ", mbs.size(),
                             " saved micro-batches, not divisible by the data-parallel ratio ", remap_.stride);
    std::vector<TopKLogProbs> mine;
    for (size_t m = static_cast<size_t>(remap_.offset); m < mbs.size(); m += static_cast<size_t>(remap_.stride))
      mine.push_back(std::move(mbs[m]));
    return mine;
  }
  std::vector<std::vector<TopKLogProbs>> per;
  for (size_t s = 0; s < remap_.source_dp_ranks.size(); ++s) {
    GALE_ASSIGN_OR_RETURN(std::vector<TopKLogProbs> mbs, from_source(static_cast<int>(s), iteration));
    if (!per.empty() && mbs.size() != per[0].size())
      return DataLoss("--logits-load-dir: iteration ", iteration, ": the saved DP ranks hold ", per[0].size(), " and ",
                      mbs.size(), " micro-batches");
    per.push_back(std::move(mbs));
  }
  std::vector<TopKLogProbs> merged;  // src0_mb0, src1_mb0, ..., src0_mb1, ...
  for (size_t m = 0; m < per[0].size(); ++m)
    for (auto& src : per) merged.push_back(std::move(src[m]));
  return merged;
}

StatusOr<std::vector<TopKLogProbs>> cached_logits_cp_reshard(const std::vector<std::vector<TopKLogProbs>>& per_saved_cp,
                                                             int cp_rank, int cp_size) {
  const int64_t saved = static_cast<int64_t>(per_saved_cp.size());
  if (saved == 0) return InvalidArgument("--logits-load-dir: no saved CP ranks to reshard");
  const size_t mbs = per_saved_cp[0].size();
  std::vector<TopKLogProbs> out;
  for (size_t m = 0; m < mbs; ++m) {
    int64_t S_local = -1, B = -1, K = 0;
    for (int64_t c = 0; c < saved; ++c) {
      const auto& list = per_saved_cp[static_cast<size_t>(c)];
      if (list.size() != mbs)
        return DataLoss("--logits-load-dir: the saved CP ranks hold ", mbs, " and ", list.size(), " micro-batches");
      const TopKLogProbs& t = list[m];
      if (S_local >= 0 && (t.S != S_local || t.B != B))
        return DataLoss("--logits-load-dir: micro-batch ", m, ": the saved CP ranks hold [S, B] = [", S_local, ", ", B,
                        "] and [", t.S, ", ", t.B, "]");
      S_local = t.S;
      B = t.B;
      K = std::max(K, t.K);
    }
    const int64_t S = S_local * saved;
    GALE_ASSIGN_OR_RETURN(ContextSplit from, make_context_split(S, saved, 0));
    GALE_ASSIGN_OR_RETURN(ContextSplit to, make_context_split(S, cp_size, cp_rank));
    // The whole sequences, [S, B, K] (row (s·B + b)·K), padded with the top-P sentinels.
    std::vector<float> lp(static_cast<size_t>(S * B * K), kCachedLogitsLogprobSentinel);
    std::vector<int64_t> idx(static_cast<size_t>(S * B * K), kCachedLogitsMaskedIndex);
    for (int64_t c = 0; c < saved; ++c) {
      const TopKLogProbs& t = per_saved_cp[static_cast<size_t>(c)][m];
      for (int64_t s = 0; s < S_local; ++s)
        for (int64_t b = 0; b < B; ++b) {
          const int64_t g = from.global_position(s, c);
          std::copy_n(t.logprobs.begin() + (s * B + b) * t.K, t.K, lp.begin() + (g * B + b) * K);
          std::copy_n(t.indices.begin() + (s * B + b) * t.K, t.K, idx.begin() + (g * B + b) * K);
        }
    }
    TopKLogProbs mine;
    mine.S = to.local_length();
    mine.B = B;
    mine.K = K;
    for (int64_t s = 0; s < mine.S; ++s) {
      const int64_t g = to.global_position(s);
      mine.logprobs.insert(mine.logprobs.end(), lp.begin() + g * B * K, lp.begin() + (g + 1) * B * K);
      mine.indices.insert(mine.indices.end(), idx.begin() + g * B * K, idx.begin() + (g + 1) * B * K);
    }
    out.push_back(std::move(mine));
  }
  return out;
}

StatusOr<KdMicroBatchLoss> mix_kd_loss(double lm, const StatusOr<double>& kd, double alpha, bool ignore_errors) {
  KdMicroBatchLoss r;
  r.lm = r.total = lm;
  if (!kd.ok()) {
    if (!ignore_errors) return kd.status();
    warn_rank0("KD loss failed, falling back to the LM loss (--logits-load-ignore-errors): " + kd.status().message());
    return r;
  }
  r.kd = kd.value();
  r.kd_used = true;
  r.lm_coef = 1.0 - alpha;
  r.kd_coef = alpha;
  r.total = r.lm_coef * lm + r.kd_coef * r.kd;
  return r;
}

}  // namespace gale
