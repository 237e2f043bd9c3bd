// `gale evaluate`: MMLU-style, BoolQ and HellaSwag accuracy and perplexity of a checkpoint.
#include "train/evaluate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <filesystem>

#include "data/jsonl_reader.h"
#include "train/evaluate_choice_tasks.h"
#include "train/evaluate_tasks.h"

namespace gale {

namespace {

struct EvaluateArgs {
  std::string task;
  std::string data_path;
  int64_t shots = 5;
  int64_t limit = 0;  // 0: every question / document
  std::vector<std::string> json_keys = {"text"};
};

int usage(const Status& s) {
  std::fprintf(stderr, "gale evaluate: error: %s\n", s.message().c_str());
  return 2;
}

int failure(const Status& s) {
  std::fprintf(stderr, "gale evaluate: error: %s\n", s.message().c_str());
  return 1;
}

Status run_mmlu(const InferenceModel& m, const EvaluateArgs& e) {
  GALE_ASSIGN_OR_RETURN(std::vector<McSubject> subjects, read_mc_subjects(e.data_path, e.shots));
  const Tokenizer& tok = *m.tokenizer;
  std::printf("%-40s %9s %9s\n", "subject", "questions", "accuracy");
  int64_t total = 0, correct_total = 0, truncated = 0;
  for (const McSubject& s : subjects) {
    int64_t n = 0, correct = 0;
    for (const McQuestion& q : s.test) {
      if (e.limit > 0 && n >= e.limit) break;
      std::vector<int32_t> context;
      GALE_RETURN_IF_ERROR(tok.encode(mc_prompt(s, e.shots, q), &context));
      std::vector<std::vector<int32_t>> continuations(q.choices.size());
      size_t longest = 0;
      for (size_t c = 0; c < q.choices.size(); ++c) {
        GALE_RETURN_IF_ERROR(tok.encode(choice_continuation(static_cast<int>(c)), &continuations[c]));
        longest = std::max(longest, continuations[c].size());
      }
      if (static_cast<int64_t>(context.size() + longest) > m.config.max_positions) ++truncated;
      GALE_ASSIGN_OR_RETURN(std::vector<double> scores,
                            continuation_log_likelihoods(m, m.config.max_positions, context, continuations));
      correct += argmax_choice(scores) == q.answer;
      ++n;
    }
    std::printf("%-40s %9lld %9.4f\n", s.name.c_str(), static_cast<long long>(n),
                n > 0 ? static_cast<double>(correct) / static_cast<double>(n) : 0.0);
    total += n;
    correct_total += correct;
  }
  std::printf("%-40s %9lld %9.4f\n", "total", static_cast<long long>(total),
              total > 0 ? static_cast<double>(correct_total) / static_cast<double>(total) : 0.0);
  if (truncated > 0)
    std::fprintf(stderr, "gale evaluate: note: %lld prompt(s) longer than --max-position-embeddings %lld were cut from the left\n",
                 static_cast<long long>(truncated), static_cast<long long>(m.config.max_positions));
  return Status::Ok();
}

// The jsonl files of --task-data-path: the file itself, or every *.jsonl / *.jsonl.gz in the directory.
StatusOr<std::vector<std::string>> jsonl_files(const std::string& path) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(path)) {
    if (!fs::exists(path)) return InvalidArgument("--task-data-path ", path, ": no such file or directory");
    return std::vector<std::string>{path};
  }
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && (name.ends_with(".jsonl") || name.ends_with(".jsonl.gz")))
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) return InvalidArgument("--task-data-path ", path, ": no .jsonl file in the directory");
  return files;
}

// --task boolq / hellaswag: accuracy (and hellaswag's acc_norm) per file and in total.
Status run_choice_task(const InferenceModel& m, const EvaluateArgs& e) {
  GALE_ASSIGN_OR_RETURN(std::vector<std::string> files, jsonl_files(e.data_path));
  const bool norm = e.task == "hellaswag";
  std::printf("%-40s %9s %9s%s\n", "file", "questions", "accuracy", norm ? "  acc_norm" : "");
  int64_t total = 0, correct_total = 0, norm_total = 0;
  for (const std::string& file : files) {
    GALE_ASSIGN_OR_RETURN(std::unique_ptr<JsonlReader> reader, JsonlReader::open(file));
    int64_t n = 0, correct = 0, correct_norm = 0;
    std::string line;
    while (e.limit <= 0 || n < e.limit) {
      GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&line));
      if (!more) break;
      if (is_blank_line(line)) continue;
      StatusOr<ChoiceItem> item = parse_choice_item(e.task, line);
      if (!item.ok()) return InvalidArgument(file, ":", reader->line_number(), ": ", item.status().message());
      std::vector<int32_t> context;
      GALE_RETURN_IF_ERROR(m.tokenizer->encode(item->context, &context));
      std::vector<std::vector<int32_t>> continuations(item->continuations.size());
      for (size_t c = 0; c < continuations.size(); ++c)
        GALE_RETURN_IF_ERROR(m.tokenizer->encode(item->continuations[c], &continuations[c]));
      if (context.empty()) context.push_back(m.tokenizer->eod());
      StatusOr<std::vector<double>> scores =
          continuation_log_likelihoods(m, m.config.max_positions, context, continuations);
      if (!scores.ok()) return InvalidArgument(file, ":", reader->line_number(), ": ", scores.status().message());
      correct += argmax_choice(*scores) == item->answer;
      correct_norm += argmax_per_character(*scores, item->continuations) == item->answer;
      ++n;
    }
    const std::string name = std::filesystem::path(file).filename().string();
    const double d = std::max<double>(static_cast<double>(n), 1.0);
    if (norm)
      std::printf("%-40s %9lld %9.4f %9.4f\n", name.c_str(), static_cast<long long>(n), correct / d, correct_norm / d);
    else
      std::printf("%-40s %9lld %9.4f\n", name.c_str(), static_cast<long long>(n), correct / d);
    total += n;
    correct_total += correct;
    norm_total += correct_norm;
  }
  const double d = std::max<double>(static_cast<double>(total), 1.0);
  if (norm)
    std::printf("%-40s %9lld %9.4f %9.4f\n", "total", static_cast<long long>(total), correct_total / d, norm_total / d);
  else
    std::printf("%-40s %9lld %9.4f\n", "total", static_cast<long long>(total), correct_total / d);
  return Status::Ok();
}

Status run_ppl(const InferenceModel& m, const EvaluateArgs& e) {
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<JsonlReader> reader, JsonlReader::open(e.data_path));
  const int64_t window = std::min(m.config.seq_length > 0 ? m.config.seq_length : m.config.max_positions,
                                  m.config.max_positions - 1);
  std::string line;
  double nll = 0.0;
  int64_t tokens = 0, documents = 0;
  while (e.limit <= 0 || documents < e.limit) {
    GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&line));
    if (!more) break;
    if (is_blank_line(line)) continue;
    std::vector<std::vector<std::string>> texts;
    Status st = parse_jsonl_texts(line, e.json_keys, &texts);
    if (!st.ok()) return InvalidArgument(e.data_path, ":", reader->line_number(), ": ", st.message());
    for (const auto& key_texts : texts) {
      for (const std::string& text : key_texts) {
        std::vector<int32_t> ids = {m.tokenizer->eod()};
        GALE_RETURN_IF_ERROR(m.tokenizer->encode(text, &ids));
        nll += sequence_negative_log_likelihood(m, ids, window, &tokens);
      }
    }
    ++documents;
  }
  if (tokens == 0) return InvalidArgument(e.data_path, ": no text to score");
  const double mean = nll / static_cast<double>(tokens);
  std::printf("documents: %lld | tokens: %lld | lm loss: %.6E | lm loss PPL: %.6E\n", static_cast<long long>(documents),
              static_cast<long long>(tokens), mean, std::exp(mean));
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<double>> continuation_log_likelihoods(const InferenceModel& m, int64_t max_tokens,
                                                           std::span<const int32_t> context,
                                                           const std::vector<std::vector<int32_t>>& continuations) {
  const int64_t vocab = m.tokenizer->vocab_size();
  std::vector<double> scores;
  bool single = true;
  for (const auto& c : continuations) {
    if (c.empty()) return InvalidArgument("a continuation that encodes to no token");
    if (static_cast<int64_t>(c.size()) >= max_tokens) return InvalidArgument("a continuation of ", c.size(), " tokens does not fit in ", max_tokens);
    single = single && c.size() == 1;
  }
  if (context.empty()) return InvalidArgument("an empty context");
  if (single) {  // one pass: the last context position predicts every one-token continuation
    const size_t keep = std::min<size_t>(context.size(), static_cast<size_t>(max_tokens));
    const Tensor logits = m.logits(context.subspan(context.size() - keep));
    const float* last = logits.data<float>() + static_cast<int64_t>(keep - 1) * m.config.vocab;
    for (const auto& c : continuations) scores.push_back(token_log_prob(last, vocab, c[0]));
    return scores;
  }
  for (const auto& c : continuations) {
    const size_t keep = std::min<size_t>(context.size(), static_cast<size_t>(max_tokens) - c.size());
    std::vector<int32_t> ids(context.end() - static_cast<std::ptrdiff_t>(keep), context.end());
    ids.insert(ids.end(), c.begin(), c.end());
    const Tensor logits = m.logits(ids);
    double sum = 0.0;
    for (size_t j = 0; j < c.size(); ++j)
      sum += token_log_prob(logits.data<float>() + static_cast<int64_t>(keep - 1 + j) * m.config.vocab, vocab, c[j]);
    scores.push_back(sum);
  }
  return scores;
}

double sequence_negative_log_likelihood(const InferenceModel& m, std::span<const int32_t> ids, int64_t window,
                                        int64_t* tokens) {
  const int64_t vocab = m.tokenizer->vocab_size(), n = static_cast<int64_t>(ids.size());
  double nll = 0.0;
  for (int64_t start = 0; start + 1 < n; start += window) {
    const int64_t len = std::min(window + 1, n - start);
    const Tensor logits = m.logits(ids.subspan(static_cast<size_t>(start), static_cast<size_t>(len)));
    for (int64_t s = 0; s + 1 < len; ++s)
      nll -= token_log_prob(logits.data<float>() + s * m.config.vocab, vocab, ids[static_cast<size_t>(start + s + 1)]);
    *tokens += len - 1;
  }
  return nll;
}

int evaluate_main(int argc, char** argv) {
  ArgParser parser("gale evaluate",
                   "Evaluate a checkpoint saved by `gale pretrain` (one process): MMLU-style multiple choice "
                   "(--task mmlu), BoolQ (--task boolq), HellaSwag (--task hellaswag) or the perplexity of a jsonl corpus "
                   "(--task ppl).");
  Arguments args;
  add_inference_model_args(parser, args);
  EvaluateArgs e;
  int64_t seed = 1234;
  parser.group("evaluation");
  parser.add("--task", &e.task,
             "mmlu, boolq or hellaswag (multiple choice by log-likelihood) or ppl (perplexity of a jsonl corpus)");
  parser.add("--task-data-path", &e.data_path,
             "mmlu: a directory holding <subject>_test.csv (and <subject>_dev.csv for --shots); boolq, hellaswag: a "
             ".jsonl(.gz) file or a directory of them; ppl: a .jsonl(.gz) file");
  parser.add("--shots", &e.shots, "mmlu: examples from <subject>_dev.csv before each question");
  parser.add("--limit", &e.limit, "at most this many questions per subject or file, or documents (ppl); 0: all");
  parser.add_list("--json-keys", &e.json_keys, "ppl: the keys of each jsonl record whose text is scored", 1);
  parser.add("--seed", &seed, "model seed (nothing is random in evaluation)");
  Status st = parser.parse(argc, argv);
  if (!st.ok()) return usage(st);
  if (parser.help_requested()) {
    std::printf("%s", parser.help_text().c_str());
    return 0;
  }
  if (e.task != "mmlu" && e.task != "ppl" && e.task != "boolq" && e.task != "hellaswag")
    return usage(InvalidArgument("--task: expected mmlu, boolq, hellaswag or ppl, found \"", e.task, "\""));
  if (e.data_path.empty()) return usage(InvalidArgument("--task-data-path is required"));
  if (e.shots < 0) return usage(InvalidArgument("--shots: expected a non-negative integer, found ", e.shots));
  if (e.limit < 0) return usage(InvalidArgument("--limit: expected a non-negative integer, found ", e.limit));
  st = validate_inference_model_args(args, parser);
  if (!st.ok()) return usage(st);

  StatusOr<std::unique_ptr<InferenceModel>> loaded = load_inference_model(args, seed);
  if (!loaded.ok()) return failure(loaded.status());
  if (e.task == "mmlu") st = run_mmlu(*loaded.value(), e);
  else if (e.task == "ppl") st = run_ppl(*loaded.value(), e);
  else st = run_choice_task(*loaded.value(), e);
  if (!st.ok()) return failure(st);
  return 0;
}

}  // namespace gale
