// Local non-persistent checkpoints: per-rank part files, clique replication, find_latest, assembly.
#include "ckpt/local_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "ckpt/atomic_file.h"
#include "ckpt/checkpoint_layout.h"
#include "ckpt/safetensors.h"

namespace gale {

namespace fs = std::filesystem;

namespace {

StatusOr<std::string> read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in.good() && !in.eof()) return IOError(path, ": read failed");
  return ss.str();
}

// Whether every rank's `ok` is true (an all-gather: every rank learns the same).
bool all_ok(Communicator& world, bool ok, int* first_failed) {
  int64_t mine = ok ? 1 : 0;
  std::vector<int64_t> all(static_cast<size_t>(world.size()));
  world.all_gather(&mine, all.data(), 1, DType::kI64);
  for (int r = 0; r < world.size(); ++r)
    if (all[static_cast<size_t>(r)] != 1) {
      if (first_failed) *first_failed = r;
      return false;
    }
  return true;
}

}  // namespace

std::string local_part_file_name(int64_t iteration, int owner) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "iter_%07lld_%d_local.safetensors", static_cast<long long>(iteration), owner);
  return buf;
}

std::string local_rank_dir(const std::string& root, int rank) { return root + "/" + std::to_string(rank); }

std::vector<int> replication_clique(int rank, int world, int jump, int factor) {
  GALE_CHECK(jump > 0 && factor > 0 && world % (jump * factor) == 0) << world << " " << jump << " " << factor;
  const int block = jump * factor;
  const int base = (rank / block) * block + rank % jump;
  std::vector<int> clique;
  for (int k = 0; k < factor; ++k) clique.push_back(base + k * jump);
  return clique;
}

LocalCheckpointManager::LocalCheckpointManager(LocalCheckpointConfig config, Communicator& world)
    : config_(std::move(config)), world_(world) {}

std::string LocalCheckpointManager::own_dir() const { return local_rank_dir(config_.root, world_.rank()); }

std::vector<std::pair<int64_t, int>> LocalCheckpointManager::own_parts() const {
  static const std::regex kPart(R"(iter_(\d{7,})_(\d+)_local\.safetensors)");
  std::vector<std::pair<int64_t, int>> parts;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(own_dir(), ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && std::regex_match(name, m, kPart))
      parts.emplace_back(std::stoll(m[1].str()), std::stoi(m[2].str()));
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

void LocalCheckpointManager::remove_parts(int64_t iteration, bool older) const {
  std::error_code ec;
  for (const auto& [it, owner] : own_parts())
    if (older ? it < iteration : it == iteration) fs::remove(own_dir() + "/" + local_part_file_name(it, owner), ec);
}

void LocalCheckpointManager::gather_availability() {
  const std::vector<std::pair<int64_t, int>> mine = own_parts();
  const int world = world_.size();
  int64_t count = static_cast<int64_t>(mine.size());
  std::vector<int64_t> counts(static_cast<size_t>(world));
  world_.all_gather(&count, counts.data(), 1, DType::kI64);
  const int64_t most = std::max<int64_t>(1, *std::max_element(counts.begin(), counts.end()));
  std::vector<int64_t> send(static_cast<size_t>(2 * most), -1), all(static_cast<size_t>(2 * most * world));
  for (size_t i = 0; i < mine.size(); ++i) {
    send[2 * i] = mine[i].first;
    send[2 * i + 1] = mine[i].second;
  }
  world_.all_gather(send.data(), all.data(), 2 * most, DType::kI64);
  holders_.clear();
  for (int r = 0; r < world; ++r)
    for (int64_t i = 0; i < counts[static_cast<size_t>(r)]; ++i) {
      const size_t at = static_cast<size_t>(2 * (r * most + i));
      holders_[{all[at], static_cast<int>(all[at + 1])}].insert(r);
    }
}

Status LocalCheckpointManager::save(const CheckpointWriter& writer, int64_t iteration, const nlohmann::json& sections) {
  const int rank = world_.rank(), world = world_.size();
  std::error_code ec;
  fs::create_directories(own_dir(), ec);
  const std::string own = own_dir() + "/" + local_part_file_name(iteration, rank);
  Status st = ec ? IOError(own_dir(), ": cannot create the local checkpoint directory: ", ec.message()) : Status::Ok();
  if (st.ok()) {
    const std::map<std::string, std::string> meta = {{"gale.local.format", kLocalPartFormat},
                                                     {"gale.local.version", std::to_string(kLocalPartVersion)},
                                                     {"gale.local.iteration", std::to_string(iteration)},
                                                     {"gale.local.owner", std::to_string(rank)},
                                                     {"gale.local.world_size", std::to_string(world)},
                                                     {"gale.local.algo", config_.algo},
                                                     {"gale.local.sections", sections.dump()}};
    st = writer.write_part(own, meta).status();
  }
  int failed = -1;
  if (!all_ok(world_, st.ok(), &failed)) {
    remove_parts(iteration, /*older=*/false);
    if (!st.ok()) return st;
    return IOError("local checkpoint of iteration ", iteration, ": rank ", failed, " failed to write its part");
  }
  if (config_.replication && config_.factor > 1) {
    // Every clique member sends its part to the others (sizes first), then writes what it received.
    const std::vector<int> clique = replication_clique(rank, world, config_.jump, config_.factor);
    StatusOr<std::string> bytes = read_whole_file(own);
    st = bytes.status();
    std::string data = bytes.ok() ? std::move(bytes).value() : std::string();
    int64_t size = bytes.ok() ? static_cast<int64_t>(data.size()) : -1;
    std::vector<WorkPtr> sends;
    for (int peer : clique)
      if (peer != rank) {
        sends.push_back(world_.send_async(&size, 1, DType::kI64, peer, 0));
        if (size > 0) sends.push_back(world_.send_async(data.data(), size, DType::kU8, peer, 1));
      }
    for (int peer : clique) {
      if (peer == rank) continue;
      int64_t peer_size = 0;
      world_.recv(&peer_size, 1, DType::kI64, peer, 0);
      if (peer_size < 0) {
        if (st.ok()) st = IOError("local checkpoint of iteration ", iteration, ": rank ", peer, " could not read its part");
        continue;
      }
      std::string replica(static_cast<size_t>(peer_size), '\0');
      if (peer_size > 0) world_.recv(replica.data(), peer_size, DType::kU8, peer, 1);
      if (st.ok()) st = write_file_atomically(own_dir() + "/" + local_part_file_name(iteration, peer), replica);
    }
    for (WorkPtr& w : sends) w->wait();
    if (!all_ok(world_, st.ok(), &failed)) {
      remove_parts(iteration, /*older=*/false);
      if (!st.ok()) return st;
      return IOError("local checkpoint of iteration ", iteration, ": rank ", failed, " failed to store its replicas");
    }
  }
  remove_parts(iteration, /*older=*/true);  // nvidia-resiliency-ext's _cleanup: every older part
  return Status::Ok();
}

StatusOr<LocalCheckpointSearch> LocalCheckpointManager::find_latest() {
  gather_availability();
  LocalCheckpointSearch s;
  std::map<int64_t, std::set<int>> owners;
  // Owners beyond this world (a save by more ranks) do not count: assemble() then names the
  // world size the parts were saved with.
  for (const auto& [key, ranks] : holders_)
    if (key.second < world_.size()) owners[key.first].insert(key.second);
  for (const auto& [iteration, set] : owners) {
    s.newest_seen = std::max(s.newest_seen, iteration);
    if (static_cast<int>(set.size()) == world_.size()) s.latest = std::max(s.latest, iteration);
  }
  if (s.newest_seen > s.latest) {
    const std::set<int>& have = owners[s.newest_seen];
    for (int r = 0; r < world_.size(); ++r)
      if (!have.count(r)) {
        s.missing_part = local_rank_dir(config_.root, r) + "/" + local_part_file_name(s.newest_seen, r);
        break;
      }
  }
  return s;
}

Status LocalCheckpointManager::assemble(int64_t iteration, bool all_parts, const std::string& into) {
  const int rank = world_.rank(), world = world_.size();
  std::error_code ec;
  fs::remove_all(into, ec);
  const std::string dir = iteration_dir(into, iteration);
  fs::create_directories(dir, ec);
  Status st = ec ? IOError(dir, ": cannot create: ", ec.message()) : Status::Ok();
  nlohmann::json shards = nlohmann::json::array();
  std::string sections_text;
  for (int owner = 0; owner < world; ++owner) {
    const auto found = holders_.find({iteration, owner});
    const std::set<int> holding = found == holders_.end() ? std::set<int>() : found->second;
    const std::string name = local_part_file_name(iteration, owner);
    const bool need = all_parts || owner == rank;
    if (holding.empty())  // the same decision on every rank
      return NotFound("local checkpoint of iteration ", iteration, ": ", local_rank_dir(config_.root, owner), "/", name,
                      " does not exist, and no rank holds a replica of it");
    bool anyone_lacks = false;  // a rank that needs the part and does not hold it
    for (int r = 0; r < world; ++r) anyone_lacks = anyone_lacks || ((all_parts || owner == r) && !holding.count(r));
    std::string bytes;
    if (holding.count(rank) && (need || anyone_lacks)) {
      StatusOr<std::string> read = read_whole_file(own_dir() + "/" + name);
      if (read.ok()) bytes = std::move(read).value();
      else if (st.ok()) st = read.status();
    }
    if (anyone_lacks) {
      const int sender = holding.count(owner) ? owner : *holding.begin();
      int64_t size = rank == sender ? (st.ok() ? static_cast<int64_t>(bytes.size()) : -1) : 0;
      world_.broadcast(&size, 1, DType::kI64, sender);
      if (size < 0) {
        if (st.ok()) st = IOError("local checkpoint of iteration ", iteration, ": rank ", sender, " could not read ", name);
        continue;
      }
      if (rank != sender) bytes.assign(static_cast<size_t>(size), '\0');
      world_.broadcast(bytes.data(), size, DType::kU8, sender);
    }
    if (!need || !st.ok()) continue;
    const std::string shard = dir + "/" + shard_file_name(owner);
    st = write_file_atomically(shard, bytes);
    if (!st.ok()) continue;
    StatusOr<SafetensorsFile> part = SafetensorsFile::open(shard);
    if (!part.ok()) {
      st = part.status();
      continue;
    }
    const std::map<std::string, std::string>& meta = part->metadata();
    auto value = [&](const char* key) {
      auto it = meta.find(key);
      return it == meta.end() ? std::string() : it->second;
    };
    if (value("gale.local.format") != kLocalPartFormat) {
      st = DataLoss(local_rank_dir(config_.root, owner), "/", name, ": not a local checkpoint part (gale.local.format '",
                    value("gale.local.format"), "', expected '", kLocalPartFormat, "')");
    } else if (value("gale.local.version") != std::to_string(kLocalPartVersion)) {
      st = Unimplemented(name, ": local checkpoint part version ", value("gale.local.version"),
                         "; this build of gale reads version ", kLocalPartVersion);
    } else if (value("gale.local.world_size") != std::to_string(world)) {
      st = FailedPrecondition("local checkpoint of iteration ", iteration, " was saved by ",
                              value("gale.local.world_size"), " ranks; this run has ", world,
                              " (a local checkpoint loads only at the world size that saved it)");
    } else if (value("gale.local.algo") != config_.algo) {
      st = FailedPrecondition("local checkpoint of iteration ", iteration, " was saved with "
                              "--non-persistent-local-ckpt-algo ", value("gale.local.algo"), "; this run has ",
                              config_.algo);
    }
    if (sections_text.empty()) sections_text = value("gale.local.sections");
    shards.push_back({{"file", shard_file_name(owner)},
                      {"rank", owner},
                      {"bytes", static_cast<int64_t>(bytes.size())},
                      {"crc32", static_cast<int64_t>(crc32_update(0, bytes.data(), bytes.size()))}});
  }
  if (st.ok()) {
    nlohmann::json meta = nlohmann::json::object();
    meta["format"] = kCheckpointFormat;
    meta["version"] = kCheckpointVersion;
    meta["iteration"] = iteration;
    meta["world_size"] = world;
    meta["shards"] = shards;
    try {
      nlohmann::json sections = nlohmann::json::parse(sections_text);
      for (auto it = sections.begin(); it != sections.end(); ++it) meta[it.key()] = it.value();
    } catch (const std::exception& e) {
      st = DataLoss("local checkpoint of iteration ", iteration, ": gale.local.sections is not valid JSON: ", e.what());
    }
    if (st.ok()) st = write_file_atomically(dir + "/" + kCheckpointMetadataFileName, meta.dump(1) + "\n");
    if (st.ok()) st = write_tracker(into, iteration);
  }
  int failed = -1;
  if (!all_ok(world_, st.ok(), &failed)) {
    if (!st.ok()) return st;
    return IOError("local checkpoint of iteration ", iteration, ": rank ", failed, " could not assemble its parts");
  }
  return Status::Ok();
}

}  // namespace gale
