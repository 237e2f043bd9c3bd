// torch.distributed.checkpoint's .metadata index and .distcp pieces -> global tensors and objects.
#include "ckpt/dcp_reader.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/torch_file.h"

namespace gale {

namespace {

// A dataclass field: BUILD's state is a dict, or (None, slots-dict) for slotted classes.
const PyValue* field(const PyValue* obj, const std::string& name) {
  if (obj == nullptr || obj->kind != PyValue::kObject || !obj->state) return nullptr;
  const PyValue& st = *obj->state;
  if (st.kind == PyValue::kDict) return st.get(name);
  if (st.kind == PyValue::kTuple && st.items.size() == 2) {
    if (const PyValue* v = st.items[1]->get(name)) return v;
    return st.items[0]->get(name);
  }
  return nullptr;
}

// A torch.Size (REDUCE of torch.Size over a tuple of ints) or a plain tuple/list of ints.
bool size_of(const PyValue* v, Shape* out) {
  if (v == nullptr) return false;
  if (v->kind == PyValue::kObject && v->s == "torch.Size" && v->items.size() == 1) v = v->items[0].get();
  if (v->kind != PyValue::kTuple && v->kind != PyValue::kList) return false;
  out->clear();
  for (const auto& x : v->items) {
    if (x->kind != PyValue::kInt) return false;
    out->push_back(x->i);
  }
  return true;
}

std::string class_of(const PyValue* v) { return v && v->kind == PyValue::kObject ? v->s : std::string(); }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::string> read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the file");
  std::stringstream ss;
  ss << in.rdbuf();
  return std::move(ss).str();
}

}  // namespace

bool dtype_of_torch_name(const std::string& name, DType* out) {
  static const std::pair<const char*, DType> kTypes[] = {
      {"torch.float32", DType::kF32}, {"torch.bfloat16", DType::kBF16}, {"torch.float16", DType::kF16},
      {"torch.float64", DType::kF64}, {"torch.int64", DType::kI64},     {"torch.int32", DType::kI32},
      {"torch.uint8", DType::kU8},    {"torch.bool", DType::kU8}};
  for (const auto& [n, t] : kTypes)
    if (name == n) {
      *out = t;
      return true;
    }
  return false;
}

StatusOr<DcpCheckpoint> DcpCheckpoint::open(const std::string& dir) {
  GALE_ASSIGN_OR_RETURN(std::string bytes, read_whole(dir + "/.metadata"));
  return from_metadata(bytes, dir);
}

StatusOr<DcpCheckpoint> DcpCheckpoint::from_metadata(std::string_view bytes, const std::string& dir) {
  DcpCheckpoint c;
  c.dir_ = dir;
  const std::string path = dir + "/.metadata";
  GALE_ASSIGN_OR_RETURN(PyRef root, parse_pickle(bytes, path));
  // Megatron core_v0.14+ saves its subclass MCoreMetadata (adding mcore_data, which Gale does not need).
  if (!ends_with(class_of(root.get()), ".Metadata") && !ends_with(class_of(root.get()), ".MCoreMetadata"))
    return DataLoss(path, ": expected torch.distributed.checkpoint's Metadata, found ", root->type_name());
  const PyValue* sd = field(root.get(), "state_dict_metadata");
  const PyValue* storage = field(root.get(), "storage_data");
  if (sd == nullptr || sd->kind != PyValue::kDict)
    return DataLoss(path, ": expected Metadata.state_dict_metadata (a dict), found ", sd ? sd->type_name() : "none");
  if (storage == nullptr || storage->kind != PyValue::kDict)
    return DataLoss(path, ": expected Metadata.storage_data (a dict), found ", storage ? storage->type_name() : "none");
  // (fqn, offsets) -> the byte range; objects have no offsets.
  std::map<std::pair<std::string, Shape>, DcpChunk> ranges;
  for (const auto& [k, v] : storage->entries) {
    const PyValue* fqn = field(k.get(), "fqn");
    const PyValue* file = field(v.get(), "relative_path");
    const PyValue* off = field(v.get(), "offset");
    const PyValue* len = field(v.get(), "length");
    if (!fqn || fqn->kind != PyValue::kString || !file || file->kind != PyValue::kString || !off ||
        off->kind != PyValue::kInt || !len || len->kind != PyValue::kInt || off->i < 0 || len->i < 0)
      return DataLoss(path, ": a storage_data entry that is not MetadataIndex(fqn, offset, index) -> "
                            "_StorageInfo(relative_path, offset, length): ", k->type_name(), " -> ", v->type_name());
    if (file->s.find("..") != std::string::npos || file->s.find('/') != std::string::npos)
      return DataLoss(path, ": storage file '", file->s, "' of '", fqn->s, "' is not a file name in the directory");
    Shape offsets;
    const PyValue* o = field(k.get(), "offset");
    if (o && o->kind != PyValue::kNone && !size_of(o, &offsets))
      return DataLoss(path, ": the offset of '", fqn->s, "' in storage_data is not a torch.Size");
    DcpChunk chunk;
    chunk.offsets = offsets;
    chunk.file = file->s;
    chunk.offset = off->i;
    chunk.length = len->i;
    ranges[{fqn->s, offsets}] = chunk;
  }
  for (const auto& [k, v] : sd->entries) {
    if (k->kind != PyValue::kString) return DataLoss(path, ": a state_dict_metadata key that is not a string");
    const std::string cls = class_of(v.get());
    if (ends_with(cls, ".BytesStorageMetadata")) {
      auto it = ranges.find({k->s, Shape{}});
      if (it == ranges.end()) return DataLoss(path, ": object '", k->s, "' has no storage_data entry");
      c.objects_[k->s] = it->second;
      continue;
    }
    if (!ends_with(cls, ".TensorStorageMetadata"))
      return DataLoss(path, ": '", k->s, "': expected TensorStorageMetadata or BytesStorageMetadata, found ",
                      v->type_name());
    DcpTensorInfo info;
    if (!size_of(field(v.get(), "size"), &info.shape))
      return DataLoss(path, ": tensor '", k->s, "' has no size (torch.Size)");
    const PyValue* props = field(v.get(), "properties");
    const PyValue* dtype = nullptr;
    if (props && props->kind == PyValue::kObject && props->state) {
      if (props->state->kind == PyValue::kTuple && !props->state->items.empty()) dtype = props->state->items[0].get();
      else dtype = field(props, "dtype");
    }
    if (dtype == nullptr || dtype->kind != PyValue::kGlobal)
      return DataLoss(path, ": tensor '", k->s, "' has no dtype in its TensorProperties");
    info.torch_dtype = dtype->s;
    info.dtype_known = dtype_of_torch_name(dtype->s, &info.dtype);
    const PyValue* chunks = field(v.get(), "chunks");
    if (chunks == nullptr || chunks->kind != PyValue::kList)
      return DataLoss(path, ": tensor '", k->s, "' has no chunk list");
    int64_t covered = 0;
    for (const auto& ch : chunks->items) {
      Shape offsets, sizes;
      if (!size_of(field(ch.get(), "offsets"), &offsets) || !size_of(field(ch.get(), "sizes"), &sizes) ||
          offsets.size() != info.shape.size() || sizes.size() != info.shape.size())
        return DataLoss(path, ": tensor '", k->s, "' of shape ", shape_string(info.shape),
                        ": a chunk whose offsets/sizes are not torch.Size of its rank");
      for (size_t d = 0; d < sizes.size(); ++d)
        if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] + sizes[d] > info.shape[d])
          return DataLoss(path, ": tensor '", k->s, "' of shape ", shape_string(info.shape), ": chunk at ",
                          shape_string(offsets), " of size ", shape_string(sizes), " reaches outside it");
      auto it = ranges.find({k->s, offsets});
      if (it == ranges.end())
        return DataLoss(path, ": tensor '", k->s, "': the chunk at ", shape_string(offsets), " has no storage_data entry");
      DcpChunk chunk = it->second;
      chunk.sizes = sizes;
      info.chunks.push_back(chunk);
      covered += shape_numel(sizes);
    }
    if (covered != shape_numel(info.shape))
      return DataLoss(path, ": tensor '", k->s, "' of shape ", shape_string(info.shape), " (", shape_numel(info.shape),
                      " elements): its chunks hold ", covered);
    c.tensors_[k->s] = std::move(info);
  }
  return c;
}

StatusOr<std::string> DcpCheckpoint::read_range(const DcpChunk& c, const std::string& key) const {
  const std::string path = dir_ + "/" + c.file;
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open the file (holds '", key, "' per ", dir_, "/.metadata)");
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (c.offset + c.length > size)
    return DataLoss(path, ": '", key, "' is recorded at bytes [", c.offset, ", ", c.offset + c.length,
                    ") but the file holds ", size);
  std::string bytes(static_cast<size_t>(c.length), '\0');
  in.seekg(c.offset);
  in.read(bytes.data(), c.length);
  if (!in) return IOError(path, ": cannot read '", key, "'");
  return bytes;
}

StatusOr<Tensor> DcpCheckpoint::read_tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) return NotFound(dir_, "/.metadata: no tensor '", key, "'");
  const DcpTensorInfo& info = it->second;
  if (!info.dtype_known)
    return Unimplemented(dir_, ": tensor '", key, "' has dtype ", info.torch_dtype,
                         ": not supported yet (float32, bfloat16, float16, float64, int64, int32, uint8, bool are)");
  Tensor out = Tensor::empty(info.shape, info.dtype);
  const int64_t es = dtype_size(info.dtype), ndim = static_cast<int64_t>(info.shape.size());
  for (const DcpChunk& c : info.chunks) {
    GALE_ASSIGN_OR_RETURN(std::string bytes, read_range(c, key));
    const std::string where = str_cat(dir_, "/", c.file, " at byte ", c.offset);
    GALE_ASSIGN_OR_RETURN(PyRef piece, read_torch_bytes(std::move(bytes), where));
    if (piece->kind != PyValue::kTensor)
      return DataLoss(where, ": '", key, "': expected a tensor, found ", piece->type_name());
    const Tensor& t = piece->data;
    if (t.shape() != c.sizes || t.dtype() != info.dtype)
      return DataLoss(where, ": '", key, "': expected a chunk of shape ", shape_string(c.sizes), " (",
                      info.torch_dtype, "), found ", t.shape_string(), " (", dtype_name(t.dtype()), ")");
    if (t.numel() == 0) continue;
    if (ndim == 0) {
      std::memcpy(out.raw(), t.raw(), static_cast<size_t>(es));
      continue;
    }
    // Copy row by row along the last dimension.
    const int64_t row = c.sizes[ndim - 1], rows = t.numel() / row;
    std::vector<int64_t> index(static_cast<size_t>(ndim), 0);
    for (int64_t r = 0; r < rows; ++r) {
      int64_t dst = 0;
      for (int64_t d = 0; d < ndim; ++d) dst = dst * info.shape[d] + c.offsets[d] + index[d];
      std::memcpy(static_cast<char*>(out.raw()) + dst * es, static_cast<const char*>(t.raw()) + r * row * es,
                  static_cast<size_t>(row * es));
      for (int64_t d = ndim - 2; d >= 0; --d) {  // next row index (last dimension fixed at 0)
        if (++index[d] < c.sizes[d]) break;
        index[d] = 0;
      }
    }
  }
  return out;
}

StatusOr<PyRef> DcpCheckpoint::read_object(const std::string& key) const {
  auto it = objects_.find(key);
  if (it == objects_.end()) return NotFound(dir_, "/.metadata: no object '", key, "'");
  GALE_ASSIGN_OR_RETURN(std::string bytes, read_range(it->second, key));
  return read_torch_bytes(std::move(bytes), str_cat(dir_, "/", it->second.file, " at byte ", it->second.offset));
}

}  // namespace gale
