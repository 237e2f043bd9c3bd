// Checkpoint reader: tracker resolution, metadata and shard validation, slice assembly from pieces.
#include "ckpt/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint_layout.h"

namespace gale {

namespace fs = std::filesystem;

namespace {

StatusOr<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFound(path, ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    return DataLoss(path, ": not valid JSON (truncated?): ", e.what());
  }
}

bool json_int(const nlohmann::json& j, const char* key, int64_t* out) {
  if (!j.contains(key) || !j[key].is_number_integer()) return false;
  *out = j[key].get<int64_t>();
  return true;
}

// A Shape from a JSON array of non-negative integers.
bool json_dims(const nlohmann::json& j, std::vector<int64_t>* out) {
  if (!j.is_array()) return false;
  out->clear();
  for (const nlohmann::json& d : j) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0) return false;
    out->push_back(d.get<int64_t>());
  }
  return true;
}

}  // namespace

StatusOr<CheckpointReader> CheckpointReader::open(const std::string& load_dir, CheckpointReaderOptions options) {
  GALE_ASSIGN_OR_RETURN(TrackerValue tracker, read_tracker(load_dir));
  if (tracker.release) return open_directory(load_dir + "/" + kReleaseDirName, options);
  return open_iteration(load_dir, tracker.iteration, options);
}

StatusOr<CheckpointReader> CheckpointReader::open_iteration(const std::string& load_dir, int64_t iteration,
                                                            CheckpointReaderOptions options) {
  std::string dir = iteration_dir(load_dir, iteration);
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    // A save that replaced this iteration may have stopped between moving the old copy aside and
    // renaming the new one into place: the old copy is then complete under iter_XXXXXXX.old-*.
    std::string prefix = iteration_dir_name(iteration) + ".old-";
    for (const fs::directory_entry& e : fs::directory_iterator(load_dir, ec)) {
      std::string name = e.path().filename().string();
      if (name.rfind(prefix, 0) == 0 && fs::exists(e.path() / kCheckpointMetadataFileName, ec))
        return open_directory(e.path().string(), options);
    }
    return NotFound(dir, ": no such checkpoint directory (", tracker_path(load_dir), " names iteration ", iteration,
                    ")");
  }
  GALE_ASSIGN_OR_RETURN(CheckpointReader r, open_directory(dir, options));
  if (r.iteration() != iteration)
    return DataLoss(dir, "/", kCheckpointMetadataFileName, ": records iteration ", r.iteration(), ", expected ",
                    iteration);
  return r;
}

StatusOr<CheckpointReader> CheckpointReader::open_directory(const std::string& dir, CheckpointReaderOptions options) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return NotFound(dir, ": no such checkpoint directory");
  std::string meta_path = dir + "/" + kCheckpointMetadataFileName;
  if (!fs::exists(meta_path, ec)) {
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
      if (e.path().filename().string().rfind("mp_rank_", 0) == 0)
        return Unimplemented(
            dir, ": a Megatron legacy (torch) checkpoint, not a Gale one; this path reads Gale checkpoints only (convert "
                 "it: gale convert --load-model-type mg --save-model-type gale)");
    return FailedPrecondition(dir, ": incomplete checkpoint (no ", kCheckpointMetadataFileName,
                              ": the save did not finish)");
  }
  auto state = std::make_shared<State>();
  state->dir = dir;
  state->options = options;
  GALE_ASSIGN_OR_RETURN(state->metadata, read_json_file(meta_path));
  const nlohmann::json& meta = state->metadata;
  if (!meta.is_object()) return DataLoss(meta_path, ": expected a JSON object");
  if (meta.contains("sharded_backend"))
    return Unimplemented(dir, ": a Megatron '", meta["sharded_backend"].dump(),
                         "' checkpoint, not a Gale one; this path reads Gale checkpoints only (convert it: gale convert "
                         "--load-model-type mg --save-model-type gale)");
  if (!meta.contains("format") || meta["format"] != kCheckpointFormat)
    return DataLoss(meta_path, ": format ", meta.contains("format") ? meta["format"].dump() : std::string("missing"),
                    ", expected \"", kCheckpointFormat, "\"");
  int64_t version = 0;
  if (!json_int(meta, "version", &version)) return DataLoss(meta_path, ": missing integer 'version'");
  if (version > kCheckpointVersion || version < 1)
    return Unimplemented(meta_path, ": format version ", version, "; this build of gale reads version ",
                         kCheckpointVersion);
  if (!json_int(meta, "iteration", &state->iteration)) return DataLoss(meta_path, ": missing integer 'iteration'");
  if (!meta.contains("shards") || !meta["shards"].is_array()) return DataLoss(meta_path, ": missing 'shards' list");

  state->shards.reserve(meta["shards"].size());  // PieceRef keeps pointers into the shards' entries
  for (const nlohmann::json& s : meta["shards"]) {
    int64_t bytes = 0, crc = 0;
    if (!s.is_object() || !s.contains("file") || !s["file"].is_string() || !json_int(s, "bytes", &bytes) ||
        !json_int(s, "crc32", &crc))
      return DataLoss(meta_path, ": malformed shard entry ", s.dump());
    std::string file = s["file"].get<std::string>();
    if (file.find('/') != std::string::npos) return DataLoss(meta_path, ": shard file name '", file, "' has a '/'");
    std::string path = dir + "/" + file;
    uint64_t on_disk = fs::file_size(path, ec);
    if (ec) return DataLoss(path, ": shard listed in ", kCheckpointMetadataFileName, " is missing");
    if (on_disk != static_cast<uint64_t>(bytes))
      return DataLoss(path, ": ", on_disk, " bytes on disk but ", kCheckpointMetadataFileName, " records ", bytes,
                      " (truncated or overwritten shard)");
    GALE_ASSIGN_OR_RETURN(SafetensorsFile shard, SafetensorsFile::open(path));
    const int index = static_cast<int>(state->shards.size());
    state->shards.push_back(std::move(shard));
    state->shard_crc.push_back(static_cast<uint32_t>(crc));
    state->shard_verified.push_back(0);
    const SafetensorsFile& f = state->shards.back();

    auto pieces_it = f.metadata().find("gale.pieces");
    if (pieces_it == f.metadata().end()) return DataLoss(path, ": no gale.pieces index in its __metadata__");
    nlohmann::json pieces;
    try {
      pieces = nlohmann::json::parse(pieces_it->second);
    } catch (const nlohmann::json::exception& e) {
      return DataLoss(path, ": gale.pieces is not valid JSON: ", e.what());
    }
    if (!pieces.is_object() || pieces.size() != f.entries().size())
      return DataLoss(path, ": gale.pieces lists ", pieces.is_object() ? pieces.size() : 0,
                      " pieces but the file holds ", f.entries().size(), " tensors");
    for (auto it = pieces.begin(); it != pieces.end(); ++it) {
      const SafetensorsEntry* entry = f.find(it.key());
      const nlohmann::json& p = it.value();
      Shape global;
      std::vector<int64_t> offsets;
      if (!entry || !p.is_object() || !p.contains("name") || !p["name"].is_string() || !p.contains("global_shape") ||
          !p.contains("offsets") || !json_dims(p["global_shape"], &global) || !json_dims(p["offsets"], &offsets))
        return DataLoss(path, ": malformed gale.pieces entry '", it.key(), "'");
      std::string name = p["name"].get<std::string>();
      Box box{offsets, entry->shape};
      if (global.size() != offsets.size() || entry->shape.size() != global.size() ||
          !box_contains(whole_box(global), box))
        return DataLoss(path, ": piece '", it.key(), "' ", shape_string(entry->shape), " at ", shape_string(offsets),
                        " does not fit tensor '", name, "' of global shape ", shape_string(global));
      TensorInfo& info = state->tensors[name];
      if (info.pieces.empty()) info.global_shape = global;
      if (info.global_shape != global)
        return DataLoss(path, ": tensor '", name, "' has global shape ", shape_string(global), " here but ",
                        shape_string(info.global_shape), " in another shard");
      info.pieces.push_back(PieceRef{index, entry, box});
    }
  }

  // Pieces of one tensor may repeat (replicas hold the same box) but not partly overlap.
  for (auto& [name, info] : state->tensors) {
    std::vector<PieceRef>& ps = info.pieces;
    std::stable_sort(ps.begin(), ps.end(),
                     [](const PieceRef& a, const PieceRef& b) { return a.box.offsets < b.box.offsets; });
    std::vector<PieceRef> kept;
    for (const PieceRef& p : ps) {
      if (p.box.numel() == 0) continue;
      bool duplicate = false;
      for (const PieceRef& k : kept) {
        if (k.box == p.box) {
          duplicate = true;
          break;
        }
        if (intersect_boxes(k.box, p.box))
          return DataLoss(dir, ": tensor '", name, "': saved pieces ", box_string(k.box), " (",
                          state->shards[k.shard].path(), ") and ", box_string(p.box), " (",
                          state->shards[p.shard].path(), ") overlap");
      }
      if (!duplicate) kept.push_back(p);
    }
    ps = std::move(kept);
  }
  CheckpointReader r;
  r.state_ = std::move(state);
  return r;
}

StatusOr<nlohmann::json> CheckpointReader::section(const std::string& key) const {
  if (!state_->metadata.contains(key))
    return NotFound(state_->dir, "/", kCheckpointMetadataFileName, ": no section '", key, "'");
  return state_->metadata[key];
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, info] : state_->tensors) names.push_back(name);
  return names;
}

bool CheckpointReader::has_tensor(const std::string& name) const { return state_->tensors.count(name) > 0; }

StatusOr<Shape> CheckpointReader::global_shape(const std::string& name) const {
  auto it = state_->tensors.find(name);
  if (it == state_->tensors.end()) return NotFound("checkpoint ", state_->dir, ": no tensor '", name, "'");
  return it->second.global_shape;
}

StatusOr<const CheckpointReader::TensorInfo*> CheckpointReader::lookup(const std::string& name,
                                                                       const Shape& expected_global_shape) const {
  auto it = state_->tensors.find(name);
  if (it == state_->tensors.end()) return NotFound("checkpoint ", state_->dir, ": no tensor '", name, "'");
  if (it->second.global_shape != expected_global_shape)
    return FailedPrecondition("checkpoint ", state_->dir, ": tensor '", name, "' was saved with shape ",
                              shape_string(it->second.global_shape), " but the model expects ",
                              shape_string(expected_global_shape), " (saved with another model configuration?)");
  return &it->second;
}

Status CheckpointReader::verify_shard(int shard) const {
  if (!state_->options.verify_checksums) return Status::Ok();
  std::lock_guard<std::mutex> lock(state_->mutex);
  int8_t& verified = state_->shard_verified[static_cast<size_t>(shard)];
  const SafetensorsFile& f = state_->shards[static_cast<size_t>(shard)];
  if (verified == 0) {
    uint32_t crc = crc32_update(0, f.mapping().data(), f.mapping().size());
    verified = crc == state_->shard_crc[static_cast<size_t>(shard)] ? 1 : -1;
  }
  if (verified < 0)
    return DataLoss(f.path(), ": CRC-32 does not match ", kCheckpointMetadataFileName, " (corrupt shard)");
  return Status::Ok();
}

Status CheckpointReader::read_slice_into(const std::string& name, const Shape& expected_global_shape,
                                         const std::vector<int64_t>& offsets, Tensor& out) const {
  GALE_ASSIGN_OR_RETURN(const TensorInfo* info, lookup(name, expected_global_shape));
  Box want{offsets, out.shape()};
  if (offsets.size() != expected_global_shape.size() || !box_contains(whole_box(expected_global_shape), want))
    return InvalidArgument("checkpoint ", state_->dir, ": tensor '", name, "': slice ",
                           offsets.size() == out.shape().size() ? box_string(want) : shape_string(offsets),
                           " is outside its shape ", shape_string(expected_global_shape));
  int64_t covered = 0;
  std::string what = str_cat(state_->dir, ": tensor '", name, "'");
  for (const PieceRef& p : info->pieces) {
    std::optional<Box> overlap = intersect_boxes(p.box, want);
    if (!overlap) continue;
    GALE_RETURN_IF_ERROR(verify_shard(p.shard));
    const SafetensorsFile& f = state_->shards[static_cast<size_t>(p.shard)];
    GALE_RETURN_IF_ERROR(
        copy_box_region(f.data(*p.entry), p.entry->dtype, p.box, out.raw(), out.dtype(), want, *overlap, what));
    covered += overlap->numel();
  }
  if (covered != want.numel()) {
    std::string saved;
    for (const PieceRef& p : info->pieces)
      saved += str_cat(saved.empty() ? "" : ", ", box_string(p.box), " in ",
                       fs::path(state_->shards[static_cast<size_t>(p.shard)].path()).filename().string());
    return DataLoss("checkpoint ", state_->dir, ": tensor '", name, "' ", shape_string(expected_global_shape),
                    ": slice ", box_string(want), " is only partly saved (", covered, " of ", want.numel(),
                    " elements; saved pieces: ", saved.empty() ? std::string("none") : saved, ")");
  }
  return Status::Ok();
}

StatusOr<Tensor> CheckpointReader::read_slice(const std::string& name, const Shape& expected_global_shape,
                                              const std::vector<int64_t>& offsets, const Shape& shape,
                                              DType dtype) const {
  for (int64_t d : shape)
    if (d < 0) return InvalidArgument("checkpoint: tensor '", name, "': negative slice shape ", shape_string(shape));
  if (offsets.size() != shape.size())
    return InvalidArgument("checkpoint: tensor '", name, "': slice offsets ", shape_string(offsets), " and shape ",
                           shape_string(shape), " differ in rank");
  Tensor out = Tensor::empty(shape, dtype);
  GALE_RETURN_IF_ERROR(read_slice_into(name, expected_global_shape, offsets, out));
  return out;
}

StatusOr<Tensor> CheckpointReader::read(const std::string& name, const Shape& expected_global_shape,
                                        DType dtype) const {
  return read_slice(name, expected_global_shape, std::vector<int64_t>(expected_global_shape.size(), 0),
                    expected_global_shape, dtype);
}

StatusOr<Tensor> CheckpointReader::read_flat(const std::string& name, int64_t expected_numel, int64_t start,
                                             int64_t length, DType dtype) const {
  return read_slice(name, {expected_numel}, {start}, {length}, dtype);
}

}  // namespace gale
