// torch.save's zip layout on top of the zip archive and pickle machine.
#include "ckpt/torch_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/zip_archive.h"

namespace gale {

namespace {

StatusOr<DType> dtype_of_storage(const std::string& type, const std::string& where) {
  static const std::map<std::string, DType> kTypes = {
      {"FloatStorage", DType::kF32}, {"BFloat16Storage", DType::kBF16}, {"HalfStorage", DType::kF16},
      {"DoubleStorage", DType::kF64}, {"LongStorage", DType::kI64},     {"IntStorage", DType::kI32},
      {"ByteStorage", DType::kU8},    {"BoolStorage", DType::kU8},      {"CharStorage", DType::kU8},
      {"UInt16Storage", DType::kU16}};
  auto it = kTypes.find(type);
  if (it == kTypes.end()) return Unimplemented(where, ": tensor storage type torch.", type, " is not supported yet");
  return it->second;
}

// Fills every kTensor's data (each storage once), walking the tree.
Status resolve(PyValue& v, const ZipArchive& z, const std::string& prefix, std::set<const PyValue*>& seen) {
  if (!seen.insert(&v).second) return Status::Ok();
  if (v.kind == PyValue::kTensor && !v.data.defined()) {
    const PyValue& st = *v.items.at(0);
    GALE_ASSIGN_OR_RETURN(DType dt, dtype_of_storage(st.storage_type, z.path()));
    const std::string entry = prefix + "data/" + st.s;
    GALE_ASSIGN_OR_RETURN(std::string_view bytes, z.entry(entry));
    const int64_t esize = dtype_size(dt);
    if (static_cast<int64_t>(bytes.size()) < st.i * esize)
      return DataLoss(z.path(), ": storage '", entry, "' holds ", bytes.size(), " bytes; its ", st.i, " elements of ",
                      st.storage_type, " need ", st.i * esize);
    int64_t expect = 1;
    for (size_t d = v.shape.size(); d-- > 0;) {
      if (v.shape[d] != 1 && v.stride[d] != expect)
        return Unimplemented(z.path(), ": a non-contiguous tensor of shape ", shape_string(v.shape),
                             " (strides not row-major) is not supported yet");
      expect *= v.shape[d];
    }
    const int64_t numel = shape_numel(v.shape);
    if (v.i < 0 || v.i + numel > st.i)
      return DataLoss(z.path(), ": a tensor of shape ", shape_string(v.shape), " at offset ", v.i,
                      " reaches past its storage '", entry, "' of ", st.i, " elements");
    v.data = Tensor::empty(v.shape, dt);
    if (numel > 0) std::memcpy(v.data.raw(), bytes.data() + v.i * esize, static_cast<size_t>(numel * esize));
    return Status::Ok();
  }
  for (auto& x : v.items) GALE_RETURN_IF_ERROR(resolve(*x, z, prefix, seen));
  for (auto& [k, x] : v.entries) GALE_RETURN_IF_ERROR(resolve(*x, z, prefix, seen));
  if (v.state) GALE_RETURN_IF_ERROR(resolve(*v.state, z, prefix, seen));
  return Status::Ok();
}

}  // namespace

StatusOr<PyRef> read_torch_bytes(std::string bytes, const std::string& path) {
  if (bytes.size() >= 2 && static_cast<uint8_t>(bytes[0]) == 0x80 && bytes[1] == 0x02)
    return Unimplemented(path, ": a torch.save file in the legacy (pre-1.6, non-zip) format: not supported yet (re-save "
                               "it with torch >= 1.6)");
  GALE_ASSIGN_OR_RETURN(ZipArchive z, ZipArchive::from_bytes(std::move(bytes), path));
  std::string prefix;
  bool found = false;
  for (const std::string& name : z.names()) {
    const size_t slash = name.find('/');
    if (slash != std::string::npos && name.substr(slash + 1) == "data.pkl") {
      prefix = name.substr(0, slash + 1);
      found = true;
      break;
    }
  }
  if (!found) return DataLoss(path, ": a zip archive without <name>/data.pkl: expected a file torch.save wrote");
  GALE_ASSIGN_OR_RETURN(std::string_view pkl, z.entry(prefix + "data.pkl"));
  if (z.has(prefix + "byteorder")) {
    GALE_ASSIGN_OR_RETURN(std::string_view order, z.entry(prefix + "byteorder"));
    if (order != "little") return Unimplemented(path, ": byteorder '", order, "': expected little");
  }
  GALE_ASSIGN_OR_RETURN(PyRef root, parse_pickle(pkl, path + " (" + prefix + "data.pkl)"));
  std::set<const PyValue*> seen;
  GALE_RETURN_IF_ERROR(resolve(*root, z, prefix, seen));
  return root;
}

StatusOr<PyRef> read_torch_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return read_torch_bytes(std::move(ss).str(), path);
}

StatusOr<std::string> write_torch_bytes(const PyValue& root, const std::string& stem) {
  std::vector<const PyValue*> tensors;
  GALE_ASSIGN_OR_RETURN(std::string pkl, write_pickle(root, &tensors));
  ZipWriter w;
  w.add(stem + "/data.pkl", pkl);
  w.add(stem + "/byteorder", "little");
  for (size_t k = 0; k < tensors.size(); ++k) {
    const Tensor& t = tensors[k]->data;
    w.add(stem + "/data/" + std::to_string(k), std::string_view(static_cast<const char*>(t.raw()), t.nbytes()));
  }
  w.add(stem + "/version", "3\n");
  return w.finish();
}

Status write_torch_file(const std::string& path, const PyValue& root) {
  GALE_ASSIGN_OR_RETURN(std::string bytes, write_torch_bytes(root, std::filesystem::path(path).stem().string()));
  return write_file_atomically(path, bytes);
}

}  // namespace gale
