// Checkpoint writer: per-rank shards and the commit protocol (tmp directory, metadata, rename, tracker).
#include "ckpt/checkpoint_writer.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint_layout.h"
#include "ckpt/safetensors.h"
#include "ckpt/tensor_box.h"

namespace gale {

namespace fs = std::filesystem;

namespace {

constexpr const char* kReservedKeys[] = {"format", "version", "iteration", "world_size", "shards"};
constexpr int kGatherFields = 3;  // per rank: ok (1/0), shard bytes (0 = no shard), crc32

std::string make_token() {
  std::random_device rd;
  uint64_t t = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t v =
      (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ (t * 0x9e3779b97f4a7c15ull) ^ static_cast<uint64_t>(::getpid());
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// Removes <save>/<iter_dir_name><suffix>* (stale temporary or replaced copies of one iteration).
void remove_siblings(const std::string& save_dir, const std::string& prefix) {
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(save_dir, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) fs::remove_all(e.path(), ec);
  }
}

std::string offsets_key(const std::string& name, const std::vector<int64_t>& offsets) {
  std::string key = name + "@";
  for (size_t i = 0; i < offsets.size(); ++i) key += str_cat(i ? "," : "", offsets[i]);
  return key;
}

}  // namespace

const char* checkpoint_commit_step_name(CheckpointCommitStep step) {
  switch (step) {
    case CheckpointCommitStep::kShardsWritten:
      return "shards written";
    case CheckpointCommitStep::kMetadataWritten:
      return "metadata written";
    case CheckpointCommitStep::kPreviousMovedAside:
      return "previous copy moved aside";
    case CheckpointCommitStep::kRenamedIntoPlace:
      return "renamed into place";
    case CheckpointCommitStep::kTrackerTempWritten:
      return "tracker temporary written";
    case CheckpointCommitStep::kTrackerUpdated:
      return "tracker updated";
    case CheckpointCommitStep::kPreviousRemoved:
      return "previous copy removed";
  }
  return "?";
}

CheckpointWriter::CheckpointWriter(std::string save_dir, int64_t iteration, Communicator& comm,
                                   CheckpointWriterOptions options)
    : save_dir_(std::move(save_dir)), iteration_(iteration), comm_(comm), options_(std::move(options)) {}

std::string CheckpointWriter::final_dir() const { return iteration_dir(save_dir_, iteration_); }

Status CheckpointWriter::add(const std::string& name, const Tensor& tensor) {
  if (!tensor.defined()) return InvalidArgument("checkpoint: tensor '", name, "' is undefined");
  return add(name, tensor.shape(), std::vector<int64_t>(tensor.shape().size(), 0), tensor);
}

Status CheckpointWriter::add(const std::string& name, const Shape& global_shape, const std::vector<int64_t>& offsets,
                             const Tensor& piece) {
  if (committed_) return FailedPrecondition("checkpoint ", final_dir(), ": add('", name, "') after commit()");
  if (name.empty()) return InvalidArgument("checkpoint: empty tensor name");
  if (!piece.defined()) return InvalidArgument("checkpoint: tensor '", name, "' piece is undefined");
  if (offsets.size() != global_shape.size() || piece.shape().size() != global_shape.size())
    return InvalidArgument("checkpoint: tensor '", name, "': piece ", piece.shape_string(), " at offsets ",
                           shape_string(offsets), " does not have the rank of the global shape ",
                           shape_string(global_shape));
  Box box{offsets, piece.shape()};
  for (size_t d = 0; d < offsets.size(); ++d)
    if (offsets[d] < 0 || global_shape[d] < 0)
      return InvalidArgument("checkpoint: tensor '", name, "': negative offset or global dimension");
  if (!box_contains(whole_box(global_shape), box))
    return InvalidArgument("checkpoint: tensor '", name, "': piece ", box_string(box),
                           " lies outside the global shape ", shape_string(global_shape));
  bool whole = box == whole_box(global_shape);
  std::string key = whole ? name : offsets_key(name, offsets);
  for (const Piece& p : pieces_) {
    if (p.key == key)
      return InvalidArgument("checkpoint: tensor '", name, "': piece ", box_string(box), " added twice");
    if (p.name != name) continue;
    if (p.global_shape != global_shape)
      return InvalidArgument("checkpoint: tensor '", name, "' added with global shapes ", shape_string(p.global_shape),
                             " and ", shape_string(global_shape));
    if (box.numel() > 0 && intersect_boxes(Box{p.offsets, p.data.shape()}, box))
      return InvalidArgument("checkpoint: tensor '", name, "': piece ", box_string(box), " overlaps piece ",
                             box_string(Box{p.offsets, p.data.shape()}));
  }
  pieces_.push_back(Piece{key, name, global_shape, offsets, piece});
  return Status::Ok();
}

Status CheckpointWriter::add_flat(const std::string& name, int64_t global_numel, int64_t start, const Tensor& piece) {
  if (!piece.defined()) return InvalidArgument("checkpoint: tensor '", name, "' piece is undefined");
  return add(name, {global_numel}, {start}, piece.view({piece.numel()}));
}

Status CheckpointWriter::write_shard(const std::string& dir, uint64_t* bytes, uint32_t* crc) const {
  *bytes = 0;
  *crc = 0;
  if (pieces_.empty()) return Status::Ok();
  GALE_ASSIGN_OR_RETURN(SafetensorsWriteResult r, write_part(dir + "/" + shard_file_name(comm_.rank()), {}));
  *bytes = r.bytes;
  *crc = r.crc32;
  return Status::Ok();
}

StatusOr<SafetensorsWriteResult> CheckpointWriter::write_part(const std::string& path,
                                                              const std::map<std::string, std::string>& metadata) const {
  SafetensorsWriter w;
  nlohmann::json index = nlohmann::json::object();
  for (const Piece& p : pieces_) {
    GALE_RETURN_IF_ERROR(w.add(p.key, p.data));
    index[p.key] = {{"name", p.name}, {"global_shape", p.global_shape}, {"offsets", p.offsets}};
  }
  w.set_metadata("gale.format", str_cat(kCheckpointFormat, "-shard"));
  w.set_metadata("gale.version", std::to_string(kCheckpointVersion));
  w.set_metadata("gale.rank", std::to_string(comm_.rank()));
  w.set_metadata("gale.pieces", index.dump());
  for (const auto& [key, value] : metadata) w.set_metadata(key, value);
  return w.write(path);
}

bool CheckpointWriter::step_done(CheckpointCommitStep step) const {
  return !options_.after_step || options_.after_step(step);
}

Status CheckpointWriter::finish_on_rank0(const std::string& tmp_dir, const std::string& token,
                                         const std::vector<int64_t>& gathered, const nlohmann::json& sections) const {
  auto stopped = [&](CheckpointCommitStep s) {
    return Internal("checkpoint ", final_dir(), ": commit stopped after step '", checkpoint_commit_step_name(s),
                    "' by the test hook");
  };
  if (!step_done(CheckpointCommitStep::kShardsWritten)) return stopped(CheckpointCommitStep::kShardsWritten);

  nlohmann::json meta = nlohmann::json::object();
  meta["format"] = kCheckpointFormat;
  meta["version"] = kCheckpointVersion;
  meta["iteration"] = iteration_;
  meta["world_size"] = comm_.size();
  nlohmann::json shards = nlohmann::json::array();
  for (int r = 0; r < comm_.size(); ++r) {
    int64_t bytes = gathered[static_cast<size_t>(r * kGatherFields + 1)];
    if (bytes == 0) continue;
    shards.push_back({{"file", shard_file_name(r)},
                      {"rank", r},
                      {"bytes", bytes},
                      {"crc32", gathered[static_cast<size_t>(r * kGatherFields + 2)]}});
  }
  meta["shards"] = std::move(shards);
  if (sections.is_object())
    for (auto it = sections.begin(); it != sections.end(); ++it) meta[it.key()] = it.value();
  GALE_RETURN_IF_ERROR(write_file_atomically(tmp_dir + "/" + kCheckpointMetadataFileName, meta.dump(1) + "\n"));
  if (!step_done(CheckpointCommitStep::kMetadataWritten)) return stopped(CheckpointCommitStep::kMetadataWritten);

  std::string final_path = final_dir();
  std::string replaced;  // where the previous copy of this iteration ended up, if any
  std::error_code ec;
  if (fs::exists(final_path, ec)) {
    bool swapped = false;
    if (options_.use_rename_exchange) {
      swapped = ::renameat2(AT_FDCWD, tmp_dir.c_str(), AT_FDCWD, final_path.c_str(), RENAME_EXCHANGE) == 0;
      if (swapped) replaced = tmp_dir;
    }
    if (!swapped) {
      replaced = final_path + ".old-" + token;
      if (::rename(final_path.c_str(), replaced.c_str()) != 0)
        return IOError(final_path, ": cannot move the previous checkpoint aside: ", std::strerror(errno));
      GALE_RETURN_IF_ERROR(fsync_directory(save_dir_));
      if (!step_done(CheckpointCommitStep::kPreviousMovedAside))
        return stopped(CheckpointCommitStep::kPreviousMovedAside);
      if (::rename(tmp_dir.c_str(), final_path.c_str()) != 0)
        return IOError(final_path, ": cannot rename ", tmp_dir, " into place: ", std::strerror(errno));
    }
  } else if (::rename(tmp_dir.c_str(), final_path.c_str()) != 0) {
    return IOError(final_path, ": cannot rename ", tmp_dir, " into place: ", std::strerror(errno));
  }
  GALE_RETURN_IF_ERROR(fsync_directory(save_dir_));
  if (!step_done(CheckpointCommitStep::kRenamedIntoPlace)) return stopped(CheckpointCommitStep::kRenamedIntoPlace);

  if (options_.update_tracker) {
    AtomicFileWriter tracker;
    GALE_RETURN_IF_ERROR(tracker.open(tracker_path(save_dir_)));
    std::string text = std::to_string(iteration_);
    GALE_RETURN_IF_ERROR(tracker.write(text.data(), text.size()));
    if (!step_done(CheckpointCommitStep::kTrackerTempWritten)) {
      tracker.detach();  // leave the temporary file behind, as a crash would
      return stopped(CheckpointCommitStep::kTrackerTempWritten);
    }
    GALE_RETURN_IF_ERROR(tracker.commit());
    if (!step_done(CheckpointCommitStep::kTrackerUpdated)) return stopped(CheckpointCommitStep::kTrackerUpdated);
  }

  if (!replaced.empty()) fs::remove_all(replaced, ec);
  remove_siblings(save_dir_, iteration_dir_name(iteration_) + ".old-");
  if (!step_done(CheckpointCommitStep::kPreviousRemoved)) return stopped(CheckpointCommitStep::kPreviousRemoved);
  return Status::Ok();
}

Status CheckpointWriter::check_sections(const nlohmann::json& sections) const {
  if (!sections.is_object() && !sections.is_null())  // null: no sections
    return InvalidArgument("checkpoint ", final_dir(), ": the metadata sections must be a JSON object");
  for (const char* key : kReservedKeys)
    if (sections.contains(key))
      return InvalidArgument("checkpoint ", final_dir(), ": metadata section '", key, "' is reserved for the format");
  return Status::Ok();
}

Status CheckpointWriter::prepare() {
  // Rank 0 prepares the temporary directory and shares its token (and whether it succeeded).
  int64_t shared[3] = {0, 0, 0};  // ok, token high, token low
  Status prepared;
  if (comm_.rank() == 0) {
    token_ = make_token();
    std::error_code ec;
    fs::create_directories(save_dir_, ec);
    if (ec) {
      prepared = IOError(save_dir_, ": cannot create the checkpoint directory: ", ec.message());
    } else {
      remove_siblings(save_dir_, iteration_dir_name(iteration_) + ".tmp-");
      fs::create_directory(final_dir() + ".tmp-" + token_, ec);
      if (ec) prepared = IOError(final_dir() + ".tmp-" + token_, ": cannot create: ", ec.message());
    }
    shared[0] = prepared.ok() ? 1 : 0;
    shared[1] = static_cast<int64_t>(std::stoull(token_.substr(0, 8), nullptr, 16));
    shared[2] = static_cast<int64_t>(std::stoull(token_.substr(8), nullptr, 16));
  }
  comm_.broadcast(shared, 3, DType::kI64, 0);
  if (shared[0] != 1) {
    if (comm_.rank() == 0) return prepared;
    return IOError("checkpoint ", final_dir(), ": rank 0 could not create the temporary directory");
  }
  if (comm_.rank() != 0) {
    char buf[24];
    std::snprintf(buf, sizeof(buf), "%08llx%08llx", static_cast<unsigned long long>(shared[1]),
                  static_cast<unsigned long long>(shared[2]));
    token_ = buf;
  }
  tmp_dir_ = final_dir() + ".tmp-" + token_;
  return Status::Ok();
}

void CheckpointWriter::write_own_shard() {
  if (options_.before_shard_write) options_.before_shard_write();
  shard_status_ = write_shard(tmp_dir_, &bytes_, &crc_);
  shard_written_.store(true, std::memory_order_release);
}

Status CheckpointWriter::finish(const nlohmann::json& sections) {
  // 2. The all-gather of every rank's shard outcome is the barrier.
  const Status& mine = shard_status_;
  int64_t report[kGatherFields] = {mine.ok() ? 1 : 0, static_cast<int64_t>(bytes_), static_cast<int64_t>(crc_)};
  std::vector<int64_t> gathered(static_cast<size_t>(kGatherFields * comm_.size()));
  comm_.all_gather(report, gathered.data(), kGatherFields, DType::kI64);
  int failed_rank = -1;
  for (int r = 0; r < comm_.size() && failed_rank < 0; ++r)
    if (gathered[static_cast<size_t>(r * kGatherFields)] != 1) failed_rank = r;

  // 3. Rank 0 finishes the protocol and tells everyone the outcome.
  Status result;
  if (!mine.ok()) {
    result = mine;
  } else if (failed_rank >= 0) {
    result = IOError("checkpoint ", final_dir(), ": rank ", failed_rank,
                     " failed to write its shard; nothing was committed");
  } else if (comm_.rank() == 0) {
    result = finish_on_rank0(tmp_dir_, token_, gathered, sections);
  }
  int64_t outcome = result.ok() ? 1 : 0;
  comm_.broadcast(&outcome, 1, DType::kI64, 0);
  if (result.ok() && outcome != 1)
    result = IOError("checkpoint ", final_dir(), ": rank 0 failed to commit the checkpoint (see its error)");
  return result;
}

Status CheckpointWriter::commit(const nlohmann::json& sections) {
  if (committed_) return FailedPrecondition("checkpoint ", final_dir(), ": commit() called twice");
  committed_ = true;
  GALE_RETURN_IF_ERROR(check_sections(sections));
  GALE_RETURN_IF_ERROR(prepare());
  write_own_shard();  // the pieces are written from the caller's tensors, on this thread
  return finish(sections);
}

Status CheckpointWriter::start_commit(const nlohmann::json& sections) {
  if (committed_) return FailedPrecondition("checkpoint ", final_dir(), ": commit() called twice");
  committed_ = true;
  GALE_RETURN_IF_ERROR(check_sections(sections));
  // The snapshot: the background thread must not read tensors that training keeps changing.
  for (Piece& p : pieces_) p.data = p.data.clone();
  pending_sections_ = std::make_unique<nlohmann::json>(sections);
  GALE_RETURN_IF_ERROR(prepare());
  writer_ = std::thread([this] { write_own_shard(); });
  return Status::Ok();
}

Status CheckpointWriter::finish_commit() {
  if (!writer_.joinable())
    return FailedPrecondition("checkpoint ", final_dir(), ": finish_commit() without a successful start_commit()");
  writer_.join();
  pieces_.clear();  // the snapshot is on disk (or failed): release its memory before the collective
  Status result = finish(*pending_sections_);
  pending_sections_.reset();
  return result;
}

CheckpointWriter::~CheckpointWriter() {
  if (writer_.joinable()) writer_.join();
}

}  // namespace gale
