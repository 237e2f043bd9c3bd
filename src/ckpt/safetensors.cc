// Safetensors reader: header parsing and validation, lazy tensor reads from the mapping.
#include "ckpt/safetensors.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

namespace gale {

namespace {

using json = nlohmann::json;

std::string range_string(uint64_t b, uint64_t e) { return str_cat("[", b, ", ", e, ")"); }

bool as_count(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

// One header entry -> SafetensorsEntry, checking its fields and that its byte size is dtype x shape.
Status parse_entry(const std::string& path, const std::string& name, const json& value, SafetensorsEntry* out) {
  std::string where = str_cat(path, ": tensor '", name, "'");
  if (!value.is_object())
    return DataLoss(where, ": expected an object with dtype, shape and data_offsets, found ", value.type_name());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!value.contains(field)) return DataLoss(where, ": missing field '", field, "'");
  const json& dtype = value["dtype"];
  if (!dtype.is_string()) return DataLoss(where, ": dtype must be a string, found ", dtype.dump());
  std::optional<StDType> st = st_dtype_from_name(dtype.get<std::string>());
  if (!st) return DataLoss(where, ": unknown dtype '", dtype.get<std::string>(), "'");
  out->name = name;
  out->dtype = *st;

  const json& shape = value["shape"];
  if (!shape.is_array()) return DataLoss(where, ": shape must be an array, found ", shape.dump());
  out->shape.clear();
  uint64_t numel = 1;
  for (const json& d : shape) {
    uint64_t n = 0;
    if (!as_count(d, &n) || n > static_cast<uint64_t>(INT64_MAX))
      return DataLoss(where, ": shape ", shape.dump(), " must hold non-negative integers");
    if (n != 0 && numel > UINT64_MAX / n) return DataLoss(where, ": shape ", shape.dump(), " overflows");
    numel *= n;
    out->shape.push_back(static_cast<int64_t>(n));
  }
  const json& offsets = value["data_offsets"];
  uint64_t b = 0, e = 0;
  if (!offsets.is_array() || offsets.size() != 2 || !as_count(offsets[0], &b) || !as_count(offsets[1], &e))
    return DataLoss(where, ": data_offsets must be two non-negative integers [begin, end], found ", offsets.dump());
  if (e < b) return DataLoss(where, ": data_offsets [", b, ", ", e, "] end before they begin");
  out->begin = b;
  out->end = e;
  uint64_t elem = static_cast<uint64_t>(st_dtype_size(*st));
  if (numel > UINT64_MAX / elem || numel * elem != e - b)
    return DataLoss(where, ": shape ", shape_string(out->shape), " of ", dtype.get<std::string>(), " needs ",
                    numel > UINT64_MAX / elem ? std::string("too many") : std::to_string(numel * elem),
                    " bytes but data_offsets ", range_string(b, e), " span ", e - b);
  return Status::Ok();
}

}  // namespace

StatusOr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> opened, MappedFile::open(path));
  std::shared_ptr<const MappedFile> file = std::move(opened);
  SafetensorsFile out;
  out.file_ = file;
  uint64_t size = file->size();
  if (size < 8) return DataLoss(path, ": file is ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  std::memcpy(&n, file->data(), 8);
  if (n > kSafetensorsMaxHeaderBytes)
    return DataLoss(path, ": header length ", n, " exceeds the ", kSafetensorsMaxHeaderBytes,
                    "-byte limit (not a safetensors file?)");
  if (n > size - 8)
    return DataLoss(path, ": header length ", n, " exceeds the ", size - 8,
                    " bytes after the length (truncated file?)");
  out.header_bytes_ = n;
  const char* text = reinterpret_cast<const char*>(file->data() + 8);
  json header;
  try {
    header = json::parse(text, text + n);
  } catch (const json::parse_error& e) {
    return DataLoss(path, ": header is not valid JSON (not a safetensors file?): ", e.what());
  }
  if (!header.is_object()) return DataLoss(path, ": header is not a JSON object");

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) return DataLoss(path, ": __metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string())
          return DataLoss(path, ": __metadata__ value of '", m.key(), "' must be a string, found ", m.value().dump());
        out.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    SafetensorsEntry entry;
    GALE_RETURN_IF_ERROR(parse_entry(path, it.key(), it.value(), &entry));
    out.entries_.push_back(std::move(entry));
  }

  // The tensors must tile the buffer: sorted by begin, each starts where the previous ended.
  uint64_t buffer = size - 8 - n;
  std::stable_sort(out.entries_.begin(), out.entries_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& e : out.entries_) {
    if (e.end > buffer)
      return DataLoss(path, ": tensor '", e.name, "' data_offsets ", range_string(e.begin, e.end), " exceed the ",
                      buffer, "-byte buffer");
    if (e.begin < cursor)
      return DataLoss(path, ": tensors '", previous->name, "' ", range_string(previous->begin, previous->end), " and '",
                      e.name, "' ", range_string(e.begin, e.end), " overlap");
    if (e.begin > cursor)
      return DataLoss(path, ": bytes ", range_string(cursor, e.begin), " of the buffer belong to no tensor (before '",
                      e.name, "')");
    cursor = e.end;
    previous = &e;
  }
  if (cursor != buffer)
    return DataLoss(path, ": the ", buffer, "-byte buffer has ", buffer - cursor,
                    " bytes after the last tensor's data");
  for (size_t i = 0; i < out.entries_.size(); ++i) out.index_[out.entries_[i].name] = i;
  return out;
}

const SafetensorsEntry* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const uint8_t* SafetensorsFile::data(const SafetensorsEntry& entry) const {
  return file_->data() + 8 + header_bytes_ + entry.begin;
}

StatusOr<Tensor> SafetensorsFile::read(std::string_view name) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return NotFound(path(), ": no tensor '", name, "'");
  std::optional<DType> native = gale_dtype_of(e->dtype);
  if (!native)
    return Unimplemented(path(), ": tensor '", name, "' is ", st_dtype_name(e->dtype),
                         ", which has no Gale tensor dtype; read it converted (e.g. to f32)");
  return read(name, *native);
}

StatusOr<Tensor> SafetensorsFile::read(std::string_view name, DType as) const {
  const SafetensorsEntry* e = find(name);
  if (!e) return NotFound(path(), ": no tensor '", name, "'");
  Tensor t = Tensor::empty(e->shape, as);
  GALE_RETURN_IF_ERROR(
      convert_elements(e->dtype, data(*e), as, t.raw(), e->numel(), str_cat(path(), ": tensor '", name, "'")));
  return t;
}

}  // namespace gale
