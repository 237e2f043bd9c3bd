// Fault tolerance (--enable-ft-package): section timeouts, their calculation from observed
// intervals (--calc-ft-timeouts) and their JSON state (ft_state.json), as nvidia-resiliency-ext's
// fault_tolerance package (v0.3: data.SectionTimeouts, timeouts_calc.TimeoutsCalc,
// RankMonitorClient.state_dict) does for Megatron's ft_integration. docs/fault-tolerance.md,
// docs/formats/ft-state.md.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

// Megatron's FT sections, in the order Gale reports and stores them.
inline const std::vector<std::string>& ft_section_names() {
  static const std::vector<std::string> names = {"setup", "step", "checkpointing"};
  return names;
}

// The timeouts in force. A timeout that is nullopt is off (FT's None: +infinity).
struct FtSectionTimeouts {
  std::map<std::string, std::optional<double>> section;  // seconds a section may stay open
  std::optional<double> out_of_section;                   // seconds with no section open
  std::set<std::string> calculated_sections;  // sections whose timeout came from observed intervals
  bool is_out_of_section_calculated = false;
  bool operator==(const FtSectionTimeouts&) const = default;
};

// "setup:600,step:180,checkpointing:420" (ft_launcher's --ft-param-rank_section_timeouts): each
// entry section:seconds, seconds a positive number or none / null / empty (no timeout). Every one
// of setup, step and checkpointing must be given, and no other section. `flag` names the flag in
// errors.
Status parse_ft_section_timeouts(const std::string& text, const std::string& flag,
                                 std::map<std::string, std::optional<double>>* out);
// A positive number of seconds, or none / null / empty (nullopt).
Status parse_ft_timeout(const std::string& text, const std::string& flag, std::optional<double>* out);
// "setup=600.00s, step=180.00s, checkpointing=None, out-of-section=300.00s" for the logs.
std::string describe_ft_timeouts(const FtSectionTimeouts& t);

// FT's TimeoutsCalc: per section the longest interval it was open, and the longest stretch with no
// section open (measured when a section opens, and when timeouts are calculated), in seconds of the
// caller's clock. Sections may nest or overlap; the same section cannot be opened twice.
class FtTimeoutsCalc {
 public:
  FtTimeoutsCalc(double start_time, double safety_factor);

  Status open_section(const std::string& name, double now);
  Status close_section(const std::string& name, double now);
  // FT's maybe_bump_oos_time: with no section open, the stretch since the last close counts.
  void bump_out_of_section(double now);

  // The observed maxima as one vector (out-of-section first, then ft_section_names()), -1 when not
  // observed; set_maxima takes the element-wise maximum over ranks back (FT's synchronize_all).
  std::vector<double> maxima() const;
  void set_maxima(const std::vector<double>& m);

  // FT's get_section_timeouts: each selected section (and, with calc_out_of_section, the
  // out-of-section stretch) gets safety_factor × its longest observed interval; merged with
  // `current`: a timeout calculated before as well becomes the mean of the two (FT's EMA with
  // alpha 0.5), one not calculated now keeps the current value. An error when a selected interval
  // was never observed.
  StatusOr<FtSectionTimeouts> calculate(const std::vector<std::string>& selected, bool calc_out_of_section,
                                        const FtSectionTimeouts& current) const;

  double section_max(const std::string& name) const { return section_max_.at(name); }
  double out_of_section_max() const { return out_of_section_max_; }

 private:
  double safety_factor_;
  std::map<std::string, double> open_;  // section -> when it opened
  std::map<std::string, double> section_max_;
  double last_close_;
  double out_of_section_max_ = -1.0;
};

// FT's RankMonitorClient.state_dict as JSON: {"current_timeouts": {"section": {...}}} where the
// "section" object (present only once some timeout was calculated) holds "section" (name ->
// seconds or null), "out_of_section", "calculated_sections" (sorted names) and
// "is_out_of_section_calculated". docs/formats/ft-state.md.
nlohmann::json ft_state_to_json(const FtSectionTimeouts& t);
// The timeouts a state holds, nullopt when it holds none (no "section" entry). Errors name `path`.
StatusOr<std::optional<FtSectionTimeouts>> ft_state_from_json(const nlohmann::json& j, const std::string& path);

// <save>/ft_state.json, where Megatron's ft_integration keeps the state.
std::string ft_state_path(const std::string& save_dir);
// Written atomically (a temporary file renamed over it).
Status write_ft_state(const std::string& path, const FtSectionTimeouts& t);
// nullopt when the file does not exist or holds no calculated timeouts.
StatusOr<std::optional<FtSectionTimeouts>> read_ft_state(const std::string& path);

}  // namespace gale
