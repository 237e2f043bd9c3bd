// Checkpoint directory and file names; the tracker file.
#include "ckpt/checkpoint_layout.h"

#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "ckpt/atomic_file.h"

namespace gale {

std::string iteration_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::string iteration_dir(const std::string& save_dir, int64_t iteration) {
  return save_dir + "/" + iteration_dir_name(iteration);
}

std::string shard_file_name(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "shard_%05d.safetensors", rank);
  return buf;
}

std::string tracker_path(const std::string& save_dir) { return save_dir + "/" + kTrackerFileName; }

StatusOr<TrackerValue> read_tracker(const std::string& save_dir) {
  std::string path = tracker_path(save_dir);
  std::ifstream in(path);
  if (!in) return NotFound(path, ": not found (no checkpoint has been saved in ", save_dir, ")");
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  std::string value = text.substr(b, e - b);
  if (value == kReleaseDirName) return TrackerValue{0, true};
  bool digits = !value.empty() && value.size() <= 18;
  for (char c : value) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  if (!digits) return DataLoss(path, ": expected an iteration number or 'release', found '", value.substr(0, 40), "'");
  return TrackerValue{std::stoll(value), false};
}

Status write_tracker(const std::string& save_dir, int64_t iteration) {
  return write_file_atomically(tracker_path(save_dir), std::to_string(iteration));
}

}  // namespace gale
