// Gated DeltaNet (-2) in torch_dist: in_proj.weight.<section> / conv1d.weight.<section> joined into whole tensors.
#include "train/megatron_gdn_dist.h"

#include <algorithm>
#include <map>

#include "train/megatron_tp_split.h"

namespace gale {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The base name and section of `key` when it is a sectioned in_proj / conv1d key ("" otherwise).
std::string section_of(const std::string& key, std::string* base) {
  for (const char* t : {".self_attention.in_proj.weight.", ".self_attention.conv1d.weight."}) {
    const size_t at = key.find(t);
    if (at == std::string::npos) continue;
    const size_t end = at + std::string(t).size();
    const std::string sec = key.substr(end);
    if (sec.empty() || sec.find('.') != std::string::npos) continue;
    *base = key.substr(0, end - 1);
    return sec;
  }
  return "";
}

std::string joined_list(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

std::vector<std::string> megatron_gdn_in_proj_section_names(bool gdn2) {
  if (gdn2) return {"query", "key", "value", "z", "f", "b", "w"};
  return {"query", "key", "value", "z", "beta", "alpha"};
}

std::vector<std::string> megatron_gdn_conv_section_names() { return {"query", "key", "value"}; }

Status join_megatron_gdn_dist_sections(const MegatronGdnSizes& s, PyValue& model, const std::string& where) {
  if (model.kind != PyValue::kDict) return Internal(where, ": join_megatron_gdn_dist_sections of a non-dict");
  std::map<std::string, std::map<std::string, Tensor>> by_base;  // base -> section -> tensor
  std::vector<std::pair<PyRef, PyRef>> kept;
  for (auto& [k, v] : model.entries) {
    std::string base;
    const std::string sec = k->kind == PyValue::kString ? section_of(k->s, &base) : "";
    if (sec.empty() || v->kind != PyValue::kTensor) {
      kept.emplace_back(k, v);
      continue;
    }
    by_base[base][sec] = v->data;
  }
  for (auto& [base, sections] : by_base) {
    const bool in_proj = ends_with(base, "in_proj.weight");
    const std::vector<std::string> names =
        in_proj ? megatron_gdn_in_proj_section_names(s.gdn2) : megatron_gdn_conv_section_names();
    const std::vector<int64_t> rows = in_proj ? s.in_proj_sections() : s.conv_sections();
    for (const auto& [sec, t] : sections)
      if (std::find(names.begin(), names.end(), sec) == names.end())
        return DataLoss(where, ": tensor '", base, ".", sec, "': not a section of a Gated DeltaNet", s.gdn2 ? "-2" : "",
                        " model's ", in_proj ? "in_proj" : "conv1d", " (expected ", joined_list(names), ")");
    if (model.get(base) != nullptr)
      return DataLoss(where, ": tensor '", base, "' and its sections '", base, ".", sections.begin()->first,
                      "', ...: expected one or the other");
    Shape shape;
    int64_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      auto it = sections.find(names[i]);
      if (it == sections.end())
        return DataLoss(where, ": tensor '", base, ".", names[i], "' missing (Megatron's sharded ", base,
                        " has the sections ", joined_list(names), ")");
      const Tensor& t = it->second;
      if (t.ndim() == 0 || t.shape()[0] != rows[i])
        return DataLoss(where, ": tensor '", base, ".", names[i], "' of shape ", t.shape_string(), ": expected ",
                        rows[i], " rows (the args' Gated DeltaNet sizes), found ", t.ndim() ? t.shape()[0] : 0);
      if (i == 0) shape = t.shape();
      Shape a(t.shape().begin() + 1, t.shape().end()), b(shape.begin() + 1, shape.end());
      if (a != b || t.dtype() != sections.at(names[0]).dtype())
        return DataLoss(where, ": tensor '", base, ".", names[i], "' of shape ", t.shape_string(),
                        ": expected the row size and dtype of '", base, ".", names[0], "' (", shape_string(shape), ")");
      total += rows[i];
    }
    shape[0] = total;
    Tensor whole = Tensor::empty(shape, sections.at(names[0]).dtype());
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      megatron_copy_rows(sections.at(names[i]), 0, rows[i], whole, at);
      at += rows[i];
    }
    kept.emplace_back(PyValue::str(base), PyValue::tensor(std::move(whole)));
  }
  model.entries = std::move(kept);
  return Status::Ok();
}

}  // namespace gale
