// --compress-activation / --compress-dense: a layer's saved activations compressed between its
// forward and its backward.
#include "model/activation_compress.h"

#include <chrono>
#include <cstdlib>

#include "core/check.h"

namespace gale {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

StatusOr<int64_t> parse_layer_number(const std::string& item, const std::string& text, int64_t num_layers) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || text.size() > 12)
    return InvalidArgument("--compress-activation: expected '0' or layer numbers and ranges such as '1-3,5', found '",
                           item, "'");
  const int64_t n = std::strtoll(text.c_str(), nullptr, 10);
  if (n < 1 || n > num_layers)
    return InvalidArgument("--compress-activation: layer ", n, " in '", item, "' is outside 1..", num_layers,
                           " (--num-layers)");
  return n;
}

}  // namespace

bool ActivationCompressConfig::any() const {
  if (dense_level >= 0) return true;
  for (bool b : layers)
    if (b) return true;
  return false;
}

StatusOr<std::vector<bool>> parse_compress_activation(const std::string& spec, int64_t num_layers) {
  std::vector<bool> layers(static_cast<size_t>(std::max<int64_t>(num_layers, 0)), false);
  if (spec == "0") return std::vector<bool>(layers.size(), true);
  if (spec.empty()) return InvalidArgument("--compress-activation: expected '0' or layer numbers such as '1-3,5', found ''");
  size_t at = 0;
  while (at <= spec.size()) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string item = spec.substr(at, comma - at);
    const size_t dash = item.find('-');
    int64_t first, last;
    if (dash == std::string::npos) {
      GALE_ASSIGN_OR_RETURN(first, parse_layer_number(item, item, num_layers));
      last = first;
    } else {
      GALE_ASSIGN_OR_RETURN(first, parse_layer_number(item, item.substr(0, dash), num_layers));
      GALE_ASSIGN_OR_RETURN(last, parse_layer_number(item, item.substr(dash + 1), num_layers));
      if (last < first)
        return InvalidArgument("--compress-activation: the range '", item, "' ends before it starts");
    }
    for (int64_t l = first; l <= last; ++l) layers[static_cast<size_t>(l - 1)] = true;
    at = comma + 1;
  }
  return layers;
}

StatusOr<int> parse_compress_dense(const std::string& value) {
  if (value == "disable") return -1;
  if (value == "level0") return 0;
  if (value == "level1") return 1;
  return InvalidArgument("--compress-dense: expected disable, level0 or level1, found '", value, "'");
}

void CompressStats::add(const CompressStats& o) {
  tensors += o.tensors;
  raw_bytes += o.raw_bytes;
  stored_bytes += o.stored_bytes;
  file_bytes += o.file_bytes;
  encode_seconds += o.encode_seconds;
  decode_seconds += o.decode_seconds;
}

std::vector<Tensor*> saved_tensors(LayerSaved& s) {
  std::vector<Tensor*> t = {&s.x_in,        &s.norm1_stats, &s.norm1_out,   &s.attention.qkv, &s.attention.lse,
                            &s.attention.kv_global,         &s.attention.head_out,            &s.q_pre,
                            &s.k_pre,       &s.q_stats,     &s.k_stats,     &s.mla.x,         &s.mla.x_full,
                            &s.mla.q_latent, &s.mla.q_stats, &s.mla.q_in,   &s.mla.kv_latent, &s.mla.kv_stats,
                            &s.mla.kv_in,   &s.mla.attention.qkv,           &s.mla.attention.lse,
                            &s.mla.attention.kv_global,     &s.mla.attention.head_out,        &s.mla.k_pe,
                            &s.mla.out,     &s.ctx,         &s.heads_out,   &s.x_mid,         &s.norm2_stats,
                            &s.norm2_out,   &s.mlp_in,      &s.fc1_out,     &s.act,           &s.moe.x,
                            &s.moe.probs,   &s.moe.expert_in, &s.moe.expert_out, &s.moe.gathered_probs,
                            &s.shared.x,    &s.shared.x_full, &s.shared.fc1_out, &s.shared.act, &s.shared.m,
                            &s.shared.gate, &s.lora_qkv_u,  &s.lora_proj_u, &s.lora_fc1_u,    &s.lora_fc2_u};
  for (Tensor& x : s.moe.fc1_out) t.push_back(&x);
  for (Tensor& x : s.moe.act) t.push_back(&x);
  return t;
}

void ActivationCompressor::compress(int64_t layer, int64_t global_layer, LayerSaved& saved) {
  const bool whole = config_.layer(global_layer);
  const bool dense = !whole && config_.dense_level >= 0 && saved.fc1_out.defined();
  if (!whole && !dense) return;
  GALE_CHECK(layers_.count(layer) == 0) << "--compress-activation: layer " << layer << " compressed twice";
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor*> all = saved_tensors(saved);
  std::vector<Entry> entries;
  // Slots by data pointer: a storage shared by several fields is compressed once.
  std::map<const void*, size_t> by_data;
  for (size_t i = 0; i < all.size(); ++i) {
    Tensor& t = *all[i];
    if (!t.defined() || static_cast<int64_t>(t.nbytes()) < kMinCompressBytes) continue;
    if (!whole && all[i] != &saved.fc1_out) continue;
    auto it = by_data.find(t.raw());
    if (it != by_data.end()) {
      Entry& e = entries[it->second];
      if (e.dtype == t.dtype() && e.planes.raw_bytes() == static_cast<int64_t>(t.nbytes())) {
        e.slots.push_back(i);
        e.shapes.push_back(t.shape());
        t = Tensor();
        continue;
      }
    }
    Entry e;
    e.slots = {i};
    e.shapes = {t.shape()};
    e.dtype = t.dtype();
    e.planes = compress_planes(t.raw(), t.numel(), dtype_size(t.dtype()), whole ? -1 : 1);
    if (!whole && config_.dense_level == 1) spill(e);
    stats_.tensors += 1;
    stats_.raw_bytes += e.planes.raw_bytes();
    stats_.stored_bytes += e.planes.stored_bytes();
    by_data[t.raw()] = entries.size();
    entries.push_back(std::move(e));
    // Released at once (unless something else holds the storage), so that the peak holds one
    // tensor twice at most. A storage freed here cannot be confused with a later slot's: those
    // were alive at the same time.
    t = Tensor();
  }
  layers_[layer] = std::move(entries);
  stats_.encode_seconds += seconds_since(t0);
}

void ActivationCompressor::decompress(int64_t layer, LayerSaved& saved) {
  auto it = layers_.find(layer);
  if (it == layers_.end()) return;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Tensor*> all = saved_tensors(saved);
  for (Entry& e : it->second) {
    unspill(e);
    Tensor t = Tensor::empty({e.planes.numel}, e.dtype);
    decompress_planes(e.planes, t.raw());
    e.planes = CompressedPlanes();
    for (size_t j = 0; j < e.slots.size(); ++j) *all[e.slots[j]] = t.view(e.shapes[j]);
  }
  layers_.erase(it);
  stats_.decode_seconds += seconds_since(t0);
}

void ActivationCompressor::spill(Entry& e) {
  e.file_offsets.assign(e.planes.planes.size(), -1);
  for (size_t k = 1; k < e.planes.planes.size(); ++k) {
    if (e.planes.coded[k] || e.planes.planes[k].numel() == 0) continue;
    if (!file_) {
      const char* tmp = std::getenv("TMPDIR");
      auto f = SwapFile::create(tmp && *tmp ? tmp : "/tmp", 0, "--compress-dense level1 ($TMPDIR)",
                                "gale-compress-dense");
      GALE_CHECK(f.ok()) << f.status().message();
      file_ = std::move(f).value();
    }
    const Tensor& p = e.planes.planes[k];
    const Status st = file_->append(p.raw(), static_cast<int64_t>(p.nbytes()), &e.file_offsets[k]);
    GALE_CHECK(st.ok()) << "--compress-dense level1: " << st.message();
    stats_.file_bytes += static_cast<int64_t>(p.nbytes());
    e.planes.planes[k] = Tensor();
  }
}

void ActivationCompressor::unspill(Entry& e) {
  for (size_t k = 0; k < e.file_offsets.size(); ++k) {
    if (e.file_offsets[k] < 0) continue;
    Tensor p = Tensor::empty({e.planes.numel}, DType::kU8);
    const Status st = file_->read(e.file_offsets[k], p.raw(), e.planes.numel);
    GALE_CHECK(st.ok()) << "--compress-dense level1: " << st.message();
    e.planes.planes[k] = std::move(p);
  }
  e.file_offsets.clear();
}

}  // namespace gale
