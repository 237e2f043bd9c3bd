// Punkt parameters from NLTK's pickled PunktSentenceTokenizer.
#include "train/punkt_pickle.h"

#include <fstream>
#include <sstream>

#include "ckpt/pickle.h"

namespace gale {
namespace {

// The attribute `name` of a pickled object (its BUILD state dict), or of a dict.
const PyValue* member(const PyValue& v, const std::string& name) {
  if (v.kind == PyValue::kDict) return v.get(name);
  if (v.kind == PyValue::kObject) return v.attr(name);
  return nullptr;
}

}  // namespace

StatusOr<PunktParameters> load_punkt_pickle(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("--split-sentences: cannot open the Punkt parameter file ", path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string bytes = ss.str();
  GALE_ASSIGN_OR_RETURN(PyRef root, parse_pickle(bytes, path));
  auto bad = [&](const std::string& what, const PyValue* found) {
    return InvalidArgument(path, ": expected ", what, ", found ", found ? found->type_name() : "nothing");
  };
  const PyValue* params = root.get();
  if (root->kind == PyValue::kObject && root->s != "nltk.tokenize.punkt.PunktParameters")
    params = member(*root, "_params");
  if (!params || params->kind != PyValue::kObject)
    return bad("a pickled nltk.tokenize.punkt.PunktSentenceTokenizer with _params", params ? params : root.get());
  PunktParameters p;
  auto strings = [&](const char* name, auto insert) -> Status {
    const PyValue* set = member(*params, name);
    if (!set || (set->kind != PyValue::kList && set->kind != PyValue::kTuple))
      return bad(std::string("_params.") + name + " (a set)", set);
    for (const PyRef& item : set->items) GALE_RETURN_IF_ERROR(insert(*item));
    return Status::Ok();
  };
  auto one_string = [&](const char* name, std::unordered_set<std::string>* out) {
    return strings(name, [&, name](const PyValue& item) -> Status {
      if (item.kind != PyValue::kString) return bad(std::string("strings in _params.") + name, &item);
      out->insert(item.s);
      return Status::Ok();
    });
  };
  GALE_RETURN_IF_ERROR(one_string("abbrev_types", &p.abbrev_types));
  GALE_RETURN_IF_ERROR(one_string("sent_starters", &p.sent_starters));
  GALE_RETURN_IF_ERROR(strings("collocations", [&](const PyValue& item) -> Status {
    if (item.kind != PyValue::kTuple || item.items.size() != 2 || item.items[0]->kind != PyValue::kString ||
        item.items[1]->kind != PyValue::kString)
      return bad("pairs of strings in _params.collocations", &item);
    p.collocations.insert({item.items[0]->s, item.items[1]->s});
    return Status::Ok();
  }));
  const PyValue* ortho = member(*params, "ortho_context");
  if (!ortho || ortho->kind != PyValue::kDict) return bad("_params.ortho_context (a dict)", ortho);
  for (const auto& [k, v] : ortho->entries) {
    if (k->kind != PyValue::kString || v->kind != PyValue::kInt || v->i < 0 || v->i > 0x7F)
      return bad("string keys and flags 0..127 in _params.ortho_context", v->kind == PyValue::kInt ? k.get() : v.get());
    p.ortho_context[k->s] = static_cast<int>(v->i);
  }
  return p;
}

}  // namespace gale
