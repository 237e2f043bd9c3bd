// Opening a Hugging Face model directory: config.json, single or sharded safetensors weights.
#include "train/hf_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace gale {

namespace {

StatusOr<nlohmann::json> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(path, ": not valid JSON (", e.what(), ")");
  }
}

}  // namespace

StatusOr<HfFiles> HfFiles::open(const std::string& dir) {
  namespace fs = std::filesystem;
  HfFiles out;
  out.dir_ = dir;
  if (!fs::is_directory(dir)) return NotFound("--load-dir ", dir, ": not a directory");
  out.config_path_ = (fs::path(dir) / "config.json").string();
  if (!fs::exists(out.config_path_))
    return NotFound("--load-dir ", dir, ": no config.json (expected a Hugging Face model directory)");
  GALE_ASSIGN_OR_RETURN(out.config_, read_json(out.config_path_));
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  std::vector<std::string> files;
  std::map<std::string, std::string> weight_map;  // tensor -> file, sharded only
  if (fs::exists(single)) {
    files.push_back(single);
  } else if (fs::exists(index)) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json idx, read_json(index));
    auto wm = idx.find("weight_map");
    if (!idx.is_object() || wm == idx.end() || !wm->is_object() || wm->empty())
      return InvalidArgument(index, ": expected an object with a non-empty 'weight_map'");
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string()) return InvalidArgument(index, ": weight_map['", tensor, "'] is not a file name");
      const std::string f = file.get<std::string>();
      if (f.find('/') != std::string::npos) return InvalidArgument(index, ": weight_map names a file outside ", dir, ": ", f);
      weight_map[tensor] = f;
      if (std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
    }
    for (std::string& f : files) f = (fs::path(dir) / f).string();
  } else {
    const bool bin = fs::exists(fs::path(dir) / "pytorch_model.bin") ||
                     fs::exists(fs::path(dir) / "pytorch_model.bin.index.json");
    return NotFound("--load-dir ", dir, ": no model.safetensors or model.safetensors.index.json",
                    bin ? " (only pytorch_model.bin, which is not supported: save the model with safe_serialization)"
                        : "");
  }
  for (size_t i = 0; i < files.size(); ++i) {
    GALE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(files[i]));
    out.files_.push_back(std::make_shared<SafetensorsFile>(std::move(f)));
  }
  for (size_t i = 0; i < out.files_.size(); ++i)
    for (const SafetensorsEntry& e : out.files_[i]->entries()) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end() || (fs::path(dir) / it->second).string() != files[i]) continue;  // not indexed here
      }
      out.tensors_[e.name] = Location{static_cast<int>(i), &e};
    }
  for (const auto& [tensor, file] : weight_map)
    if (!out.tensors_.count(tensor))
      return NotFound(index, ": tensor '", tensor, "' is listed in ", file, " but that file does not hold it");
  return out;
}

std::vector<std::string> HfFiles::names() const {
  std::vector<std::string> out;
  for (const auto& [name, loc] : tensors_) out.push_back(name);
  return out;
}

StatusOr<Tensor> HfFiles::read(const std::string& name, const Shape& shape) {
  auto it = tensors_.find(name);
  const std::string prefix = "transformer.";
  if (it == tensors_.end() && name.rfind(prefix, 0) == 0) it = tensors_.find(name.substr(prefix.size()));
  if (it == tensors_.end())
    return NotFound(dir_, ": tensor '", name, "' is missing (the weights hold ", tensors_.size(), " tensors)");
  const SafetensorsFile& f = *files_[static_cast<size_t>(it->second.file)];
  if (it->second.entry->shape != shape)
    return FailedPrecondition(f.path(), ": tensor '", it->first, "' has shape ", shape_string(it->second.entry->shape),
                              ", expected ", shape_string(shape), " (from ", config_path_, ")");
  GALE_ASSIGN_OR_RETURN(Tensor t, f.read(it->first, DType::kF32));
  read_.insert(it->first);
  return t;
}

std::string HfFiles::file_of(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? dir_ : files_[static_cast<size_t>(it->second.file)]->path();
}

bool HfFiles::all_bf16() const {
  for (const auto& [name, loc] : tensors_)
    if (st_dtype_is_float(loc.entry->dtype) && loc.entry->dtype != StDType::kBF16) return false;
  return !tensors_.empty();
}

std::vector<std::string> HfFiles::unread() const {
  std::vector<std::string> out;
  for (const auto& [name, loc] : tensors_)
    if (!read_.count(name)) out.push_back(name);
  return out;
}

}  // namespace gale
