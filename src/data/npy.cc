// .npy reading and writing for integer index arrays.
#include "data/npy.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/mapped_file.h"

namespace gale {

namespace {
template <class T>
const char* npy_descr();
template <>
const char* npy_descr<int16_t>() {
  return "<i2";
}
template <>
const char* npy_descr<int32_t>() {
  return "<i4";
}
template <>
const char* npy_descr<int64_t>() {
  return "<i8";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += ",";
    if (i + 1 < shape.size()) s += " ";
  }
  return s + ")";
}
}  // namespace

template <class T>
Status save_npy(const std::string& path, const std::vector<T>& data, const std::vector<int64_t>& shape) {
  std::string header =
      std::string("{'descr': '") + npy_descr<T>() + "', 'fortran_order': False, 'shape': " + shape_text(shape) + ", }";
  size_t total = 10 + header.size() + 1;
  size_t pad = (64 - total % 64) % 64;
  header.append(pad, ' ');
  header.push_back('\n');
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return IOError(tmp, ": cannot create (", std::strerror(errno), ")");
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  uint16_t hlen = static_cast<uint16_t>(header.size());
  bool ok = std::fwrite(magic, 1, 8, f) == 8 && std::fwrite(&hlen, 2, 1, f) == 1 &&
            std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
            (data.empty() || std::fwrite(data.data(), sizeof(T), data.size(), f) == data.size());
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    return IOError(tmp, ": write failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return IOError(path, ": cannot move into place (", std::strerror(errno), ")");
  }
  return Status::Ok();
}

namespace {

// The checked header of .npy bytes: the shape, and where the `count` elements start.
struct NpyLayout {
  std::vector<int64_t> shape;
  int64_t count = 1;
  int64_t offset = 0;
};

template <class T>
StatusOr<NpyLayout> parse_npy_layout(const uint8_t* data, int64_t size, const std::string& name) {
  if (size < 10 || std::memcmp(data, "\x93NUMPY", 6) != 0) return DataLoss(name, ": not a .npy file");
  if (data[6] != 1 || data[7] != 0) return DataLoss(name, ": expected .npy format version 1.0");
  uint16_t hlen = load_unaligned<uint16_t>(data + 8);
  if (10 + static_cast<int64_t>(hlen) > size) return DataLoss(name, ": truncated .npy header");
  std::string header(reinterpret_cast<const char*>(data + 10), hlen);
  if (header.find(std::string("'descr': '") + npy_descr<T>() + "'") == std::string::npos)
    return DataLoss(name, ": expected dtype ", npy_descr<T>());
  if (header.find("'fortran_order': False") == std::string::npos) return DataLoss(name, ": expected C order");
  size_t sp = header.find("'shape': (");
  if (sp == std::string::npos) return DataLoss(name, ": no shape in .npy header");
  size_t p = sp + 10;
  NpyLayout out;
  while (p < header.size() && header[p] != ')') {
    if (header[p] == ',' || header[p] == ' ') {
      ++p;
      continue;
    }
    if (header[p] < '0' || header[p] > '9') return DataLoss(name, ": bad shape in .npy header");
    constexpr int64_t kMax = int64_t{1} << 40;
    int64_t v = 0;
    while (p < header.size() && header[p] >= '0' && header[p] <= '9') {
      v = v * 10 + (header[p] - '0');
      if (v > kMax) return DataLoss(name, ": implausible shape in .npy header");
      ++p;
    }
    out.shape.push_back(v);
    if (v != 0 && out.count > kMax / v) return DataLoss(name, ": implausible shape in .npy header");
    out.count *= v;
  }
  if (p >= header.size()) return DataLoss(name, ": bad shape in .npy header");
  out.offset = 10 + hlen;
  int64_t need = out.offset + out.count * static_cast<int64_t>(sizeof(T));
  if (size != need) return DataLoss(name, ": expected ", need, " bytes, found ", size);
  return out;
}

}  // namespace

template <class T>
StatusOr<NpyArray<T>> parse_npy(const uint8_t* data, int64_t size, const std::string& name) {
  GALE_ASSIGN_OR_RETURN(NpyLayout layout, parse_npy_layout<T>(data, size, name));
  NpyArray<T> out;
  out.shape = std::move(layout.shape);
  out.data.resize(static_cast<size_t>(layout.count));
  if (layout.count)
    std::memcpy(out.data.data(), data + layout.offset, static_cast<size_t>(layout.count) * sizeof(T));
  return out;
}

template <class T>
StatusOr<MappedNpy<T>> map_npy(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> f, MappedFile::open(path, /*use_mmap=*/true));
  GALE_ASSIGN_OR_RETURN(NpyLayout layout, parse_npy_layout<T>(f->data(), f->size(), path));
  MappedNpy<T> out;
  out.shape = std::move(layout.shape);
  if (layout.count > 0) {
    const uint8_t* start = f->data() + layout.offset;
    if (reinterpret_cast<uintptr_t>(start) % alignof(T) != 0)
      return DataLoss(path, ": the array starts at byte ", layout.offset, ", not a multiple of ", alignof(T),
                      ", so it cannot be mapped (numpy pads the header to 64 bytes; was the file written by it?)");
    out.data = std::span<const T>(reinterpret_cast<const T*>(start), static_cast<size_t>(layout.count));
  }
  out.file = std::move(f);
  return out;
}

template <class T>
StatusOr<NpyArray<T>> load_npy(const std::string& path) {
  GALE_ASSIGN_OR_RETURN(auto f, MappedFile::open(path));
  return parse_npy<T>(f->data(), f->size(), path);
}

#define GALE_NPY_INSTANTIATE(T)                                                                        \
  template Status save_npy<T>(const std::string&, const std::vector<T>&, const std::vector<int64_t>&); \
  template StatusOr<NpyArray<T>> load_npy<T>(const std::string&);                                      \
  template StatusOr<NpyArray<T>> parse_npy<T>(const uint8_t*, int64_t, const std::string&);          \
  template StatusOr<MappedNpy<T>> map_npy<T>(const std::string&);
GALE_NPY_INSTANTIATE(int16_t)
GALE_NPY_INSTANTIATE(int32_t)
GALE_NPY_INSTANTIATE(int64_t)
#undef GALE_NPY_INSTANTIATE

}  // namespace gale
