// `gale preprocess`: Megatron's tools/preprocess_data.py (jsonl -> .bin/.idx per JSON key), and
// MindSpeed-LLM's instruction handlers (--handler-name AlpacaStyleInstructionHandler,
// SharegptStyleInstructionHandler) and its pairwise handler (AlpacaStylePairwiseHandler, for DPO).
#include "data/preprocess.h"

#include <cstdio>
#include <optional>

#include "cli/subcommands.h"
#include "core/log.h"
#include "data/instruction_preprocess.h"
#include "data/pairwise_preprocess.h"
#include "data/sharegpt_records.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/punkt.h"
#include "tokenizer/tokenizer.h"
#include "train/arg_parser.h"
#include "train/arguments.h"
#include "train/data_setup.h"

namespace gale::cli {

namespace {
int fail(const Status& s) {
  std::fprintf(stderr, "gale preprocess: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}
struct InstructionFlags {
  std::string handler_name, prompt_type, map_keys, prompt_type_path;
  int64_t seq_length = -1;
  bool pack = false, neat_pack = false;
};

// MindSpeed-LLM's AlpacaStyleInstructionHandler: the chat template, its end token, then the three datasets.
int run_instruction_handler(const InstructionFlags& f, const PreprocessOptions& o, const Tokenizer& t) {
  if (f.neat_pack && !f.pack) return fail(InvalidArgument("--neat-pack requires --pack (as MindSpeed-LLM)"));
  if (!f.prompt_type_path.empty())
    return fail(
        Unimplemented("--prompt-type-path: custom template files are not supported; use a built-in --prompt-type"));
  if (f.prompt_type.empty())
    return fail(InvalidArgument("--prompt-type is required with --handler-name ", f.handler_name,
                                " (one of empty, qwen, llama3, alpaca)"));
  if (f.seq_length < 1)
    return fail(InvalidArgument("--seq-length: expected a positive integer with --handler-name ", f.handler_name,
                                ", found ", f.seq_length));
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&t);
  if (!hf)
    return fail(InvalidArgument("--tokenizer-type: --handler-name ", f.handler_name,
                                " needs HuggingFaceTokenizer (MindSpeed-LLM's PretrainedFromHF), found ", t.type()));
  auto chat_template = find_chat_template(f.prompt_type);
  if (!chat_template.ok()) return fail(chat_template.status());
  InstructionPreprocessOptions io;
  io.input = o.input;
  io.output_prefix = o.output_prefix;
  io.chat_template = *chat_template;
  io.seq_length = f.seq_length;
  io.append_eod = o.append_eod;
  io.log_interval = o.log_interval;
  io.pack = f.pack;
  io.neat_pack = f.neat_pack;
  if (f.handler_name == "SharegptStyleInstructionHandler") {
    SharegptColumns columns;
    if (!f.map_keys.empty()) {
      auto parsed = parse_sharegpt_map_keys(f.map_keys);
      if (!parsed.ok()) return fail(parsed.status());
      columns = *parsed;
    }
    io.convert = [columns](const std::string& line) { return sharegpt_to_conversation(line, columns); };
  } else if (f.handler_name != "AlpacaStylePairwiseHandler") {
    AlpacaColumns columns;
    if (!f.map_keys.empty()) {
      auto parsed = parse_map_keys(f.map_keys);
      if (!parsed.ok()) return fail(parsed.status());
      columns = *parsed;
    }
    io.convert = [columns](const std::string& line) { return alpaca_to_conversation(line, columns); };
  }
  TemplateTokenizer tok;
  tok.encode = [hf](std::string_view text, std::vector<int32_t>* ids) { return hf->encode_plain(text, ids); };
  tok.bos = hf->bos_token_id();
  tok.eos = hf->eod();
  if (!io.chat_template.replace_eos.empty()) {
    tok.eos = hf->token_id(io.chat_template.replace_eos);
    if (tok.eos < 0)
      return fail(InvalidArgument("--prompt-type ", f.prompt_type, ": the tokenizer has no token '",
                                  io.chat_template.replace_eos, "', the template's end token"));
  }
  io.pad = hf->pad_token_id() >= 0 ? hf->pad_token_id() : tok.eos;  // fix_model_tokenizer: no pad -> the EOS
  if (f.handler_name == "AlpacaStylePairwiseHandler") {
    if (f.pack || o.append_eod)
      return fail(InvalidArgument("--handler-name AlpacaStylePairwiseHandler: --pack, --neat-pack and --append-eod "
                                  "are not used by the pairwise handler (found one of them)"));
    PairwisePreprocessOptions po;
    po.input = o.input;
    po.output_prefix = o.output_prefix;
    po.chat_template = io.chat_template;
    po.seq_length = f.seq_length;
    po.log_interval = o.log_interval;
    if (!f.map_keys.empty()) {
      auto parsed = parse_pairwise_map_keys(f.map_keys);
      if (!parsed.ok()) return fail(parsed.status());
      po.columns = *parsed;
    }
    auto pstats = run_pairwise_preprocess(po, tok, stderr);
    if (!pstats.ok()) return fail(pstats.status());
    for (const auto& out : pstats->outputs) std::printf("wrote %s.bin and %s.idx\n", out.c_str(), out.c_str());
    std::printf("%lld records: %lld pairs written, %lld dropped with %lld or more tokens (--seq-length), %lld "
                "without chosen/rejected responses skipped\n",
                static_cast<long long>(pstats->records), static_cast<long long>(pstats->written),
                static_cast<long long>(pstats->dropped), static_cast<long long>(f.seq_length),
                static_cast<long long>(pstats->filtered));
    return 0;
  }
  auto stats = run_instruction_preprocess(io, tok, stderr);
  if (!stats.ok()) return fail(stats.status());
  for (const auto& out : stats->outputs) std::printf("wrote %s.bin and %s.idx\n", out.c_str(), out.c_str());
  std::printf("%lld records: %lld %s written (%lld tokens), %lld dropped with %lld or more tokens "
              "(--seq-length), %lld without a response skipped\n",
              static_cast<long long>(stats->records), static_cast<long long>(stats->written),
              f.pack ? "packs" : "samples", static_cast<long long>(stats->tokens),
              static_cast<long long>(stats->dropped), static_cast<long long>(f.seq_length),
              static_cast<long long>(stats->filtered));
  if (f.neat_pack)
    std::printf("--neat-pack: %lld samples cut to fit %lld tokens\n", static_cast<long long>(stats->cut),
                static_cast<long long>(f.seq_length - 1));
  return 0;
}
}  // namespace

int run_preprocess(int argc, char** argv) {
  ArgParser p("gale preprocess",
              "Tokenize a JSON-lines corpus into Megatron .bin/.idx datasets (tools/preprocess_data.py)");
  PreprocessOptions o;
  TokenizerArgs tok;
  int64_t partitions = 1, workers = -1;
  std::string lang = "english";
  bool keep_sequential = false, split_sentences = false, keep_newlines = false;
  InstructionFlags inst;
  p.group("input data");
  p.add("--input", &o.input, "input .jsonl file (.gz is read too)");
  p.add_list("--json-keys", &o.json_keys, "keys to extract; each gets its own dataset (default: text)", 1);
  p.add_flag("--split-sentences", &split_sentences,
             "split documents into sentences with NLTK's Punkt parameters for --lang (tokenizers/punkt_tab/LANG "
             "in $NLTK_DATA or NLTK's default directories); each sentence is a sequence of PREFIX_KEY_sentence");
  p.add_flag("--keep-newlines", &keep_newlines,
             "with --split-sentences: keep the newlines after a sentence in it (Megatron's CustomLanguageVars)");
  add_tokenizer_args(p, tok);
  p.group("tokenization process");
  p.add_flag("--append-eod", &o.append_eod, "append the tokenizer's end-of-document token to every non-empty document");
  p.add("--lang", &lang, "sentence-splitting language: the NLTK Punkt parameters to use with --split-sentences");
  p.group("instruction data (MindSpeed-LLM)");
  p.add("--handler-name", &inst.handler_name,
        "GeneralPretrainHandler (the default: plain text), AlpacaStyleInstructionHandler (Alpaca records) or "
        "SharegptStyleInstructionHandler (ShareGPT conversations) through a chat template into "
        "PREFIX_packed_{input_ids,attention_mask,labels}_document; AlpacaStylePairwiseHandler (Alpaca preference "
        "records with chosen/rejected, for --stage dpo) into PREFIX_packed_{chosen,rejected}_{input_ids,labels}_document");
  p.add("--prompt-type", &inst.prompt_type, "chat template of the instruction handler: empty, qwen, llama3, alpaca");
  p.add("--prompt-type-path", &inst.prompt_type_path, "custom template file (not supported)");
  p.add("--seq-length", &inst.seq_length, "instruction handler: truncation length; samples this long are dropped");
  p.add("--map-keys", &inst.map_keys,
        "instruction handler: JSON object mapping the handler's columns to the record's keys (Alpaca: "
        "prompt/query/response/system/history; ShareGPT: messages/system/tools and tags {role_tag, content_tag, "
        "user_tag, assistant_tag, ...})");
  p.add_flag("--pack", &inst.pack, "pack instruction samples into sequences of --seq-length (greedy knapsack)");
  p.add_flag("--neat-pack", &inst.neat_pack,
             "with --pack: the attention mask numbers each pack's samples 1, 2, ... (0 on padding) so that training "
             "with --neat-pack --reset-attention-mask keeps attention inside each sample; long samples are cut to "
             "--seq-length - 1 instead of dropped");
  p.group("output data");
  p.add("--output-prefix", &o.output_prefix, "output prefix: writes PREFIX_KEY_document.bin/.idx (PREFIX_KEY_sentence with --split-sentences)");
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
  const bool instruction = !inst.handler_name.empty() && inst.handler_name != "GeneralPretrainHandler";
  if (instruction && inst.handler_name != "AlpacaStyleInstructionHandler" &&
      inst.handler_name != "SharegptStyleInstructionHandler" && inst.handler_name != "AlpacaStylePairwiseHandler")
    return fail(Unimplemented("--handler-name ", inst.handler_name,
                              ": not supported (Gale has GeneralPretrainHandler, AlpacaStyleInstructionHandler, "
                              "SharegptStyleInstructionHandler and AlpacaStylePairwiseHandler)"));
  if (!instruction && (!inst.prompt_type.empty() || inst.seq_length != -1 || !inst.map_keys.empty() || inst.pack))
    return fail(InvalidArgument("--prompt-type, --seq-length, --map-keys and --pack need --handler-name "
                                "AlpacaStyleInstructionHandler"));
  if (instruction && workers == -1) workers = 1;
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
  if (split_sentences && instruction)
    return fail(InvalidArgument("--split-sentences works with the plain-text handler only, not --handler-name ",
                                inst.handler_name));
  if (keep_newlines && !split_sentences)
    std::fprintf(stderr, "WARNING: --keep-newlines has no effect without --split-sentences\n");
  std::optional<PunktSentenceSplitter> splitter;
  if (split_sentences) {
    auto dir = find_punkt_tab(lang);
    if (!dir.ok()) return fail(dir.status());
    auto params = load_punkt_tab(*dir);
    if (!params.ok()) return fail(params.status());
    splitter.emplace(std::move(*params), keep_newlines);
    o.split_sentences = [&splitter](std::string_view text) { return splitter->split(text); };
    std::fprintf(stderr, "splitting sentences with the Punkt parameters in %s%s\n", dir->c_str(),
                 keep_newlines ? " (keeping newlines)" : "");
  }

  auto tokenizer = build_tokenizer(tokenizer_options(tok));
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const Tokenizer& t = **tokenizer;
  o.dtype = optimal_token_dtype(t.vocab_size());
  o.eod = t.eod();
  o.vocab_size = t.vocab_size();
  std::fprintf(stderr, "%s\n", t.describe().c_str());
  if (instruction) return run_instruction_handler(inst, o, t);
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
