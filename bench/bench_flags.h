// "--name N" integer options of the MPI schedule benchmarks, with an error for anything else.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

namespace gale::bench {

// Reads argv as pairs "--name N" into the matching int of `flags`. An unknown name, a missing or
// non-integer value prints what was expected and what was found, and exits with status 2.
inline void parse_int_flags(const char* program, int argc, char** argv,
                            std::initializer_list<std::pair<const char*, int*>> flags) {
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    int* target = nullptr;
    for (const auto& [name, value] : flags)
      if (flag == name) target = value;
    if (target == nullptr) {
      std::string known;
      for (const auto& f : flags) known += std::string(known.empty() ? "" : ", ") + f.first;
      std::fprintf(stderr, "%s: unknown option '%s' (expected one of %s, each followed by an integer)\n", program,
                   flag.c_str(), known.c_str());
      std::exit(2);
    }
    char* end = nullptr;
    const long v = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : 0;
    if (i + 1 >= argc || end == argv[i + 1] || *end != '\0') {
      std::fprintf(stderr, "%s: %s expects an integer, found '%s'\n", program, flag.c_str(),
                   i + 1 < argc ? argv[i + 1] : "nothing");
      std::exit(2);
    }
    *target = static_cast<int>(v);
  }
}

}  // namespace gale::bench
