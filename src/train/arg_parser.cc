// ArgParser over CLI11, with Megatron-style errors.
#include "train/arg_parser.h"

#include <CLI/CLI.hpp>
#include <cctype>
#include <functional>
#include <map>
#include <sstream>

namespace gale {

struct ArgParser::Impl {
  CLI::App app;
  std::string group = "general";
  std::vector<std::pair<std::string, CLI::Option*>> options;  // first name -> option
  struct Refusal {
    std::string message;  // the error after "<flag>: "
    bool not_yet;         // add_unsupported (Unimplemented) rather than add_rejected (InvalidArgument)
  };
  std::map<std::string, Refusal> refused;  // flag -> its error
  std::map<std::string, std::vector<std::string>> refused_sink;
  std::vector<std::pair<std::string, std::string>> compat;  // flag -> note
  std::map<std::string, std::string> compat_values;
  std::map<std::string, bool> compat_flags;
  std::map<std::string, std::vector<std::string>> compat_lists;
  std::map<std::string, bool> supported;
  std::map<std::string, ArgParser::Kind> kind;  // flag -> what follows it (FlagInfo::kind)
  std::map<std::string, std::string> value_kind;  // flag -> "an integer" / "a number", for conversion errors
  // nargs='+' flags whose last occurrence wins: flag -> keeps the last n values of its destination
  std::vector<std::pair<std::string, std::function<void(size_t)>>> last_occurrence;
  Impl(const std::string& program, const std::string& description) : app(description, program) {
    app.allow_extras(false);
    app.option_defaults()->always_capture_default();
    // As argparse: a flag given twice keeps its last value (scripts append overrides).
    app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
  static std::string first_name(const std::string& flag) { return flag.substr(0, flag.find(',')); }
  CLI::Option* record(const std::string& flag, CLI::Option* opt, bool is_supported = true,
                      ArgParser::Kind flag_kind = ArgParser::Kind::kValue) {
    opt->group(group);
    options.emplace_back(first_name(flag), opt);
    supported[first_name(flag)] = is_supported;
    kind[first_name(flag)] = is_supported ? flag_kind : ArgParser::Kind::kRefused;
    return opt;
  }
};

ArgParser::ArgParser(std::string program, std::string description)
    : impl_(std::make_unique<Impl>(program, description)) {}
ArgParser::~ArgParser() = default;

void ArgParser::group(const std::string& name) { impl_->group = name; }

void ArgParser::add(const std::string& flag, int64_t* dest, const std::string& help) {
  impl_->record(flag, impl_->app.add_option(flag, *dest, help));
  impl_->value_kind[Impl::first_name(flag)] = "an integer";
}
void ArgParser::add(const std::string& flag, int* dest, const std::string& help) {
  impl_->record(flag, impl_->app.add_option(flag, *dest, help));
  impl_->value_kind[Impl::first_name(flag)] = "an integer";
}
void ArgParser::add(const std::string& flag, double* dest, const std::string& help) {
  impl_->record(flag, impl_->app.add_option(flag, *dest, help));
  impl_->value_kind[Impl::first_name(flag)] = "a number";
}
void ArgParser::add(const std::string& flag, std::string* dest, const std::string& help) {
  impl_->record(flag, impl_->app.add_option(flag, *dest, help));
}
void ArgParser::add_choice(const std::string& flag, std::string* dest, const std::vector<std::string>& choices,
                           const std::string& help) {
  impl_->record(flag, impl_->app.add_option(flag, *dest, help)->check(CLI::IsMember(choices)));
}
void ArgParser::add_list(const std::string& flag, std::vector<std::string>* dest, const std::string& help,
                         int min_values) {
  CLI::Option* opt = impl_->app.add_option(flag, *dest, help)->expected(min_values, 1 << 20);
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  impl_->record(flag, opt, true, Kind::kList);
}
void ArgParser::add_choice_list(const std::string& flag, std::vector<std::string>* dest,
                                const std::vector<std::string>& choices, const std::string& help,
                                const std::string& default_text) {
  CLI::Option* opt = impl_->app.add_option(flag, *dest, help)->expected(1, 1 << 20)->check(CLI::IsMember(choices));
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->default_str(default_text);
  impl_->record(flag, opt, true, Kind::kList);
  impl_->last_occurrence.emplace_back(Impl::first_name(flag), [dest](size_t n) {
    if (dest->size() > n) dest->erase(dest->begin(), dest->end() - static_cast<std::ptrdiff_t>(n));
  });
}
void ArgParser::add_list(const std::string& flag, std::vector<double>* dest, const std::string& help,
                         const std::string& default_text) {
  CLI::Option* opt = impl_->app.add_option(flag, *dest, help)->expected(1, 1 << 20);
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)->default_str(default_text);
  impl_->record(flag, opt, true, Kind::kList);
  impl_->value_kind[Impl::first_name(flag)] = "a number";
  impl_->last_occurrence.emplace_back(Impl::first_name(flag), [dest](size_t n) {
    if (dest->size() > n) dest->erase(dest->begin(), dest->end() - static_cast<std::ptrdiff_t>(n));
  });
}
void ArgParser::add_flag(const std::string& flag, bool* dest, const std::string& help) {
  impl_->record(flag, impl_->app.add_flag(flag, *dest, help), true, Kind::kSwitch);
}
void ArgParser::add_false(const std::string& flag, bool* dest, const std::string& help) {
  bool initial = *dest;
  CLI::Option* opt = impl_->app.add_flag_callback(flag, [dest] { *dest = false; }, help);
  opt->default_str(initial ? "false" : "true");
  impl_->record(flag, opt, true, Kind::kSwitch);
}

void ArgParser::add_unsupported(const std::string& flag, const std::string& why) {
  add_refused(flag, "not supported yet (" + why + ")", true);
}

void ArgParser::add_rejected(const std::string& flag, const std::string& message) {
  add_refused(flag, message, false);
}

void ArgParser::add_refused(const std::string& flag, const std::string& message, bool not_yet) {
  auto& sink = impl_->refused_sink[flag];
  CLI::Option* opt =
      impl_->app.add_option(flag, sink, (not_yet ? "" : "refused: ") + message)->expected(0, 1 << 20);
  opt->default_str("");  // with a captured default string, a value-less flag would count 0
  impl_->record(flag, opt, false)->group(not_yet ? "not supported yet" : "refused");
  impl_->refused[Impl::first_name(flag)] = {message, not_yet};
}

void ArgParser::add_compat(const std::string& flag, bool takes_value, const std::string& note) {
  CLI::Option* opt = takes_value ? impl_->app.add_option(flag, impl_->compat_values[flag], "accepted: " + note)
                                 : impl_->app.add_flag(flag, impl_->compat_flags[flag], "accepted: " + note);
  impl_->record(flag, opt, true, takes_value ? Kind::kValue : Kind::kSwitch)
      ->group("accepted for compatibility (no effect in Gale)");
  impl_->compat.emplace_back(Impl::first_name(flag), note);
}

void ArgParser::add_compat_list(const std::string& flag, const std::string& note) {
  CLI::Option* opt = impl_->app.add_option(flag, impl_->compat_lists[flag], "accepted: " + note)->expected(1, 1 << 20);
  opt->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  impl_->record(flag, opt, true, Kind::kList)->group("accepted for compatibility (no effect in Gale)");
  impl_->compat.emplace_back(Impl::first_name(flag), note);
}

std::vector<std::string> ArgParser::compat_notices() const {
  std::vector<std::string> out;
  for (const auto& [flag, note] : impl_->compat)
    if (was_set(flag)) out.push_back(flag + ": " + note);
  return out;
}

Status ArgParser::parse(int argc, char** argv) {
  try {
    impl_->app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    help_requested_ = true;
    return Status::Ok();
  } catch (const CLI::ExtrasError& e) {
    // "The following arguments were not expected: 3 --foo" (CLI11's order): name the first flag.
    std::string what = e.what();
    auto colon = what.find(": ");
    std::istringstream rest(colon == std::string::npos ? what : what.substr(colon + 2));
    std::string token, first;
    while (rest >> token) {
      if (first.empty()) first = token;
      if (token.size() > 1 && token[0] == '-' && !std::isdigit(static_cast<unsigned char>(token[1])))
        return InvalidArgument("unknown flag ", token, " (run `", impl_->app.get_name(), " --help` for the list)");
    }
    return InvalidArgument("unexpected argument '", first, "': every value must follow a --flag");
  } catch (const CLI::ConversionError& e) {
    // "Could not convert: --lr = 1e-3,abc" (with TakeLast the values are joined): name flag and value.
    std::string what = e.what();
    auto a = what.find(": "), b = what.find(" = ");
    if (a != std::string::npos && b != std::string::npos && b > a) {
      std::string flag = what.substr(a + 2, b - a - 2), value = what.substr(b + 3);
      if (auto comma = value.rfind(','); comma != std::string::npos) value = value.substr(comma + 1);
      auto kind = impl_->value_kind.find(flag);
      return InvalidArgument(flag, ": expected ", kind == impl_->value_kind.end() ? "a valid value" : kind->second,
                             ", found '", value, "'");
    }
    return InvalidArgument(what);
  } catch (const CLI::ParseError& e) {
    return InvalidArgument(e.what());
  }
  // argparse: a nargs='+' flag given twice keeps the values of its last occurrence ("--f=v": one;
  // "--f v1 v2 ...": up to the next token that starts with "--").
  for (const auto& [flag, keep_last] : impl_->last_occurrence) {
    if (!was_set(flag)) continue;
    for (int i = argc - 1; i >= 1; --i) {
      const std::string arg = argv[i];
      if (arg.rfind(flag + "=", 0) == 0) {
        keep_last(1);
        break;
      }
      if (arg != flag) continue;
      size_t n = 0;
      while (i + 1 + static_cast<int>(n) < argc && std::string(argv[i + 1 + n]).rfind("--", 0) != 0) ++n;
      keep_last(n);
      break;
    }
  }
  auto refusal = [](const std::string& flag, const Impl::Refusal& r) {
    return r.not_yet ? Unimplemented(flag, ": ", r.message) : InvalidArgument(flag, ": ", r.message);
  };
  for (const auto& [flag, r] : impl_->refused) {
    if (was_set(flag)) return refusal(flag, r);
  }
  // CLI11 (2.1, with always_capture_default) reports count() == 0 for an option given without
  // values, so valueless refused flags (--fp16, --split-sentences) are also looked up in argv.
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto it = impl_->refused.find(arg.substr(0, arg.find('=')));
    if (it != impl_->refused.end()) return refusal(it->first, it->second);
  }
  return Status::Ok();
}

std::string ArgParser::help_text() const { return impl_->app.help(); }

bool ArgParser::was_set(const std::string& flag) const {
  for (const auto& [name, opt] : impl_->options)
    if (name == flag) return opt->count() > 0;
  return false;
}

std::vector<std::string> ArgParser::given_flags() const {
  std::vector<std::string> out;
  for (const auto& [name, opt] : impl_->options)
    if (opt->count() > 0) out.push_back(name);
  return out;
}

std::vector<ArgParser::FlagInfo> ArgParser::flags() const {
  std::vector<FlagInfo> out;
  for (const auto& [name, opt] : impl_->options) {
    FlagInfo info;
    info.flag = name;
    info.group = opt->get_group();
    info.help = opt->get_description();
    info.default_value = opt->get_default_str();
    info.supported = impl_->supported[name];
    info.kind = impl_->kind[name];
    out.push_back(info);
  }
  return out;
}

}  // namespace gale
