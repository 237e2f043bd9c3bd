// Parallel JSON-lines tokenisation into indexed datasets, and dataset merging.
#include "data/preprocess.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <set>

#include "core/log.h"
#include "data/jsonl_reader.h"

namespace gale {

std::string preprocess_output_prefix(const std::string& output_prefix, const std::string& key, bool sentences) {
  return output_prefix + "_" + key + (sentences ? "_sentence" : "_document");
}

namespace {

struct EncodedLine {
  Status status;
  bool blank = false;
  std::vector<std::vector<int32_t>> tokens;   // per key
  std::vector<std::vector<int32_t>> lengths;  // per key
};

// Encodes `text` as one sequence, or sentence by sentence; appends each non-empty sequence's length.
Status encode_text(std::string_view text, const PreprocessOptions& o, const EncodeFn& encode,
                   std::vector<int32_t>* toks, std::vector<int32_t>* lens) {
  auto encode_one = [&](std::string_view piece) -> Status {
    size_t before = toks->size();
    GALE_RETURN_IF_ERROR(encode(piece, toks));
    if (toks->size() > before) lens->push_back(static_cast<int32_t>(toks->size() - before));
    return Status::Ok();
  };
  if (!o.split_sentences) return encode_one(text);
  constexpr size_t kChunkCodePoints = 1000000;  // Megatron splits text[i:i+1000000] (Python code points)
  for (size_t begin = 0; begin < text.size();) {
    size_t end = begin, code_points = 0;
    for (; end < text.size(); ++end) {
      const bool lead = (static_cast<unsigned char>(text[end]) & 0xC0) != 0x80;
      if (lead && code_points++ == kChunkCodePoints) break;
    }
    for (std::string_view sentence : o.split_sentences(text.substr(begin, end - begin)))
      GALE_RETURN_IF_ERROR(encode_one(sentence));
    begin = end;
  }
  return Status::Ok();
}

void encode_line(const std::string& line, const PreprocessOptions& o, const EncodeFn& encode, EncodedLine* out) {
  out->status = Status::Ok();
  out->blank = is_blank_line(line);
  if (out->blank) return;
  thread_local std::vector<std::vector<std::string>> texts;
  out->status = parse_jsonl_texts(line, o.json_keys, &texts);
  if (!out->status.ok()) return;
  out->tokens.resize(o.json_keys.size());
  out->lengths.resize(o.json_keys.size());
  for (size_t k = 0; k < o.json_keys.size(); ++k) {
    auto& toks = out->tokens[k];
    auto& lens = out->lengths[k];
    toks.clear();
    lens.clear();
    for (const std::string& text : texts[k]) {
      out->status = encode_text(text, o, encode, &toks, &lens);
      if (!out->status.ok()) return;
    }
    if (!toks.empty() && o.append_eod) {
      toks.push_back(o.eod);
      ++lens.back();
    }
    for (int32_t id : toks) {
      if (id < 0 || (o.vocab_size > 0 && id >= o.vocab_size)) {
        out->status = InvalidArgument("token id ", id, " (key '", o.json_keys[k], "') is outside the vocabulary [0, ",
                                      o.vocab_size, ")");
        return;
      }
    }
  }
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string parent_dir(const std::string& prefix) {
  size_t slash = prefix.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : prefix.substr(0, slash);
}

void log_progress(std::FILE* log, int64_t docs, double elapsed, int64_t bytes) {
  if (!log) return;
  double dt = elapsed > 0 ? elapsed : 1e-9;
  std::fprintf(log, "Processed %lld documents (%.2f docs/s, %.2f MB/s).\n", static_cast<long long>(docs), docs / dt,
               static_cast<double>(bytes) / dt / 1024 / 1024);
  std::fflush(log);
}

}  // namespace

StatusOr<PreprocessStats> run_preprocess(const PreprocessOptions& o, const EncodeFn& encode, std::FILE* log) {
  if (o.json_keys.empty()) return InvalidArgument("--json-keys: expected at least one key");
  std::set<std::string> unique(o.json_keys.begin(), o.json_keys.end());
  if (unique.size() != o.json_keys.size()) return InvalidArgument("--json-keys: a key is listed twice");
  if (o.workers < 1) return InvalidArgument("--workers: expected a positive integer, found ", o.workers);
  if (o.output_prefix.empty()) return InvalidArgument("--output-prefix is required");
  if (!dir_exists(parent_dir(o.output_prefix)))
    return NotFound("--output-prefix ", o.output_prefix, ": directory ", parent_dir(o.output_prefix),
                    " does not exist");
  GALE_ASSIGN_OR_RETURN(auto reader, JsonlReader::open(o.input));

  PreprocessStats stats;
  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const auto& key : o.json_keys) {
    std::string prefix = preprocess_output_prefix(o.output_prefix, key, static_cast<bool>(o.split_sentences));
    GALE_ASSIGN_OR_RETURN(auto w, IndexedDatasetWriter::create(prefix, o.dtype));
    writers.push_back(std::move(w));
    stats.outputs.push_back(prefix);
  }

  const double start = now_seconds();
  // Batches big enough to keep every worker busy; lines are written back in input order.
  const size_t batch_lines = static_cast<size_t>(o.workers) * 256;
  const size_t batch_bytes = static_cast<size_t>(o.workers) * (4u << 20);
  std::vector<std::string> lines(batch_lines);
  std::vector<int64_t> line_numbers(batch_lines);
  std::vector<EncodedLine> encoded(batch_lines);
  int64_t warned = 0;
  bool done = false;
  while (!done) {
    size_t n = 0, bytes = 0;
    while (n < batch_lines && bytes < batch_bytes) {
      GALE_ASSIGN_OR_RETURN(bool more, reader->next_line(&lines[n]));
      if (!more) {
        done = true;
        break;
      }
      line_numbers[n] = reader->line_number();
      bytes += lines[n].size();
      ++n;
    }
#pragma omp parallel for num_threads(o.workers) schedule(dynamic, 1)
    for (size_t i = 0; i < n; ++i) encode_line(lines[i], o, encode, &encoded[i]);
    for (size_t i = 0; i < n; ++i) {
      EncodedLine& e = encoded[i];
      if (e.status.ok() && e.blank) {
        ++stats.blank_lines;
        continue;
      }
      if (!e.status.ok()) {
        std::string where = str_cat(o.input, ":", line_numbers[i], ": ");
        if (!o.skip_bad_lines)
          return Status(e.status.code(), where + e.status.message() + " (use --skip-bad-lines to skip such lines)");
        ++stats.skipped_lines;
        if (log && warned++ < 10)
          std::fprintf(log, "WARNING: skipping %s%s\n", where.c_str(), e.status.message().c_str());
        continue;
      }
      for (size_t k = 0; k < writers.size(); ++k) {
        GALE_RETURN_IF_ERROR(writers[k]->add_document(e.tokens[k], e.lengths[k]));
        stats.tokens += static_cast<int64_t>(e.tokens[k].size());
      }
      ++stats.documents;
      if (o.log_interval > 0 && stats.documents % o.log_interval == 0)
        log_progress(log, stats.documents, now_seconds() - start, reader->bytes_read());
    }
  }
  for (auto& w : writers) GALE_RETURN_IF_ERROR(w->finalize());
  stats.input_bytes = reader->bytes_read();
  stats.seconds = now_seconds() - start;
  if (log && stats.skipped_lines > 10)
    std::fprintf(log, "WARNING: skipped %lld bad lines in all\n", static_cast<long long>(stats.skipped_lines));
  return stats;
}

StatusOr<std::vector<std::string>> merge_datasets(const std::string& input_dir, const std::string& output_prefix) {
  if (!dir_exists(input_dir)) return NotFound("--input ", input_dir, ": not a directory");
  if (!dir_exists(parent_dir(output_prefix)))
    return NotFound("--output-prefix ", output_prefix, ": directory ", parent_dir(output_prefix), " does not exist");
  DIR* d = ::opendir(input_dir.c_str());
  if (!d) return IOError("--input ", input_dir, ": cannot list the directory");
  std::set<std::string> bins, idxs;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    std::string full = input_dir + "/" + name;
    struct stat st {};
    if (::stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".bin") == 0) bins.insert(name.substr(0, name.size() - 4));
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".idx") == 0) idxs.insert(name.substr(0, name.size() - 4));
  }
  ::closedir(d);
  for (const auto& p : bins)
    if (!idxs.count(p)) return NotFound("--input ", input_dir, ": ", p, ".bin has no ", p, ".idx");
  for (const auto& p : idxs)
    if (!bins.count(p)) return NotFound("--input ", input_dir, ": ", p, ".idx has no ", p, ".bin");
  if (bins.empty()) return NotFound("--input ", input_dir, ": no .bin/.idx pairs to merge");
  std::vector<std::string> prefixes(bins.begin(), bins.end());  // std::set: sorted bytewise, as Python's sorted()
  std::string out_name =
      output_prefix.substr(output_prefix.rfind('/') == std::string::npos ? 0 : output_prefix.rfind('/') + 1);
  if (parent_dir(output_prefix) == input_dir && bins.count(out_name))
    return InvalidArgument("--output-prefix ", output_prefix, " is one of the inputs");
  GALE_ASSIGN_OR_RETURN(auto first, IndexedDataset::open(input_dir + "/" + prefixes[0]));
  GALE_ASSIGN_OR_RETURN(auto writer, IndexedDatasetWriter::create(output_prefix, first->dtype()));
  for (const auto& p : prefixes) GALE_RETURN_IF_ERROR(writer->add_index(input_dir + "/" + p));
  GALE_RETURN_IF_ERROR(writer->finalize());
  for (auto& p : prefixes) p = input_dir + "/" + p;
  return prefixes;
}

}  // namespace gale
