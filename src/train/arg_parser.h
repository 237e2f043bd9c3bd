// Megatron-style command-line flags on top of CLI11: typed flags bound to struct fields,
// presence tests, "not supported yet" flags, and one-line errors that name the flag.
//
// Flags are spelled as in Megatron (`--num-layers 12`, `--swiglu`, `--no-load-optim`,
// `--data-path 0.3 a 0.7 b`); `--flag=value` also works. A flag string may list aliases after a
// comma ("--save-interval,--persistent-save-interval"); the first name is the flag's name for
// was_set(). CLI11 stays inside arg_parser.cc.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

class ArgParser {
 public:
  ArgParser(std::string program, std::string description);
  ~ArgParser();
  ArgParser(const ArgParser&) = delete;
  ArgParser& operator=(const ArgParser&) = delete;

  // Start a help section ("model", "training", ...); later flags are listed under it.
  void group(const std::string& name);

  // A flag taking one value, bound to *dest (whose current value is the default).
  void add(const std::string& flag, int64_t* dest, const std::string& help);
  void add(const std::string& flag, int* dest, const std::string& help);
  void add(const std::string& flag, double* dest, const std::string& help);
  void add(const std::string& flag, std::string* dest, const std::string& help);
  // A flag taking one value from a fixed set.
  void add_choice(const std::string& flag, std::string* dest, const std::vector<std::string>& choices,
                  const std::string& help);
  // A flag taking zero or more values (argparse nargs='*'); `min_values` may require one.
  void add_list(const std::string& flag, std::vector<std::string>* dest, const std::string& help, int min_values = 0);
  // A flag taking one or more values (argparse nargs='+'), each from a fixed set (`choices`) or a
  // number (the double list); given twice, the last occurrence's values win (argparse), and
  // `default_text` is the default the help and flags() show.
  void add_choice_list(const std::string& flag, std::vector<std::string>* dest, const std::vector<std::string>& choices,
                       const std::string& help, const std::string& default_text);
  void add_list(const std::string& flag, std::vector<double>* dest, const std::string& help,
                const std::string& default_text);
  // A store_true flag; `add_false` is a store_false flag (e.g. --no-load-optim -> load_optim=false).
  void add_flag(const std::string& flag, bool* dest, const std::string& help);
  void add_false(const std::string& flag, bool* dest, const std::string& help);
  // A Megatron flag that Gale knows but does not implement yet: accepted by the parser (with any
  // number of values) and then rejected by parse() with "<flag>: not supported yet (<why>)".
  void add_unsupported(const std::string& flag, const std::string& why);
  // A Megatron flag Gale always refuses, with "<flag>: <message>" (InvalidArgument): flags that
  // Megatron itself rejects as deprecated (--batch-size: use --micro-batch-size) and flags of models
  // Gale does not build (BERT, T5, retrieval, vision). Accepted with any number of values first, so
  // that the error names this flag and not its values.
  void add_rejected(const std::string& flag, const std::string& message);

  // A Megatron flag Gale accepts (so existing scripts run) although it changes nothing here, e.g.
  // --attention-softmax-in-fp32 (always true in Gale) or --initial-loss-scale without --fp16.
  // `note` says why; compat_notices() returns "<flag>: <note>" for each one given, for start-up.
  // `takes_value`: whether the flag is followed by a value.
  void add_compat(const std::string& flag, bool takes_value, const std::string& note);
  // The same for a flag followed by one or more values (MindSpeed's `--virtual-optimizer 6 5 4 3`).
  void add_compat_list(const std::string& flag, const std::string& note);
  std::vector<std::string> compat_notices() const;

  // Parse argv[1..argc) (argv[0] is the program name). Returns an error naming the flag for an
  // unknown flag, a missing or badly formed value, a value outside a choice list, or an
  // unsupported flag. After `--help`, help_requested() is true and help_text() has the text.
  Status parse(int argc, char** argv);
  bool help_requested() const { return help_requested_; }
  std::string help_text() const;

  // True when the user gave `flag` on the command line (aliases count).
  bool was_set(const std::string& flag) const;
  // Every flag the user gave, in the order registered (for the start-up arguments dump).
  std::vector<std::string> given_flags() const;

  // All registered flags with their group, for documentation and `gale features`.
  // kind: what follows the flag: one value, a list of values, nothing (a switch), or anything (a
  // refused flag, accepted with any number of values so that its error names it).
  enum class Kind { kValue, kList, kSwitch, kRefused };
  struct FlagInfo {
    std::string flag, group, help, default_value;
    bool supported = true;
    Kind kind = Kind::kValue;
  };
  std::vector<FlagInfo> flags() const;

 private:
  void add_refused(const std::string& flag, const std::string& message, bool not_yet);
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool help_requested_ = false;
};

}  // namespace gale
