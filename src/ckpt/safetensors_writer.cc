// Safetensors writer: header layout as the Python package writes it, atomic file output.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "ckpt/atomic_file.h"
#include "ckpt/safetensors.h"

namespace gale {

Status SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  if (!tensor.defined()) return InvalidArgument("safetensors: tensor '", name, "' is undefined");
  return add_raw(name, st_dtype_of(tensor.dtype()), tensor.shape(), tensor.raw());
}

Status SafetensorsWriter::add_raw(const std::string& name, StDType dtype, const Shape& shape, const void* data) {
  if (name.empty() || name == "__metadata__") return InvalidArgument("safetensors: invalid tensor name '", name, "'");
  for (const Pending& p : pending_)
    if (p.name == name) return InvalidArgument("safetensors: tensor '", name, "' added twice");
  for (int64_t d : shape)
    if (d < 0) return InvalidArgument("safetensors: tensor '", name, "' has negative shape ", shape_string(shape));
  uint64_t bytes = static_cast<uint64_t>(shape_numel(shape)) * static_cast<uint64_t>(st_dtype_size(dtype));
  if (bytes > 0 && data == nullptr) return InvalidArgument("safetensors: tensor '", name, "' has no data");
  pending_.push_back(Pending{name, dtype, shape, data, bytes});
  return Status::Ok();
}

std::vector<const SafetensorsWriter::Pending*> SafetensorsWriter::ordered() const {
  std::vector<const Pending*> order;
  for (const Pending& p : pending_) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    if (a->dtype != b->dtype) return a->dtype > b->dtype;
    return a->name < b->name;
  });
  return order;
}

std::string SafetensorsWriter::header() const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const Pending* p : ordered()) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = st_dtype_name(p->dtype);
    e["shape"] = p->shape;
    e["data_offsets"] = {offset, offset + p->bytes};
    h[p->name] = std::move(e);
    offset += p->bytes;
  }
  std::string text = h.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

StatusOr<SafetensorsWriteResult> SafetensorsWriter::write(const std::string& path) const {
  std::string text = header();
  uint64_t n = text.size();
  AtomicFileWriter out;
  GALE_RETURN_IF_ERROR(out.open(path));
  GALE_RETURN_IF_ERROR(out.write(&n, 8));
  GALE_RETURN_IF_ERROR(out.write(text.data(), text.size()));
  for (const Pending* p : ordered())
    if (p->bytes) GALE_RETURN_IF_ERROR(out.write(p->data, p->bytes));
  GALE_RETURN_IF_ERROR(out.commit());
  return SafetensorsWriteResult{out.bytes_written(), out.crc32()};
}

}  // namespace gale
