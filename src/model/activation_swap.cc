// --swap-attention's per-micro-batch file of attention activations, with one-layer-ahead prefetch.
#include "model/activation_swap.h"

#include <algorithm>
#include <cstdlib>

#include "core/check.h"

namespace gale {

std::string swap_attention_dir(const SwapAttentionConfig& c) {
  if (!c.dir.empty()) return c.dir;
  const char* tmp = std::getenv("TMPDIR");
  return tmp && *tmp ? std::string(tmp) : std::string("/tmp");
}

std::vector<std::string> split_swap_modules(const std::vector<std::string>& values) {
  std::vector<std::string> out;
  for (const std::string& v : values) {
    size_t at = 0;
    while (at <= v.size()) {
      const size_t comma = std::min(v.find(',', at), v.size());
      if (comma > at) out.push_back(v.substr(at, comma - at));
      at = comma + 1;
    }
  }
  return out;
}

StatusOr<SwapAttentionConfig> swap_attention_config(const std::vector<std::string>& swap_modules, const std::string& dir) {
  SwapAttentionConfig c;
  c.enabled = true;
  c.input_norm = c.self_attention = c.post_attention_norm = false;
  c.dir = dir;
  for (const std::string& m : split_swap_modules(swap_modules)) {
    if (m == "input_norm") {
      c.input_norm = true;
    } else if (m == "self_attention") {
      c.self_attention = true;
    } else if (m == "post_attention_norm") {
      c.post_attention_norm = true;
    } else {
      return InvalidArgument("--swap-modules: expected input_norm, self_attention or post_attention_norm "
                             "(comma-separated), found '", m, "'");
    }
  }
  return c;
}

StatusOr<std::unique_ptr<ActivationSwap>> ActivationSwap::create(const SwapAttentionConfig& config) {
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<SwapFile> f,
                        SwapFile::create(swap_attention_dir(config), 0, "--swap-attention-dir", "gale-swap-attention"));
  return std::unique_ptr<ActivationSwap>(new ActivationSwap(config, std::move(f)));
}

ActivationSwap::~ActivationSwap() {
  for (auto& [layer, r] : reads_)
    if (r.valid()) r.wait();
}

std::vector<ActivationSwap::Entry> ActivationSwap::selected(const SwapAttentionConfig& config) {
  std::vector<Entry> out;
  auto direct = [&](Tensor LayerSaved::*m) {
    Entry e;
    e.member = m;
    out.push_back(e);
  };
  auto in_attention = [&](Tensor CoreAttentionSaved::*m) {
    Entry e;
    e.attention_member = m;
    out.push_back(e);
  };
  if (config.input_norm) direct(&LayerSaved::norm1_out);
  if (config.self_attention) {
    in_attention(&CoreAttentionSaved::qkv);
    in_attention(&CoreAttentionSaved::lse);
    direct(&LayerSaved::ctx);
  }
  if (config.post_attention_norm) direct(&LayerSaved::norm2_out);
  if (config.layer_input) direct(&LayerSaved::x_in);
  if (config.mlp) {
    direct(&LayerSaved::x_mid);
    direct(&LayerSaved::fc1_out);
    direct(&LayerSaved::act);
  }
  return out;
}

bool ActivationSwap::swaps(const SwapAttentionConfig& config, const Tensor& t) {
  return t.defined() && t.numel() > 0 && (!config.sole_owners_only || t.sole_owner());
}

int64_t ActivationSwap::releasable_bytes(const SwapAttentionConfig& config, const LayerSaved& saved) {
  int64_t bytes = 0;
  for (const Entry& e : selected(config)) {
    const Tensor& t = field(saved, e);
    if (swaps(config, t)) bytes += static_cast<int64_t>(t.nbytes());
  }
  return bytes;
}

void ActivationSwap::swap_out(int64_t layer, LayerSaved& saved) {
  GALE_CHECK(layers_.count(layer) == 0) << "--swap-attention: layer " << layer << " swapped out twice";
  std::vector<Entry> entries;
  for (Entry e : selected(config_)) {
    Tensor& t = field(saved, e);
    if (!swaps(config_, t)) continue;
    e.shape = t.shape();
    e.dtype = t.dtype();
    e.bytes = static_cast<int64_t>(t.nbytes());
    const Status st = file_->append(t.raw(), e.bytes, &e.offset);
    GALE_CHECK(st.ok()) << "--swap-attention: " << st.message();
    t = Tensor();  // released here (unless something else still holds the storage)
    entries.push_back(e);
  }
  layers_[layer] = std::move(entries);
}

std::vector<Tensor> ActivationSwap::read(const std::vector<Entry>& entries) const {
  std::vector<Tensor> out;
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    const Status st = file_->read(e.offset, t.raw(), e.bytes);
    GALE_CHECK(st.ok()) << "--swap-attention: " << st.message();
    out.push_back(std::move(t));
  }
  return out;
}

void ActivationSwap::prefetch(int64_t layer) {
  auto it = layers_.find(layer);
  if (it == layers_.end() || reads_.count(layer)) return;
  const std::vector<Entry>* entries = &it->second;  // map nodes are stable
  // The buffers are allocated here, not on the thread, so that what the allocator counts at any
  // moment does not depend on how far the read has got.
  std::vector<Tensor> tensors;
  for (const Entry& e : *entries) tensors.push_back(Tensor::empty(e.shape, e.dtype));
  reads_[layer] = std::async(std::launch::async, [this, entries, tensors = std::move(tensors)]() mutable {
    for (size_t i = 0; i < tensors.size(); ++i) {
      const Status st = file_->read((*entries)[i].offset, tensors[i].raw(), (*entries)[i].bytes);
      GALE_CHECK(st.ok()) << "--swap-attention: " << st.message();
    }
    return std::move(tensors);
  });
}

void ActivationSwap::swap_in(int64_t layer, LayerSaved& saved) {
  auto it = layers_.find(layer);
  if (it == layers_.end()) return;
  std::vector<Tensor> tensors;
  auto r = reads_.find(layer);
  if (r != reads_.end()) {
    tensors = r->second.get();
    reads_.erase(r);
  } else {
    tensors = read(it->second);
  }
  for (size_t i = 0; i < tensors.size(); ++i) field(saved, it->second[i]) = std::move(tensors[i]);
  layers_.erase(it);
}

}  // namespace gale
