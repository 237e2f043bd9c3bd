// Tokenizer and dataset construction for pretraining (Megatron's BlendedMegatronDatasetBuilder).
#include "train/data_setup.h"

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/log.h"
#include "data/blending.h"
#include "data/fim_dataset.h"
#include "data/gpt_dataset.h"
#include "data/instruction_dataset.h"
#include "data/numpy_math.h"
#include "data/pad_token.h"
#include "data/pairwise_dataset.h"
#include "data/sequences_per_dataset.h"
#include "data/split.h"
#include "train/data_paths.h"
#include "train/sft_data_setup.h"
#include "tokenizer/hf_tokenizer.h"
#include "train/model_setup.h"
#include "train/phase_transitions.h"

namespace gale {

namespace {

struct Builder {
  const Arguments& args;
  GptIndexParams params;
  std::string cache_dir;
  std::string split_text;
  std::map<std::string, std::shared_ptr<TokenSource>> sources;
  // --fim-data: the tokenizer, options and each split's loader counter that wrap every GPTDataset.
  std::shared_ptr<const HuggingFaceTokenizer> fim_tokenizer;
  FimOptions fim;
  std::shared_ptr<FimLoader> fim_loaders[3];
  // --per-dataset-sequences-path (when it lists any prefix) and the vocabulary size it implies the
  // token dtype from.
  std::optional<SequencesPerDataset> sequences_per_dataset;
  int64_t vocab_size = 0;

  StatusOr<std::shared_ptr<TokenSource>> source(const std::string& prefix) {
    auto it = sources.find(prefix);
    if (it != sources.end()) return it->second;
    GALE_ASSIGN_OR_RETURN(auto ds, IndexedDataset::open(prefix, args.data.mmap_bin_files));
    if (sequences_per_dataset) GALE_RETURN_IF_ERROR(check_declared_index(*sequences_per_dataset, *ds, vocab_size));
    std::shared_ptr<TokenSource> s = make_indexed_source(std::move(ds));
    sources[prefix] = s;
    return s;
  }

  // One GPTDataset over sequences [begin, end) of `src`, or null when the range is empty and
  // no samples are wanted.
  StatusOr<std::unique_ptr<TokenDataset>> gpt(std::shared_ptr<TokenSource> src, DataSplit split, int64_t begin,
                                              int64_t end, int64_t num_samples) {
    if (begin >= end) {
      if (num_samples == 0) return std::unique_ptr<TokenDataset>();
      return FailedPrecondition(
          src->name(), ": the ", split_name(split), " split is empty (sequences [", begin, ", ", end, ") of ",
          src->num_sequences(), " with --split '", split_text, "') but ", num_samples,
          " samples are needed; Megatron would loop forever here. Change --split, or use more data");
    }
    GptIndexParams p = params;
    p.num_samples = num_samples;
    GptCacheMode mode;  // --dataloader-fast-cache-load, --dataloader-defer-npy-index-mmap
    mode.fast_cache_load = args.data.dataloader_fast_cache_load;
    mode.defer_npy_index_mmap = args.data.dataloader_defer_npy_index_mmap;
    GALE_ASSIGN_OR_RETURN(auto ds, GptDataset::build(src, split, begin, end, p, cache_dir, split_text, mode));
    if (fim_tokenizer)
      return std::unique_ptr<TokenDataset>(std::make_unique<FimDataset>(
          std::move(ds), fim, fim_tokenizer, p.seed, fim_loaders[static_cast<int>(split)]));
    return std::unique_ptr<TokenDataset>(std::move(ds));
  }
};

// A blend for one split over `prefixes` restricted to `bookends` of each.
StatusOr<std::unique_ptr<TokenDataset>> build_blend(Builder& b, const Blend& blend, DataSplit split,
                                                    std::pair<double, double> bookends, int64_t size) {
  const size_t n = blend.prefixes.size();
  auto range_of = [&](const std::shared_ptr<TokenSource>& s) { return split_range(bookends, s->num_sequences()); };
  std::vector<std::unique_ptr<TokenDataset>> parts;
  if (blend.weights) {
    std::vector<double> w = numpy_normalize(*blend.weights);
    std::vector<int64_t> target = samples_per_dataset(w, size, 0.0);
    const double surplus = b.args.data.mid_level_dataset_surplus;
    std::vector<int64_t> buffer = samples_per_dataset(w, size, surplus);
    int64_t total = 0;
    for (size_t i = 0; i < n; ++i) {
      GALE_ASSIGN_OR_RETURN(auto src, b.source(blend.prefixes[i]));
      auto [begin, end] = range_of(src);
      GALE_ASSIGN_OR_RETURN(auto ds, b.gpt(src, split, begin, end, buffer[i]));
      if (!ds) return std::unique_ptr<TokenDataset>();  // every part empty and unneeded (size 0)
      parts.push_back(std::move(ds));
      total += target[i];
    }
    auto bl = BlendedDataset::build(std::move(parts), w, total);
    if (!bl.ok() && bl.status().code() == StatusCode::kFailedPrecondition)  // Megatron's IndexError
      return FailedPrecondition("the ", split_name(split), " ", bl.status().message(),
                                ": its datasets were built with --mid-level-dataset-surplus ", surplus,
                                "; increase it (e.g. two- or ten-fold) for a sufficient sample margin");
    GALE_RETURN_IF_ERROR(bl.status());
    return std::unique_ptr<TokenDataset>(std::move(*bl));
  }
  std::vector<double> lengths;
  int64_t sum = 0;
  for (size_t i = 0; i < n; ++i) {
    GALE_ASSIGN_OR_RETURN(auto src, b.source(blend.prefixes[i]));
    auto [begin, end] = range_of(src);
    GALE_ASSIGN_OR_RETURN(auto ds, b.gpt(src, split, begin, end, begin < end ? -1 : 0));
    if (!ds) {
      if (size > 0)
        return FailedPrecondition(blend.prefixes[i], ": the ", split_name(split), " split of this dataset is empty");
      return std::unique_ptr<TokenDataset>();
    }
    lengths.push_back(static_cast<double>(ds->size()));
    sum += ds->size();
    parts.push_back(std::move(ds));
  }
  GALE_ASSIGN_OR_RETURN(auto bl, BlendedDataset::build(std::move(parts), lengths, std::min(size, sum)));
  return std::unique_ptr<TokenDataset>(std::move(bl));
}

// --fim-data: a tokenizer of the FIM datasets' own (the run's one is handed out separately), the
// token ids of the --fim-*-token flags, and one loader counter per split.
Status setup_fim(const Arguments& args, Builder* b) {
  const DataArgs& d = args.data;
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> t, build_pretrain_tokenizer(args));
  auto* hf = dynamic_cast<HuggingFaceTokenizer*>(t.get());
  if (!hf) return Unimplemented("--fim-data: not supported yet with ", t->type(), " (needs a HuggingFaceTokenizer)");
  t.release();
  b->fim_tokenizer = std::shared_ptr<const HuggingFaceTokenizer>(hf);
  FimTokenNames names{d.fim_prefix_token, d.fim_middle_token, d.fim_suffix_token, d.fim_pad_token, d.fim_eod_token,
                      std::nullopt};
  if (d.has_fim_split_sample) names.split_sample = d.fim_split_sample;
  GALE_RETURN_IF_ERROR(resolve_fim_tokens(*b->fim_tokenizer, names, &b->fim));
  b->fim.rate = d.fim_rate;
  b->fim.spm_rate = d.fim_spm_rate;
  b->fim.fragment_rate = d.fim_fragment_rate;
  if (d.has_fim_no_prefix) b->fim.no_prefix = d.fim_no_prefix;
  for (auto& loader : b->fim_loaders) {
    loader = std::make_shared<FimLoader>();
    loader->micro_batch_size = args.training.micro_batch_size;
    loader->num_workers = d.num_workers;
  }
  return Status::Ok();
}

// The sequence options shared by instruction and pairwise data: MindSpeed-LLM pads with the
// tokenizer's pad token, or its EOS when it has none.
InstructionSampleOptions instruction_sample_options(const Arguments& args, const PretrainData& out) {
  InstructionSampleOptions o;
  o.seq_length = args.model.seq_length;
  o.vocab_size = out.vocab_size;
  o.pad = out.eod;
  o.eos = out.eod;
  if (const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(out.tokenizer.get()); hf && hf->pad_token_id() >= 0)
    o.pad = hf->pad_token_id();
  else if (out.tokenizer->pad() >= 0)
    o.pad = out.tokenizer->pad();
  return o;
}

// One dataset per non-empty split of documents [bounds[i], bounds[i + 1]), drawn in
// instruction_sample_order and built by `make` from that order; logs each split as
// "> <kind> train: documents [a, b) of N in PREFIX (n <unit> needed)".
void build_document_splits(const Arguments& args, const SplitSampleCounts& counts, const std::array<int64_t, 4>& bounds,
                           const char* kind, const char* unit, int64_t num_documents, const std::string& prefix,
                           PretrainData* out, const std::function<void(const std::string&)>& log,
                           const std::function<std::unique_ptr<SampleDataset>(std::vector<int64_t>)>& make) {
  const int64_t sizes[3] = {counts.train, counts.valid, counts.test};
  const char* names[3] = {"train", "valid", "test"};
  std::unique_ptr<SampleDataset>* splits[3] = {&out->train, &out->valid, &out->test};
  for (int i = 0; i < 3; ++i) {
    log(str_cat("> ", kind, " ", names[i], ": documents [", bounds[i], ", ", bounds[i + 1], ") of ", num_documents,
                " in ", prefix, " (", sizes[i], " ", unit, " needed)"));
    if (bounds[i + 1] <= bounds[i]) continue;
    *splits[i] = make(instruction_sample_order(bounds[i], bounds[i + 1], sizes[i],
                                               static_cast<uint32_t>(args.training.seed), true));
  }
}

// MindSpeed-LLM's instruction data (data/instruction_dataset.h): one prefix, the legacy split,
// one DecoderPackedMTFDataset per non-empty split.
Status build_instruction_data(const Arguments& args, const SplitSampleCounts& counts, PretrainData* out,
                              const std::function<void(const std::string&)>& log) {
  const DataArgs& d = args.data;
  if (d.mock_data || !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty() ||
      !d.data_args_path.empty() || !d.per_split_data_args_path.empty() || d.data_path.size() != 1)
    return InvalidArgument("--is-instruction-dataset: expected one --data-path PREFIX (MindSpeed-LLM supports a single "
                           "instruction dataset), found ",
                           d.data_path.size(), " --data-path entries");
  if (d.eod_mask_loss)
    return Unimplemented("--is-instruction-dataset with --eod-mask-loss: not supported (MindSpeed-LLM masks by the "
                         "labels of instruction samples)");
  if (d.neat_pack && !d.reset_attention_mask)
    return InvalidArgument("--neat-pack requires --reset-attention-mask (as MindSpeed-LLM)");
  if (d.fix_sub_seq_length > 0)
    return Unimplemented("--fix-sub-seq-length with --is-instruction-dataset: not supported (MindSpeed applies it to "
                         "pretraining samples only)");
  if (d.reset_position_ids && !d.reset_attention_mask)
    return InvalidArgument("--reset-position-ids with --is-instruction-dataset requires --reset-attention-mask "
                           "(MindSpeed-LLM resets the positions of packed samples only there)");
  GALE_ASSIGN_OR_RETURN(auto sources, InstructionSources::open(d.data_path[0], d.mmap_bin_files));
  GALE_ASSIGN_OR_RETURN(auto bounds, legacy_split_bounds(d.split, sources->num_documents()));
  InstructionSampleOptions o = instruction_sample_options(args, *out);
  o.reset_attention_mask = d.reset_attention_mask;
  o.reset_position_ids = d.reset_position_ids;
  o.neat_pack = d.neat_pack;
  build_document_splits(args, counts, bounds, "instruction", "samples", sources->num_documents(), sources->prefix, out,
                        log, [&](std::vector<int64_t> order) { return make_instruction_dataset(sources, std::move(order), o); });
  if (!out->train && counts.train > 0)
    return FailedPrecondition("--is-instruction-dataset: the train split is empty (--split '", d.split, "' of ",
                              sources->num_documents(), " documents)");
  return Status::Ok();
}

// MindSpeed-LLM's pairwise data (--stage dpo --is-pairwise-dataset, data/pairwise_dataset.h): one
// prefix, the legacy split, one dataset of pairs per non-empty split.
Status build_pairwise_data(const Arguments& args, const SplitSampleCounts& counts, PretrainData* out,
                           const std::function<void(const std::string&)>& log) {
  const DataArgs& d = args.data;
  if (d.mock_data || !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty() ||
      !d.data_args_path.empty() || !d.per_split_data_args_path.empty() || d.data_path.size() != 1)
    return InvalidArgument("--is-pairwise-dataset: expected one --data-path PREFIX, found ", d.data_path.size(),
                           " --data-path entries");
  if (d.eod_mask_loss || d.reset_attention_mask || d.reset_position_ids || d.neat_pack)
    return Unimplemented("--is-pairwise-dataset with --eod-mask-loss, --reset-attention-mask, --reset-position-ids "
                         "or --neat-pack: not supported yet (one chosen or rejected sequence per sample)");
  GALE_ASSIGN_OR_RETURN(auto sources, PairwiseSources::open(d.data_path[0], d.mmap_bin_files));
  GALE_ASSIGN_OR_RETURN(auto bounds, legacy_split_bounds(d.split, sources->num_documents()));
  const InstructionSampleOptions o = instruction_sample_options(args, *out);
  build_document_splits(args, counts, bounds, "pairwise", "pairs", sources->num_documents(), sources->prefix, out, log,
                        [&](std::vector<int64_t> order) {
                          return std::make_unique<PairwiseDataset>(sources, std::move(order), o);
                        });
  if (!out->train && counts.train > 0)
    return FailedPrecondition("--is-pairwise-dataset: the train split is empty (--split '", d.split, "' of ",
                              sources->num_documents(), " documents)");
  return Status::Ok();
}

// Megatron-LM main's GPTDataset pad (data/pad_token.h): the tokenizer's pad (a HuggingFaceTokenizer's
// pad_token from tokenizer_config.json) unless it equals the eod; the collision is logged as Megatron
// warns about it.
int32_t gpt_dataset_pad(const Tokenizer& tokenizer, bool allow_ambiguous, const std::function<void(const std::string&)>& log) {
  int32_t pad = tokenizer.pad();
  if (const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer)) pad = hf->pad_token_id();
  const int32_t specials[] = {tokenizer.eod()};
  PadTokenChoice c = choose_pad_token(pad, specials, allow_ambiguous);
  if (!c.warning.empty()) log("WARNING: " + c.warning);
  return c.pad;
}

}  // namespace

SplitSampleCounts pretrain_sample_counts(const Arguments& a) {
  const TrainingArgs& t = a.training;
  const LoggingArgs& l = a.logging;
  int64_t gbs = t.global_batch_size;
  SplitSampleCounts c;
  int64_t train_iters = t.train_iters;
  if (t.train_samples != kUnset) {
    c.train = t.train_samples;
    // Megatron's update_train_iters (with --rampup-batch-size: the ramp-up's iterations and the rest).
    train_iters = !t.rampup_batch_size.empty() ? train_iters_from_args(a) : gbs > 0 ? t.train_samples / gbs : 0;
  } else {
    c.train = t.train_iters * gbs;
  }
  // --phase-transition-iterations: the training dataset of the phase the run resumes in (Megatron's
  // train_samples_in_current_phase); validation and test as without phases.
  if (!a.data.phase_transitions.empty() && gbs > 0)
    c.train = phase_at(a.data.phase_transitions, a.data.phase_resume_iteration, gbs, t.train_samples).samples();
  c.valid = (train_iters / l.eval_interval + 1) * l.eval_iters * gbs;
  c.test = l.eval_iters * gbs;
  return c;
}

TokenizerOptions tokenizer_options(const TokenizerArgs& t) {
  return TokenizerOptions{t.tokenizer_type,        t.vocab_file,         t.merge_file,
                          t.tokenizer_model,       t.vocab_size,         t.vocab_extra_ids,
                          t.tiktoken_pattern,      t.tiktoken_num_special_tokens, t.tiktoken_special_tokens};
}

StatusOr<std::unique_ptr<Tokenizer>> build_pretrain_tokenizer(const Arguments& args) {
  const TokenizerArgs& t = args.tokenizer;
  TokenizerOptions o = tokenizer_options(t);
  bool no_files = t.vocab_file.empty() && t.merge_file.empty() && t.tokenizer_model.empty();
  if (o.type.empty() && args.data.mock_data && no_files) {
    if (t.vocab_size == kUnset)
      return InvalidArgument(
          "--mock-data without tokenizer flags uses NullTokenizer, which needs --vocab-size "
          "(or give --tokenizer-type and its files)");
    o.type = "NullTokenizer";
  }
  return build_tokenizer(o);
}

StatusOr<PretrainData> build_pretrain_data(const Arguments& args) {
  return build_pretrain_data(args, [](const std::string& line) { print_rank0(line); });
}

StatusOr<PretrainData> build_pretrain_data(const Arguments& args, const std::function<void(const std::string&)>& log) {
  PretrainData out;
  GALE_ASSIGN_OR_RETURN(out.tokenizer, build_pretrain_tokenizer(args));
  out.vocab_size = out.tokenizer->vocab_size();
  out.eod = out.tokenizer->eod();
  log("> tokenizer: " + out.tokenizer->describe());

  const DataArgs& d = args.data;
  if (args.model.seq_length <= 1)
    return InvalidArgument("--seq-length: expected at least 2, found ", args.model.seq_length);
  if (args.training.seed < 0 || args.training.seed > 0xFFFFFFFFll)
    return InvalidArgument("--seed: expected an integer in [0, 2^32-1] (the data shuffles use numpy's RandomState)");
  if (args.dpo.is_pairwise_dataset) {
    GALE_RETURN_IF_ERROR(build_pairwise_data(args, pretrain_sample_counts(args), &out, log));
    return out;
  }
  if (d.is_instruction_dataset) {
    GALE_RETURN_IF_ERROR(build_instruction_data(args, pretrain_sample_counts(args), &out, log));
    return out;
  }
  if (d.sft) {
    GALE_RETURN_IF_ERROR(build_sft_data(args, pretrain_sample_counts(args), &out, log));
    return out;
  }
  if (d.neat_pack) return InvalidArgument("--neat-pack: only with --is-instruction-dataset (a neat-packed dataset)");
  Builder b{args, {}, d.data_cache_path, d.split, {}};
  b.params.seq_length = args.model.seq_length;
  b.params.seed = static_cast<uint32_t>(args.training.seed);
  if (d.fim_data) GALE_RETURN_IF_ERROR(setup_fim(args, &b));
  b.vocab_size = out.vocab_size;
  if (!d.per_dataset_sequences_path.empty()) {
    GALE_ASSIGN_OR_RETURN(SequencesPerDataset file, load_sequences_per_dataset(d.per_dataset_sequences_path));
    if (!file.counts.empty()) b.sequences_per_dataset = std::move(file);  // an empty object: Megatron reads the .idx
  }
  SplitSampleCounts counts = pretrain_sample_counts(args);
  const int64_t sizes[3] = {counts.train, counts.valid, counts.test};
  std::unique_ptr<TokenDataset> splits[3];

  if (d.mock_data) {
    // Megatron: no blend -> mock, split forced to "1,1,1", one MockGPTDataset per split.
    if (out.vocab_size < kMockMaxLength)
      return InvalidArgument("--mock-data documents hold token ids up to ", kMockMaxLength - 2,
                             " (Megatron's mock documents are [1, ..., len-1, EOD]); the vocabulary has ",
                             out.vocab_size, ": use --vocab-size ", kMockMaxLength - 1, " or more");
    b.split_text = "1,1,1";
    b.cache_dir.clear();
    GALE_ASSIGN_OR_RETURN(SplitMatrix m, parse_split(b.split_text));
    std::shared_ptr<TokenSource> src = make_mock_source(out.eod);
    for (DataSplit s : kAllSplits) {
      int i = static_cast<int>(s);
      auto [begin, end] = split_range(*m[i], src->num_sequences());
      GALE_ASSIGN_OR_RETURN(splits[i], b.gpt(src, s, begin, end, sizes[i]));
    }
  } else if (!d.data_path.empty() || !d.data_args_path.empty()) {
    GALE_ASSIGN_OR_RETURN(DataPathList list, data_path_list(d));
    GALE_ASSIGN_OR_RETURN(Blend blend, parse_blend(list.entries, list.flag));
    std::string split_text = d.split.empty() ? "969, 30, 1" : d.split;
    b.split_text = split_text;
    GALE_ASSIGN_OR_RETURN(SplitMatrix m, parse_split(split_text));
    for (DataSplit s : kAllSplits) {
      int i = static_cast<int>(s);
      if (!m[i]) continue;  // the split gets no data at all (e.g. test of "99,1,0")
      if (blend.prefixes.size() == 1 && !blend.weights) {
        GALE_ASSIGN_OR_RETURN(auto src, b.source(blend.prefixes[0]));
        auto [begin, end] = split_range(*m[i], src->num_sequences());
        GALE_ASSIGN_OR_RETURN(splits[i], b.gpt(src, s, begin, end, sizes[i]));
      } else {
        GALE_ASSIGN_OR_RETURN(splits[i], build_blend(b, blend, s, *m[i], sizes[i]));
      }
    }
  } else {
    // One blend per split, each using the whole of its datasets.
    GALE_ASSIGN_OR_RETURN(auto lists, per_split_data_path_lists(d));
    std::vector<std::string> per[3] = {lists[0].entries, lists[1].entries, lists[2].entries};
    const char* flags[3] = {lists[0].flag, lists[1].flag, lists[2].flag};
    b.split_text = "";
    for (DataSplit s : kAllSplits) {
      int i = static_cast<int>(s);
      if (per[i].empty()) continue;
      GALE_ASSIGN_OR_RETURN(Blend blend, parse_blend(per[i], flags[i]));
      if (blend.prefixes.size() == 1) {
        GALE_ASSIGN_OR_RETURN(auto src, b.source(blend.prefixes[0]));
        GALE_ASSIGN_OR_RETURN(splits[i], b.gpt(src, s, 0, src->num_sequences(), sizes[i]));
      } else {
        GALE_ASSIGN_OR_RETURN(splits[i], build_blend(b, blend, s, {0.0, 1.0}, sizes[i]));
      }
    }
  }

  if (!splits[0] && sizes[0] > 0)
    return FailedPrecondition("the train split has no data (check --split '", b.split_text, "' or --train-data-path)");
  SampleOptions so;
  so.eod = out.eod;
  so.pad = gpt_dataset_pad(*out.tokenizer, d.allow_ambiguous_pad_tokens, log);
  so.eod_mask_loss = d.eod_mask_loss;
  so.reset_position_ids = d.reset_position_ids;
  so.reset_attention_mask = d.reset_attention_mask;
  so.fix_sub_seq_length = d.fix_sub_seq_length;
  so.inter_document_masking = d.dataloader_inter_document_masking;
  so.vocab_size = out.vocab_size;
  const char* names[3] = {"train", "valid", "test"};
  for (int i = 0; i < 3; ++i) {
    if (!splits[i]) continue;
    log(str_cat("> ", names[i], ": ", splits[i]->describe(), " (", sizes[i], " samples needed)"));
    if (splits[i]->size() < sizes[i])
      return FailedPrecondition("the ", names[i], " data has ", splits[i]->size(), " samples but ", sizes[i],
                                " are needed (an unweighted list of prefixes gives one epoch of each dataset, as in "
                                "Megatron; give weights 'w1 p1 w2 p2 ...' to repeat them)");
  }
  if (splits[0]) out.train = make_sample_dataset(std::move(splits[0]), so);
  if (splits[1]) out.valid = make_sample_dataset(std::move(splits[1]), so);
  if (splits[2]) out.test = make_sample_dataset(std::move(splits[2]), so);
  return out;
}

}  // namespace gale
