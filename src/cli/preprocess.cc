// `gale preprocess`: Megatron's tools/preprocess_data.py (jsonl -> .bin/.idx per JSON key).
#include "data/preprocess.h"

#include <cstdio>

#include "cli/subcommands.h"
#include "core/log.h"
#include "tokenizer/tokenizer.h"
#include "train/arg_parser.h"
#include "train/arguments.h"

namespace gale::cli {

namespace {
int fail(const Status& s) {
  std::fprintf(stderr, "gale preprocess: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}
}  // namespace

int run_preprocess(int argc, char** argv) {
  ArgParser p("gale preprocess",
              "Tokenize a JSON-lines corpus into Megatron .bin/.idx datasets (tools/preprocess_data.py)");
  PreprocessOptions o;
  TokenizerArgs tok;
  int64_t partitions = 1, workers = -1;
  std::string lang = "english";
  bool keep_sequential = false;
  p.group("input data");
  p.add("--input", &o.input, "input .jsonl file (.gz is read too)");
  p.add_list("--json-keys", &o.json_keys, "keys to extract; each gets its own dataset (default: text)", 1);
  p.add_unsupported("--split-sentences", "sentence splitting (NLTK punkt)");
  p.add_unsupported("--keep-newlines", "sentence splitting (NLTK punkt)");
  add_tokenizer_args(p, tok);
  p.group("tokenization process");
  p.add_flag("--append-eod", &o.append_eod, "append the tokenizer's end-of-document token to every non-empty document");
  p.add("--lang", &lang, "sentence-splitting language (accepted; only used with --split-sentences)");
  p.group("output data");
  p.add("--output-prefix", &o.output_prefix, "output prefix: writes PREFIX_KEY_document.bin/.idx");
  p.group("runtime");
  p.add("--workers", &workers, "tokenizer threads (required); the output order is the input order");
  p.add("--partitions", &partitions, "input partitions (only 1: Gale parallelises with threads)");
  p.add("--log-interval", &o.log_interval, "documents between progress lines on stderr");
  p.add_flag("--keep-sequential-samples", &keep_sequential,
             "accepted (the order is always sequential with 1 partition)");
  p.add_flag("--skip-bad-lines", &o.skip_bad_lines,
             "Gale: skip malformed lines (counted and reported) instead of stopping");
  Status s = p.parse(argc, argv);
  if (!s.ok()) return fail(s);
  if (p.help_requested()) {
    std::printf("%s", p.help_text().c_str());
    return 0;
  }
  if (o.input.empty()) return fail(InvalidArgument("--input is required"));
  if (o.output_prefix.empty()) return fail(InvalidArgument("--output-prefix is required"));
  if (workers == -1) return fail(InvalidArgument("--workers is required (number of tokenizer threads)"));
  if (workers < 1 || workers > 1024)
    return fail(InvalidArgument("--workers: expected an integer in [1, 1024], found ", workers));
  if (partitions != 1)
    return fail(Unimplemented("--partitions ", partitions,
                              ": not supported (Gale tokenizes one file with --workers threads; "
                              "merge separate outputs with `gale merge-datasets`)"));
  if (tok.tokenizer_type.empty())
    return fail(
        InvalidArgument("--tokenizer-type is required (e.g. GPT2BPETokenizer, HuggingFaceTokenizer, Llama2Tokenizer)"));
  o.workers = static_cast<int>(workers);

  TokenizerOptions to{tok.tokenizer_type,  tok.vocab_file, tok.merge_file,
                      tok.tokenizer_model, tok.vocab_size, tok.vocab_extra_ids};
  auto tokenizer = build_tokenizer(to);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const Tokenizer& t = **tokenizer;
  o.dtype = optimal_token_dtype(t.vocab_size());
  o.eod = t.eod();
  o.vocab_size = t.vocab_size();
  std::fprintf(stderr, "%s\n", t.describe().c_str());
  auto stats = gale::run_preprocess(
      o, [&t](std::string_view text, std::vector<int32_t>* ids) { return t.encode(text, ids); }, stderr);
  if (!stats.ok()) return fail(stats.status());
  double dt = stats->seconds > 0 ? stats->seconds : 1e-9;
  for (const auto& out : stats->outputs) std::printf("wrote %s.bin and %s.idx\n", out.c_str(), out.c_str());
  std::printf("%lld documents, %lld tokens (%s), %.2f s: %.0f tokens/s, %.2f MB/s, %d worker%s",
              static_cast<long long>(stats->documents), static_cast<long long>(stats->tokens),
              token_dtype_name(o.dtype), stats->seconds, stats->tokens / dt, stats->input_bytes / dt / 1024 / 1024,
              o.workers, o.workers == 1 ? "" : "s");
  if (stats->skipped_lines) std::printf("; skipped %lld bad lines", static_cast<long long>(stats->skipped_lines));
  std::printf("\n");
  return 0;
}

}  // namespace gale::cli
