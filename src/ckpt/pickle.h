// A reader and writer for the Python pickles torch.save writes (protocol 2): values as a small tree.
//
//   GALE_ASSIGN_OR_RETURN(PyRef root, parse_pickle(bytes, "ckpt/data.pkl"));
//   const PyValue* it = root->get("iteration");              // dict lookup by string key
//   if (it && it->kind == PyValue::kInt) ... it->i ...
//   std::string out = write_pickle(*root);                   // protocol 2 again
//
// Understood: dicts (also collections.OrderedDict and defaultdict), lists, sets (read as lists:
// set(...), frozenset, EMPTY_SET/ADDITEMS), tuples, str, bytes, int (any size
// that fits 64 bits), float, bool, None, the memo, GLOBAL (a kGlobal "module.name"), REDUCE,
// NEWOBJ and BUILD (a kObject of that class with its arguments and state; argparse.Namespace's
// attributes are its state dict, see attr()), BINPERSID (torch's storage references: a kStorage
// with storage type, key and element count) and torch._utils._rebuild_tensor_v2 /
// _rebuild_parameter (a kTensor: storage, offset, shape, stride). Any other class becomes an
// opaque kObject; unknown opcodes, a truncated stream or a stack underflow are errors naming the
// file (`what`), the byte offset and the opcode, never a crash.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace gale {

struct PyValue;
using PyRef = std::shared_ptr<PyValue>;

struct PyValue {
  enum Kind { kNone, kBool, kInt, kFloat, kString, kBytes, kList, kTuple, kDict, kGlobal, kObject, kStorage, kTensor };
  Kind kind = kNone;
  bool b = false;
  int64_t i = 0;       // kInt; kStorage: element count; kTensor: storage offset (elements)
  double f = 0;        // kFloat
  std::string s;       // kString / kBytes; kGlobal and kObject: "module.name"; kStorage: the storage key
  std::string storage_type;  // kStorage: "FloatStorage", "BFloat16Storage", ...; kTensor to write: overrides the dtype's ("BoolStorage")
  std::vector<PyRef> items;  // kList / kTuple; kObject: constructor arguments; kTensor: {storage}
  std::vector<std::pair<PyRef, PyRef>> entries;  // kDict
  bool ordered = false;  // kDict: written as a collections.OrderedDict (a module's state_dict())
  PyRef state;                                    // kObject: BUILD's state (argparse.Namespace: a kDict)
  Shape shape, stride;                            // kTensor
  Tensor data;  // kTensor for write_pickle's callers: the data to store (contiguous, `shape`)

  static PyRef none();
  static PyRef boolean(bool v);
  static PyRef integer(int64_t v);
  static PyRef real(double v);
  static PyRef str(std::string v);
  static PyRef dict();
  static PyRef ordered_dict();  // a kDict written as collections.OrderedDict
  static PyRef list();
  static PyRef tuple(std::vector<PyRef> items);
  static PyRef global(std::string name);
  // An object of `cls` (e.g. "argparse.Namespace") whose state is `state_dict` (a kDict).
  static PyRef object(std::string cls, PyRef state_dict);
  static PyRef tensor(Tensor t);

  // kDict: the value of string key `key`, or null.
  const PyValue* get(const std::string& key) const;
  // kDict: sets string key `key` (replacing an existing entry).
  void set(const std::string& key, PyRef value);
  // kObject with a dict state (argparse.Namespace): attribute `name`, or null.
  const PyValue* attr(const std::string& name) const;
  // "int", "dict", "argparse.Namespace", ... for messages.
  std::string type_name() const;
};

// Parses a protocol-2 pickle (`what` names the file in errors).
StatusOr<PyRef> parse_pickle(std::string_view bytes, const std::string& what);

// Protocol 2 of a value tree of None/bool/int/float/str/list/tuple/dict/global/object values and
// tensors; each kTensor is written as torch does (_rebuild_tensor_v2 over a persistent storage
// reference, requires_grad False) with storage key "k" for the k-th tensor met, which is appended
// to `tensors` (the caller stores its data as data/k).
// Bytes and kStorage values are not writable (InvalidArgument).
StatusOr<std::string> write_pickle(const PyValue& root, std::vector<const PyValue*>* tensors);

}  // namespace gale
