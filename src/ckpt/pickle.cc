// The protocol-2 pickle machine torch.save's files need, and its inverse for the values Gale writes.
#include "ckpt/pickle.h"

#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

namespace gale {

PyRef PyValue::none() { return std::make_shared<PyValue>(); }
PyRef PyValue::boolean(bool v) {
  auto p = std::make_shared<PyValue>();
  p->kind = kBool;
  p->b = v;
  return p;
}
PyRef PyValue::integer(int64_t v) {
  auto p = std::make_shared<PyValue>();
  p->kind = kInt;
  p->i = v;
  return p;
}
PyRef PyValue::real(double v) {
  auto p = std::make_shared<PyValue>();
  p->kind = kFloat;
  p->f = v;
  return p;
}
PyRef PyValue::str(std::string v) {
  auto p = std::make_shared<PyValue>();
  p->kind = kString;
  p->s = std::move(v);
  return p;
}
PyRef PyValue::dict() {
  auto p = std::make_shared<PyValue>();
  p->kind = kDict;
  return p;
}
PyRef PyValue::ordered_dict() {
  PyRef p = dict();
  p->ordered = true;
  return p;
}
PyRef PyValue::list() {
  auto p = std::make_shared<PyValue>();
  p->kind = kList;
  return p;
}
PyRef PyValue::tuple(std::vector<PyRef> items) {
  auto p = std::make_shared<PyValue>();
  p->kind = kTuple;
  p->items = std::move(items);
  return p;
}
PyRef PyValue::global(std::string name) {
  auto p = std::make_shared<PyValue>();
  p->kind = kGlobal;
  p->s = std::move(name);
  return p;
}
PyRef PyValue::object(std::string cls, PyRef state_dict) {
  auto p = std::make_shared<PyValue>();
  p->kind = kObject;
  p->s = std::move(cls);
  p->state = std::move(state_dict);
  return p;
}
PyRef PyValue::tensor(Tensor t) {
  auto p = std::make_shared<PyValue>();
  p->kind = kTensor;
  p->shape = t.shape();
  p->data = std::move(t);
  return p;
}

const PyValue* PyValue::get(const std::string& key) const {
  if (kind != kDict) return nullptr;
  for (const auto& [k, v] : entries)
    if (k && k->kind == kString && k->s == key) return v.get();
  return nullptr;
}

void PyValue::set(const std::string& key, PyRef value) {
  for (auto& [k, v] : entries)
    if (k && k->kind == kString && k->s == key) {
      v = std::move(value);
      return;
    }
  entries.emplace_back(str(key), std::move(value));
}

const PyValue* PyValue::attr(const std::string& name) const {
  if (kind != kObject || !state) return nullptr;
  return state->get(name);
}

std::string PyValue::type_name() const {
  switch (kind) {
    case kNone: return "None";
    case kBool: return "bool";
    case kInt: return "int";
    case kFloat: return "float";
    case kString: return "str";
    case kBytes: return "bytes";
    case kList: return "list";
    case kTuple: return "tuple";
    case kDict: return "dict";
    case kGlobal: return "global " + s;
    case kObject: return s;
    case kStorage: return "torch." + storage_type;
    case kTensor: return "torch.Tensor";
  }
  return "?";
}

namespace {

// The children of a value, in order: items, then each entry's key and value, then the state.
size_t child_count(const PyValue& v) { return v.items.size() + 2 * v.entries.size() + (v.state ? 1 : 0); }
const PyRef& child(const PyValue& v, size_t k) {
  if (k < v.items.size()) return v.items[k];
  k -= v.items.size();
  if (k < 2 * v.entries.size()) return k % 2 ? v.entries[k / 2].second : v.entries[k / 2].first;
  return v.state;
}

// Whether the values under `root` form a tree-like graph (shared values allowed, no cycle) at most
// `limit` deep. Iterative: a hostile pickle cannot exhaust the stack here.
bool bounded_acyclic(const PyValue* root, size_t limit) {
  std::unordered_map<const PyValue*, int> colour;  // 1: on the current path, 2: done
  std::vector<std::pair<const PyValue*, size_t>> path{{root, 0}};
  colour[root] = 1;
  while (!path.empty()) {
    auto& [v, next] = path.back();
    if (next == child_count(*v)) {
      colour[v] = 2;
      path.pop_back();
      continue;
    }
    const PyValue* c = child(*v, next++).get();
    if (c == nullptr) continue;
    int& seen = colour[c];
    if (seen == 1) return false;  // a cycle
    if (seen == 2) continue;
    if (path.size() >= limit) return false;
    seen = 1;
    path.emplace_back(c, 0);
  }
  return true;
}

// Empties every container reachable from `roots` (iteratively), so that reference cycles a hostile
// pickle built are broken and deep chains are freed without recursion.
void dismantle(const std::vector<PyRef>& roots, const std::unordered_set<const PyValue*>& keep = {}) {
  std::vector<PyRef> all, todo(roots.begin(), roots.end());
  std::unordered_set<const PyValue*> seen;
  while (!todo.empty()) {
    PyRef v = std::move(todo.back());
    todo.pop_back();
    if (!v || keep.count(v.get()) || !seen.insert(v.get()).second) continue;
    for (size_t k = 0; k < child_count(*v); ++k) todo.push_back(child(*v, k));
    all.push_back(std::move(v));
  }
  for (const PyRef& v : all) {
    v->items.clear();
    v->entries.clear();
    v->state.reset();
  }
}

// Nesting deeper than this, or a reference cycle, is no torch.save state dict (which nests a few levels).
constexpr size_t kMaxDepth = 256;

class Machine {
 public:
  Machine(std::string_view b, const std::string& what) : b_(b), what_(what) {}
  ~Machine() {
    std::vector<PyRef> held = stack_;
    for (const auto& [k, v] : memo_) held.push_back(v);
    std::unordered_set<const PyValue*> keep;  // the result's values stay intact
    if (result_) {
      std::vector<const PyValue*> todo{result_.get()};
      while (!todo.empty()) {
        const PyValue* v = todo.back();
        todo.pop_back();
        if (!keep.insert(v).second) continue;
        for (size_t k = 0; k < child_count(*v); ++k)
          if (child(*v, k)) todo.push_back(child(*v, k).get());
      }
    }
    dismantle(held, keep);
  }

  StatusOr<PyRef> run() {
    while (true) {
      if (pos_ >= b_.size()) return error("the stream ends before STOP (truncated?)");
      op_at_ = pos_;
      op_ = static_cast<uint8_t>(b_[pos_++]);
      switch (op_) {
        case 0x80: {  // PROTO
          GALE_ASSIGN_OR_RETURN(uint64_t v, le(1));
          if (v > 5) return error(str_cat("protocol ", v, " (expected 2 to 5)"));
          break;
        }
        case 0x95: GALE_RETURN_IF_ERROR(le(8).status()); break;  // FRAME (protocol 4)
        case '.': {  // STOP
          GALE_ASSIGN_OR_RETURN(PyRef v, pop());
          if (!bounded_acyclic(v.get(), kMaxDepth)) {
            stack_.push_back(v);  // dismantled with the rest
            return error(str_cat("the values nest deeper than ", kMaxDepth, " levels or refer to themselves"));
          }
          result_ = v;
          return v;
        }
        case '(': marks_.push_back(stack_.size()); break;
        case 'N': push(PyValue::none()); break;
        case 0x88: push(PyValue::boolean(true)); break;
        case 0x89: push(PyValue::boolean(false)); break;
        case 'J': {
          GALE_ASSIGN_OR_RETURN(uint64_t v, le(4));
          push(PyValue::integer(static_cast<int32_t>(static_cast<uint32_t>(v))));
          break;
        }
        case 'K': {
          GALE_ASSIGN_OR_RETURN(uint64_t v, le(1));
          push(PyValue::integer(static_cast<int64_t>(v)));
          break;
        }
        case 'M': {
          GALE_ASSIGN_OR_RETURN(uint64_t v, le(2));
          push(PyValue::integer(static_cast<int64_t>(v)));
          break;
        }
        case 0x8a: {  // LONG1: little-endian two's complement of n bytes
          GALE_ASSIGN_OR_RETURN(uint64_t n, le(1));
          if (n > 8) return error(str_cat("an integer of ", n, " bytes (at most 8 are supported)"));
          GALE_ASSIGN_OR_RETURN(uint64_t v, le(static_cast<int>(n)));
          if (n > 0 && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
          push(PyValue::integer(static_cast<int64_t>(v)));
          break;
        }
        case 'G': {  // BINFLOAT: big-endian double
          if (!need(8)) return error("truncated float");
          uint64_t v = 0;
          for (int k = 0; k < 8; ++k) v = (v << 8) | static_cast<uint8_t>(b_[pos_ + k]);
          pos_ += 8;
          double d;
          std::memcpy(&d, &v, 8);
          push(PyValue::real(d));
          break;
        }
        case 'X': case 'T': case 0x8c: case 'U': case 'B': case 'C': case 0x8e: {
          const int width = (op_ == 0x8c || op_ == 'U' || op_ == 'C') ? 1 : op_ == 0x8e ? 8 : 4;
          GALE_ASSIGN_OR_RETURN(uint64_t n, le(width));
          if (!need(n)) return error(str_cat("a string of ", n, " bytes runs past the end"));
          PyRef v = PyValue::str(std::string(b_.substr(pos_, n)));
          if (op_ == 'B' || op_ == 'C' || op_ == 0x8e) v->kind = PyValue::kBytes;
          pos_ += n;
          push(v);
          break;
        }
        case '}': push(PyValue::dict()); break;
        case ']': push(PyValue::list()); break;
        case 0x8f: push(PyValue::list()); break;  // EMPTY_SET: a set is read as a list
        case 0x90: {                              // ADDITEMS
          GALE_ASSIGN_OR_RETURN(std::vector<PyRef> items, pop_mark());
          GALE_ASSIGN_OR_RETURN(PyRef set, top(PyValue::kList));
          set->items.insert(set->items.end(), items.begin(), items.end());
          break;
        }
        case 0x91: {  // FROZENSET
          GALE_ASSIGN_OR_RETURN(std::vector<PyRef> items, pop_mark());
          PyRef set = PyValue::list();
          set->items = std::move(items);
          push(set);
          break;
        }
        case ')': push(PyValue::tuple({})); break;
        case 'd': case 'l': case 't': {
          GALE_ASSIGN_OR_RETURN(std::vector<PyRef> items, pop_mark());
          if (op_ == 't') {
            push(PyValue::tuple(std::move(items)));
          } else if (op_ == 'l') {
            PyRef l = PyValue::list();
            l->items = std::move(items);
            push(l);
          } else {
            if (items.size() % 2) return error("DICT with an odd number of items");
            PyRef d = PyValue::dict();
            for (size_t k = 0; k < items.size(); k += 2) d->entries.emplace_back(items[k], items[k + 1]);
            push(d);
          }
          break;
        }
        case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
          std::vector<PyRef> items(op_ - 0x84);
          for (size_t k = items.size(); k-- > 0;) {
            GALE_ASSIGN_OR_RETURN(items[k], pop());
          }
          push(PyValue::tuple(std::move(items)));
          break;
        }
        case 'q': case 'r': case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
          uint64_t idx = memo_.size();
          if (op_ != 0x94) {
            GALE_ASSIGN_OR_RETURN(idx, le(op_ == 'q' ? 1 : 4));
          }
          if (stack_.empty()) return error("memo store with an empty stack");
          memo_[idx] = stack_.back();
          break;
        }
        case 'h': case 'j': {  // BINGET, LONG_BINGET
          GALE_ASSIGN_OR_RETURN(uint64_t idx, le(op_ == 'h' ? 1 : 4));
          auto it = memo_.find(idx);
          if (it == memo_.end()) return error(str_cat("memo entry ", idx, " was never stored"));
          push(it->second);
          break;
        }
        case 'a': {  // APPEND
          GALE_ASSIGN_OR_RETURN(PyRef v, pop());
          GALE_ASSIGN_OR_RETURN(PyRef l, top(PyValue::kList));
          l->items.push_back(v);
          break;
        }
        case 'e': {  // APPENDS
          GALE_ASSIGN_OR_RETURN(std::vector<PyRef> items, pop_mark());
          GALE_ASSIGN_OR_RETURN(PyRef l, top(PyValue::kList));
          for (auto& v : items) l->items.push_back(v);
          break;
        }
        case 's': {  // SETITEM
          GALE_ASSIGN_OR_RETURN(PyRef v, pop());
          GALE_ASSIGN_OR_RETURN(PyRef k, pop());
          GALE_ASSIGN_OR_RETURN(PyRef d, top(PyValue::kDict));
          d->entries.emplace_back(k, v);
          break;
        }
        case 'u': {  // SETITEMS
          GALE_ASSIGN_OR_RETURN(std::vector<PyRef> items, pop_mark());
          if (items.size() % 2) return error("SETITEMS with an odd number of items");
          GALE_ASSIGN_OR_RETURN(PyRef d, top(PyValue::kDict));
          for (size_t k = 0; k < items.size(); k += 2) d->entries.emplace_back(items[k], items[k + 1]);
          break;
        }
        case 'c': {  // GLOBAL "module\nname\n"
          GALE_ASSIGN_OR_RETURN(std::string module, line());
          GALE_ASSIGN_OR_RETURN(std::string name, line());
          push(PyValue::global(module + "." + name));
          break;
        }
        case 0x93: {  // STACK_GLOBAL
          GALE_ASSIGN_OR_RETURN(PyRef name, pop());
          GALE_ASSIGN_OR_RETURN(PyRef module, pop());
          push(PyValue::global(module->s + "." + name->s));
          break;
        }
        case 'R': case 0x81: {  // REDUCE, NEWOBJ: callable/class and an argument tuple
          GALE_ASSIGN_OR_RETURN(PyRef args, pop());
          GALE_ASSIGN_OR_RETURN(PyRef callable, pop());
          if (args->kind != PyValue::kTuple) return error("REDUCE/NEWOBJ arguments are not a tuple");
          GALE_ASSIGN_OR_RETURN(PyRef v, call(*callable, args->items));
          push(v);
          break;
        }
        case 'b': {  // BUILD
          GALE_ASSIGN_OR_RETURN(PyRef state, pop());
          if (stack_.empty()) return error("BUILD with an empty stack");
          PyRef obj = stack_.back();
          if (obj->kind == PyValue::kObject) obj->state = state;
          // Other values (an OrderedDict's or a tensor's extra state): ignored.
          break;
        }
        case 'Q': {  // BINPERSID: torch's ('storage', storage_type, key, location, numel)
          GALE_ASSIGN_OR_RETURN(PyRef pid, pop());
          if (pid->kind != PyValue::kTuple || pid->items.size() < 5 || pid->items[0]->kind != PyValue::kString ||
              pid->items[0]->s != "storage" || pid->items[1]->kind != PyValue::kGlobal ||
              pid->items[2]->kind != PyValue::kString || pid->items[4]->kind != PyValue::kInt)
            return error("a persistent id other than torch's ('storage', type, key, location, numel)");
          auto st = std::make_shared<PyValue>();
          st->kind = PyValue::kStorage;
          const std::string& type = pid->items[1]->s;
          st->storage_type = type.rfind("torch.", 0) == 0 ? type.substr(6) : type;
          st->s = pid->items[2]->s;
          st->i = pid->items[4]->i;
          push(st);
          break;
        }
        case '0': GALE_RETURN_IF_ERROR(pop().status()); break;  // POP
        case '2': {  // DUP
          if (stack_.empty()) return error("DUP with an empty stack");
          push(stack_.back());
          break;
        }
        default: return error(str_cat("unsupported opcode 0x", hex(op_)));
      }
    }
  }

 private:
  static std::string hex(uint8_t v) {
    const char* d = "0123456789abcdef";
    return std::string{d[v >> 4], d[v & 15]};
  }
  Status error(const std::string& what) const {
    return DataLoss(what_, ": pickle opcode 0x", hex(op_), " at byte ", op_at_, ": ", what);
  }
  bool need(uint64_t n) const { return n <= b_.size() - pos_; }
  StatusOr<uint64_t> le(int n) {
    if (!need(static_cast<uint64_t>(n))) return error("truncated operand");
    uint64_t v = 0;
    for (int k = n - 1; k >= 0; --k) v = (v << 8) | static_cast<uint8_t>(b_[pos_ + k]);
    pos_ += n;
    return v;
  }
  StatusOr<std::string> line() {
    const size_t end = b_.find('\n', pos_);
    if (end == std::string_view::npos) return error("unterminated GLOBAL name");
    std::string s(b_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return s;
  }
  void push(PyRef v) {
    stack_.push_back(std::move(v));
  }
  StatusOr<PyRef> pop() {
    if (stack_.empty()) return error("stack underflow");
    PyRef v = stack_.back();
    stack_.pop_back();
    return v;
  }
  StatusOr<PyRef> top(PyValue::Kind kind) {
    if (stack_.empty()) return error("stack underflow");
    if (stack_.back()->kind != kind)
      return error(str_cat("expected a ", kind == PyValue::kDict ? "dict" : "list", " below, found ",
                           stack_.back()->type_name()));
    return stack_.back();
  }
  StatusOr<std::vector<PyRef>> pop_mark() {
    if (marks_.empty()) return error("no MARK");
    const size_t m = marks_.back();
    marks_.pop_back();
    if (m > stack_.size()) return error("stack underflow below MARK");
    std::vector<PyRef> items(stack_.begin() + static_cast<std::ptrdiff_t>(m), stack_.end());
    stack_.resize(m);
    return items;
  }
  static bool all_ints(const PyValue& t) {
    if (t.kind != PyValue::kTuple) return false;
    for (const auto& v : t.items)
      if (v->kind != PyValue::kInt) return false;
    return true;
  }
  StatusOr<PyRef> call(const PyValue& callable, const std::vector<PyRef>& args) {
    const std::string name = callable.kind == PyValue::kGlobal ? callable.s : callable.type_name();
    if (name == "collections.OrderedDict" || name == "builtins.dict" || name == "collections.defaultdict") {
      PyRef d = PyValue::dict();
      d->ordered = name == "collections.OrderedDict";
      return d;
    }
    if (name == "builtins.set" || name == "__builtin__.set" || name == "builtins.frozenset" ||
        name == "__builtin__.frozenset") {  // set(iterable): read as a list of its items
      PyRef set = PyValue::list();
      if (!args.empty() && (args[0]->kind == PyValue::kList || args[0]->kind == PyValue::kTuple))
        set->items = args[0]->items;
      return set;
    }
    if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor") {
      if (args.size() < 4 || args[0]->kind != PyValue::kStorage || args[1]->kind != PyValue::kInt ||
          !all_ints(*args[2]) || !all_ints(*args[3]) || args[2]->items.size() != args[3]->items.size())
        return error("_rebuild_tensor_v2 arguments: expected (storage, offset, size, stride, ...)");
      auto t = std::make_shared<PyValue>();
      t->kind = PyValue::kTensor;
      t->items = {args[0]};
      t->i = args[1]->i;
      for (const auto& v : args[2]->items) t->shape.push_back(v->i);
      for (const auto& v : args[3]->items) t->stride.push_back(v->i);
      return t;
    }
    if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      if (args.empty() || args[0]->kind != PyValue::kTensor) return error("_rebuild_parameter without a tensor");
      return args[0];
    }
    auto obj = std::make_shared<PyValue>();  // any other class: an opaque object
    obj->kind = PyValue::kObject;
    obj->s = name;
    obj->items = args;
    return obj;
  }

  std::string_view b_;
  const std::string& what_;
  size_t pos_ = 0, op_at_ = 0;
  uint8_t op_ = 0;
  std::vector<PyRef> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, PyRef> memo_;
  PyRef result_;
};

// --- writer ---

void put_u32(std::string& o, uint32_t v) {
  for (int k = 0; k < 4; ++k) o.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
}

void put_int(std::string& o, int64_t v) {
  if (v >= 0 && v < 256) {
    o.push_back('K');
    o.push_back(static_cast<char>(v));
  } else if (v >= 0 && v < 65536) {
    o.push_back('M');
    o.push_back(static_cast<char>(v & 0xff));
    o.push_back(static_cast<char>(v >> 8));
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    o.push_back('J');
    put_u32(o, static_cast<uint32_t>(static_cast<int32_t>(v)));
  } else {
    o.push_back(static_cast<char>(0x8a));
    o.push_back(8);
    for (int k = 0; k < 8; ++k) o.push_back(static_cast<char>((static_cast<uint64_t>(v) >> (8 * k)) & 0xff));
  }
}

void put_str(std::string& o, const std::string& s) {
  o.push_back('X');
  put_u32(o, static_cast<uint32_t>(s.size()));
  o += s;
}

void put_global(std::string& o, const std::string& dotted) {
  const size_t dot = dotted.rfind('.');
  o.push_back('c');
  o += dotted.substr(0, dot) + "\n" + dotted.substr(dot + 1) + "\n";
}

const char* storage_type_of(DType t) {
  switch (t) {
    case DType::kF32: return "FloatStorage";
    case DType::kBF16: return "BFloat16Storage";
    case DType::kF16: return "HalfStorage";
    case DType::kF64: return "DoubleStorage";
    case DType::kI64: return "LongStorage";
    case DType::kI32: return "IntStorage";
    case DType::kU8: return "ByteStorage";
    case DType::kU16: return "UInt16Storage";  // torch.uint16 (torch >= 2.3)
  }
  return nullptr;
}

Status encode(const PyValue& v, std::string& o, std::vector<const PyValue*>* tensors) {
  switch (v.kind) {
    case PyValue::kNone: o.push_back('N'); return Status::Ok();
    case PyValue::kBool: o.push_back(static_cast<char>(v.b ? 0x88 : 0x89)); return Status::Ok();
    case PyValue::kInt: put_int(o, v.i); return Status::Ok();
    case PyValue::kFloat: {
      uint64_t bits;
      std::memcpy(&bits, &v.f, 8);
      o.push_back('G');
      for (int k = 7; k >= 0; --k) o.push_back(static_cast<char>((bits >> (8 * k)) & 0xff));
      return Status::Ok();
    }
    case PyValue::kString: put_str(o, v.s); return Status::Ok();
    case PyValue::kGlobal: put_global(o, v.s); return Status::Ok();
    case PyValue::kList:
    case PyValue::kTuple:
      o.push_back(v.kind == PyValue::kList ? ']' : '(');
      if (v.kind == PyValue::kList && !v.items.empty()) o.push_back('(');
      for (const auto& x : v.items) GALE_RETURN_IF_ERROR(encode(*x, o, tensors));
      if (v.kind == PyValue::kList) {
        if (!v.items.empty()) o.push_back('e');
      } else {
        o.push_back('t');
      }
      return Status::Ok();
    case PyValue::kDict:
      if (v.ordered) {  // OrderedDict() by REDUCE, then SETITEMS, as pickle writes one
        put_global(o, "collections.OrderedDict");
        o.push_back(')');
        o.push_back('R');
      } else {
        o.push_back('}');
      }
      if (v.entries.empty()) return Status::Ok();
      o.push_back('(');
      for (const auto& [k, x] : v.entries) {
        GALE_RETURN_IF_ERROR(encode(*k, o, tensors));
        GALE_RETURN_IF_ERROR(encode(*x, o, tensors));
      }
      o.push_back('u');
      return Status::Ok();
    case PyValue::kObject:  // cls.__new__(cls) then BUILD with its state, as pickle writes a Namespace
      put_global(o, v.s);
      o.push_back(')');
      o.push_back(static_cast<char>(0x81));
      if (v.state) {
        GALE_RETURN_IF_ERROR(encode(*v.state, o, tensors));
        o.push_back('b');
      }
      return Status::Ok();
    case PyValue::kTensor: {
      // storage_type set on a kTensor names the storage (a u8 tensor written as "BoolStorage").
      const char* type = v.storage_type.empty() ? storage_type_of(v.data.dtype()) : v.storage_type.c_str();
      if (!v.data.defined() || type == nullptr)
        return InvalidArgument("write_pickle: a tensor without data, or of a dtype torch has no storage for");
      const std::string key = std::to_string(tensors->size());
      tensors->push_back(&v);
      put_global(o, "torch._utils._rebuild_tensor_v2");
      o.push_back('(');
      // the storage: BINPERSID of ('storage', torch.<Type>Storage, key, 'cpu', numel)
      o.push_back('(');
      put_str(o, "storage");
      put_global(o, std::string("torch.") + type);
      put_str(o, key);
      put_str(o, "cpu");
      put_int(o, v.data.numel());
      o.push_back('t');
      o.push_back('Q');
      put_int(o, 0);  // storage offset
      o.push_back('(');
      for (int64_t d : v.data.shape()) put_int(o, d);
      o.push_back('t');
      o.push_back('(');
      int64_t stride = 1;
      std::vector<int64_t> strides(v.data.shape().size());
      for (size_t d = strides.size(); d-- > 0;) {
        strides[d] = stride;
        stride *= v.data.shape()[d];
      }
      for (int64_t s : strides) put_int(o, s);
      o.push_back('t');
      o.push_back(static_cast<char>(0x89));  // requires_grad False
      put_global(o, "collections.OrderedDict");
      o.push_back(')');
      o.push_back('R');  // backward hooks: OrderedDict()
      o.push_back('t');
      o.push_back('R');
      return Status::Ok();
    }
    case PyValue::kBytes:
    case PyValue::kStorage: break;
  }
  return InvalidArgument("write_pickle: cannot write a value of type ", v.type_name());
}

}  // namespace

StatusOr<PyRef> parse_pickle(std::string_view bytes, const std::string& what) {
  Machine m(bytes, what);
  return m.run();
}

StatusOr<std::string> write_pickle(const PyValue& root, std::vector<const PyValue*>* tensors) {
  std::string o;
  o.push_back(static_cast<char>(0x80));
  o.push_back(2);
  GALE_RETURN_IF_ERROR(encode(root, o, tensors));
  o.push_back('.');
  return o;
}

}  // namespace gale
