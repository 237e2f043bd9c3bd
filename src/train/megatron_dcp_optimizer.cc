// DCP's flattened keys of Megatron's torch_dcp optimizer state dict -> the nested dicts and lists torch.save keeps.
#include "train/megatron_dcp_optimizer.h"

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

namespace gale {

namespace {

bool all_digits(const std::string& s) {
  return !s.empty() && s.size() < 18 && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

// One level of the dotted keys: a leaf (the full key) or children by name.
struct Node {
  std::string key;  // the full DCP key of a leaf
  bool leaf = false;
  std::map<std::string, std::unique_ptr<Node>> children;
};

StatusOr<PyRef> build(const DcpCheckpoint& c, const Node& n, const std::string& name, const std::string& path,
                      const std::string& dir) {
  if (n.leaf) {
    if (c.tensors().count(n.key)) {
      GALE_ASSIGN_OR_RETURN(Tensor t, c.read_tensor(n.key));
      return PyValue::tensor(std::move(t));
    }
    return c.read_object(n.key);
  }
  const bool numbered = std::all_of(n.children.begin(), n.children.end(),
                                    [](const auto& kv) { return all_digits(kv.first); });
  if (numbered && name != "state") {  // a list: indices 0..n-1
    std::vector<std::pair<int64_t, const Node*>> items;
    for (const auto& [k, child] : n.children) items.emplace_back(std::stoll(k), child.get());
    std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    PyRef list = PyValue::list();
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].first != static_cast<int64_t>(i))
        return DataLoss(dir, ": torch_dcp keys '", path, ".<i>': expected the list indices 0..", items.size() - 1,
                        ", found ", items[i].first, " at position ", i);
      GALE_ASSIGN_OR_RETURN(PyRef v, build(c, *items[i].second, "", str_cat(path, ".", items[i].first), dir));
      list->items.push_back(std::move(v));
    }
    return list;
  }
  PyRef d = PyValue::dict();
  for (const auto& [k, child] : n.children) {
    GALE_ASSIGN_OR_RETURN(PyRef v, build(c, *child, k, path + "." + k, dir));
    if (numbered) {  // torch's optimizer 'state': {param index: {...}}
      d->entries.emplace_back(PyValue::integer(std::stoll(k)), std::move(v));
    } else {
      d->set(k, std::move(v));
    }
  }
  return d;
}

}  // namespace

StatusOr<PyRef> megatron_dcp_unflatten(const DcpCheckpoint& c, const std::string& prefix, const std::string& dir) {
  Node root;
  bool any = false;
  auto add = [&](const std::string& key) -> Status {
    if (key.rfind(prefix + ".", 0) != 0) return Status::Ok();
    any = true;
    Node* n = &root;
    size_t at = prefix.size() + 1;
    while (true) {
      if (n->leaf)
        return DataLoss(dir, ": torch_dcp key '", key, "' lies under '", n->key, "', which holds a value itself");
      const size_t dot = key.find('.', at);
      const std::string part = key.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
      std::unique_ptr<Node>& child = n->children[part];
      if (!child) child = std::make_unique<Node>();
      n = child.get();
      if (dot == std::string::npos) break;
      at = dot + 1;
    }
    if (n->leaf || !n->children.empty())
      return DataLoss(dir, ": torch_dcp key '", key, "' is both a value and a level of other keys");
    n->leaf = true;
    n->key = key;
    return Status::Ok();
  };
  for (const auto& [key, info] : c.tensors()) GALE_RETURN_IF_ERROR(add(key));
  for (const auto& [key, info] : c.objects()) GALE_RETURN_IF_ERROR(add(key));
  if (!any) return PyRef();
  return build(c, root, prefix, prefix, dir);
}

Status add_megatron_dcp_optimizer(const DcpCheckpoint& c, const std::string& dir, PyValue& root) {
  const PyValue* args = root.get("args");
  const PyValue* distributed = args ? args->attr("use_distributed_optimizer") : nullptr;
  if (distributed && distributed->kind == PyValue::kBool && distributed->b)
    return Unimplemented(dir, ": a torch_dcp checkpoint whose args record use_distributed_optimizer: not supported "
                         "(Megatron saves torch_dcp with --use-torch-fsdp2, which forbids the distributed optimizer; "
                         "expected FP32Optimizer's or Float16OptimizerWithFloat16Params's state): pass --no-load-optim "
                         "(or --finetune) to load the model weights and iteration only");
  for (const char* key : {"optimizer", "opt_param_scheduler"}) {
    GALE_ASSIGN_OR_RETURN(PyRef v, megatron_dcp_unflatten(c, key, dir));
    if (v) root.set(key, std::move(v));
  }
  return Status::Ok();
}

}  // namespace gale
