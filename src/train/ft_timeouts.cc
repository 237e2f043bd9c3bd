// Fault-tolerance section timeouts: parsing, calculation from observed intervals, JSON state.
#include "train/ft_timeouts.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace gale {

namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  const size_t e = s.find_last_not_of(" \t");
  return s.substr(b, e - b + 1);
}

bool is_known_section(const std::string& name) {
  const auto& names = ft_section_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string seconds_text(const std::optional<double>& t) {
  if (!t) return "None";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fs", *t);
  return buf;
}

// Merges FT's way: the mean of a calculated current value and a new one (EMA, alpha 0.5).
double ema(double current, double fresh) { return 0.5 * current + 0.5 * fresh; }

}  // namespace

Status parse_ft_timeout(const std::string& text, const std::string& flag, std::optional<double>* out) {
  std::string t = trim(text);
  std::string lower = t;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower.empty() || lower == "none" || lower == "null") {
    *out = std::nullopt;
    return Status::Ok();
  }
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end == t.c_str() || *end != '\0' || !std::isfinite(v) || v <= 0.0)
    return InvalidArgument(flag, ": expected a positive number of seconds or none, found '", t, "'");
  *out = v;
  return Status::Ok();
}

Status parse_ft_section_timeouts(const std::string& text, const std::string& flag,
                                 std::map<std::string, std::optional<double>>* out) {
  out->clear();
  std::stringstream in(text);
  std::string entry;
  while (std::getline(in, entry, ',')) {
    const size_t colon = entry.find(':');
    if (colon == std::string::npos)
      return InvalidArgument(flag, ": expected section:seconds entries separated by commas (e.g. "
                             "setup:600,step:180,checkpointing:420), found '", trim(entry), "'");
    const std::string name = trim(entry.substr(0, colon));
    if (!is_known_section(name))
      return InvalidArgument(flag, ": unknown section '", name,
                             "'; Gale's training loop has the sections setup, step and checkpointing");
    if (out->count(name)) return InvalidArgument(flag, ": section '", name, "' given twice");
    std::optional<double> t;
    GALE_RETURN_IF_ERROR(parse_ft_timeout(entry.substr(colon + 1), str_cat(flag, " (section ", name, ")"), &t));
    (*out)[name] = t;
  }
  for (const std::string& name : ft_section_names())
    if (!out->count(name))
      return InvalidArgument(flag, ": expected a timeout for each of setup, step and checkpointing (none for no "
                             "timeout), found none for '", name, "' in '", text, "'");
  return Status::Ok();
}

std::string describe_ft_timeouts(const FtSectionTimeouts& t) {
  std::string s;
  for (const std::string& name : ft_section_names()) {
    auto it = t.section.find(name);
    s += str_cat(name, "=", seconds_text(it == t.section.end() ? std::nullopt : it->second), ", ");
  }
  return s + "out-of-section=" + seconds_text(t.out_of_section);
}

// ---- FtTimeoutsCalc ----

FtTimeoutsCalc::FtTimeoutsCalc(double start_time, double safety_factor)
    : safety_factor_(safety_factor), last_close_(start_time) {
  for (const std::string& name : ft_section_names()) section_max_[name] = -1.0;
}

Status FtTimeoutsCalc::open_section(const std::string& name, double now) {
  if (!section_max_.count(name)) return InvalidArgument("FT: unknown section '", name, "'");
  if (open_.count(name)) return FailedPrecondition("FT: section '", name, "' is already open");
  bump_out_of_section(now);
  open_[name] = now;
  return Status::Ok();
}

Status FtTimeoutsCalc::close_section(const std::string& name, double now) {
  auto it = open_.find(name);
  if (it == open_.end()) return FailedPrecondition("FT: section '", name, "' is not open");
  section_max_[name] = std::max(section_max_[name], now - it->second);
  open_.erase(it);
  if (open_.empty()) last_close_ = now;
  return Status::Ok();
}

void FtTimeoutsCalc::bump_out_of_section(double now) {
  if (open_.empty()) out_of_section_max_ = std::max(out_of_section_max_, now - last_close_);
}

std::vector<double> FtTimeoutsCalc::maxima() const {
  std::vector<double> m = {out_of_section_max_};
  for (const std::string& name : ft_section_names()) m.push_back(section_max_.at(name));
  return m;
}

void FtTimeoutsCalc::set_maxima(const std::vector<double>& m) {
  out_of_section_max_ = m.at(0);
  const auto& names = ft_section_names();
  for (size_t i = 0; i < names.size(); ++i) section_max_[names[i]] = m.at(i + 1);
}

StatusOr<FtSectionTimeouts> FtTimeoutsCalc::calculate(const std::vector<std::string>& selected,
                                                      bool calc_out_of_section,
                                                      const FtSectionTimeouts& current) const {
  for (const std::string& name : selected) {
    auto it = section_max_.find(name);
    if (it == section_max_.end()) return InvalidArgument("FT: unknown section '", name, "'");
    if (it->second <= 0.0) return FailedPrecondition("FT: section '", name, "' was never observed");
  }
  if (calc_out_of_section && out_of_section_max_ <= 0.0)
    return FailedPrecondition("FT: no out-of-section interval was observed");
  FtSectionTimeouts merged = current;
  for (const std::string& name : selected) {
    const double fresh = safety_factor_ * section_max_.at(name);
    const std::optional<double>& cur = current.section.count(name) ? current.section.at(name) : std::nullopt;
    merged.section[name] = current.calculated_sections.count(name) && cur ? ema(*cur, fresh) : fresh;
    merged.calculated_sections.insert(name);
  }
  if (calc_out_of_section) {
    const double fresh = safety_factor_ * out_of_section_max_;
    merged.out_of_section =
        current.is_out_of_section_calculated && current.out_of_section ? ema(*current.out_of_section, fresh) : fresh;
    merged.is_out_of_section_calculated = true;
  }
  return merged;
}

// ---- JSON state ----

nlohmann::json ft_state_to_json(const FtSectionTimeouts& t) {
  nlohmann::json state = {{"current_timeouts", nlohmann::json::object()}};
  if (t.calculated_sections.empty() && !t.is_out_of_section_calculated) return state;
  nlohmann::json section = nlohmann::json::object();
  for (const auto& [name, v] : t.section) section[name] = v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  nlohmann::json calculated = nlohmann::json::array();
  for (const std::string& name : t.calculated_sections) calculated.push_back(name);  // std::set: sorted
  state["current_timeouts"]["section"] = {
      {"section", section},
      {"out_of_section", t.out_of_section ? nlohmann::json(*t.out_of_section) : nlohmann::json(nullptr)},
      {"calculated_sections", calculated},
      {"is_out_of_section_calculated", t.is_out_of_section_calculated}};
  return state;
}

StatusOr<std::optional<FtSectionTimeouts>> ft_state_from_json(const nlohmann::json& j, const std::string& path) {
  auto bad = [&](const std::string& what) {
    return DataLoss(path, ": not a fault-tolerance state (", what, "; docs/formats/ft-state.md)");
  };
  auto timeout_of = [](const nlohmann::json& v, std::optional<double>* out) {
    if (v.is_null()) {
      *out = std::nullopt;
      return true;
    }
    if (!v.is_number() || v.get<double>() <= 0.0) return false;
    *out = v.get<double>();
    return true;
  };
  if (!j.is_object() || !j.contains("current_timeouts") || !j["current_timeouts"].is_object())
    return bad("expected an object with a \"current_timeouts\" object");
  const nlohmann::json& cur = j["current_timeouts"];
  if (!cur.contains("section")) return std::optional<FtSectionTimeouts>();
  const nlohmann::json& s = cur["section"];
  if (!s.is_object() || !s.contains("section") || !s["section"].is_object())
    return bad("expected current_timeouts.section.section to be an object");
  FtSectionTimeouts t;
  for (const auto& [name, v] : s["section"].items()) {
    std::optional<double> timeout;
    if (!timeout_of(v, &timeout)) return bad(str_cat("the timeout of section '", name, "' is not a positive number or null"));
    t.section[name] = timeout;
  }
  for (const std::string& name : ft_section_names())
    if (!t.section.count(name)) return bad(str_cat("no timeout for section '", name, "'"));
  if (s.contains("out_of_section") && !timeout_of(s["out_of_section"], &t.out_of_section))
    return bad("out_of_section is not a positive number or null");
  if (s.contains("calculated_sections")) {
    if (!s["calculated_sections"].is_array()) return bad("calculated_sections is not a list");
    for (const nlohmann::json& n : s["calculated_sections"]) {
      if (!n.is_string()) return bad("calculated_sections holds a non-string");
      t.calculated_sections.insert(n.get<std::string>());
    }
  }
  if (s.contains("is_out_of_section_calculated")) {
    if (!s["is_out_of_section_calculated"].is_boolean()) return bad("is_out_of_section_calculated is not a boolean");
    t.is_out_of_section_calculated = s["is_out_of_section_calculated"].get<bool>();
  }
  return std::optional<FtSectionTimeouts>(t);
}

std::string ft_state_path(const std::string& save_dir) {
  return (std::filesystem::path(save_dir) / "ft_state.json").string();
}

Status write_ft_state(const std::string& path, const FtSectionTimeouts& t) {
  std::error_code ec;
  const std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  const std::string tmp = str_cat(path, ".tmp.", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return IOError(tmp, ": cannot write the fault-tolerance state");
    out << ft_state_to_json(t).dump() << "\n";
    if (!out.good()) return IOError(tmp, ": cannot write the fault-tolerance state");
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) return IOError(path, ": cannot write the fault-tolerance state (", ec.message(), ")");
  return Status::Ok();
}

StatusOr<std::optional<FtSectionTimeouts>> read_ft_state(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::optional<FtSectionTimeouts>();
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return DataLoss(path, ": not valid JSON (the fault-tolerance state; docs/formats/ft-state.md)");
  return ft_state_from_json(j, path);
}

}  // namespace gale
