// `gale pretrain --sft`'s datasets (see the header).
#include "train/sft_data_setup.h"

#include <tuple>

#include "data/sft_dataset.h"
#include "data/split.h"
#include "train/data_paths.h"
#include "tokenizer/hf_tokenizer.h"

namespace gale {

Status build_sft_data(const Arguments& args, const SplitSampleCounts& counts, PretrainData* out,
                      const std::function<void(const std::string&)>& log) {
  const DataArgs& d = args.data;
  GALE_ASSIGN_OR_RETURN(SftPromptFormat format, parse_sft_prompt_format(d.sft_tokenizer_prompt_format));
  GALE_ASSIGN_OR_RETURN(auto loaded, HuggingFaceTokenizer::load(args.tokenizer.tokenizer_model));
  std::shared_ptr<const HuggingFaceTokenizer> hf(std::move(loaded));
  GALE_ASSIGN_OR_RETURN(SftTokenizer tokenizer, SftTokenizer::create(hf.get(), format));
  log(str_cat("> sft: prompt format ", d.sft_tokenizer_prompt_format, ", pad id ", tokenizer.pad(), ", eod id ",
              tokenizer.eod()));
  const SftSampleOptions options{args.model.seq_length, args.parallel.context_parallel_size};
  const int64_t sizes[3] = {counts.train, counts.valid, counts.test};
  const char* names[3] = {"train", "valid", "test"};
  std::unique_ptr<SampleDataset>* splits[3] = {&out->train, &out->valid, &out->test};

  // One file, its lines cut by --split, or one file per split used whole; each given directly or
  // through --data-args-path / --per-split-data-args-path (train/data_paths.h).
  const bool one_file = !d.data_path.empty() || !d.data_args_path.empty();
  GALE_ASSIGN_OR_RETURN(const DataPathList file, data_path_list(d));
  GALE_ASSIGN_OR_RETURN(const auto per_split, per_split_data_path_lists(d));
  SplitMatrix matrix;
  if (one_file) {
    if (file.entries.size() != 1)
      return Unimplemented("--sft: expected one ", file.flag, " FILE.jsonl, found ", file.entries.size(),
                           " entries (blends of SFT files are not supported yet)");
    GALE_ASSIGN_OR_RETURN(matrix, parse_split(d.split));
  }
  std::shared_ptr<const SftRecords> shared;
  if (one_file) {
    GALE_ASSIGN_OR_RETURN(shared, SftRecords::load(file.entries[0]));
  }
  for (int i = 0; i < 3; ++i) {
    std::shared_ptr<const SftRecords> records = shared;
    int64_t begin = 0, end = 0;
    std::string where;
    if (one_file) {
      if (!matrix[i]) continue;  // the split gets no lines at all (e.g. test of "99,1,0"), as for GPT data
      std::tie(begin, end) = split_range(*matrix[i], static_cast<int64_t>(records->lines.size()));
      where = str_cat(" with --split '", d.split, "'");
    } else {
      const DataPathList& list = per_split[i];
      if (list.entries.empty()) {
        if (sizes[i] > 0 && i == 0) return InvalidArgument("--sft: expected --train-data-path FILE.jsonl");
        continue;
      }
      if (list.entries.size() != 1)
        return Unimplemented("--sft: expected one file for ", list.flag == std::string("--per-split-data-args-path")
                                                                 ? str_cat(list.flag, "'s ", names[i])
                                                                 : std::string(list.flag),
                             ", found ", list.entries.size(), " entries (blends of SFT files are not supported yet)");
      GALE_ASSIGN_OR_RETURN(records, SftRecords::load(list.entries[0]));
      end = static_cast<int64_t>(records->lines.size());
      where = str_cat(" (", list.flag, ")");
    }
    const int64_t n = static_cast<int64_t>(records->lines.size());
    log(str_cat("> sft ", names[i], ": lines [", begin, ", ", end, ") of ", n, " in ", records->path, " (", sizes[i],
                " samples needed)"));
    if (sizes[i] <= 0) continue;
    if (end <= begin)
      return FailedPrecondition("--sft: the ", names[i], " split of ", records->path, " has no lines (lines [", begin,
                                ", ", end, ") of ", n, where, ") but ", sizes[i], " samples are needed");
    *splits[i] = make_sft_dataset(records, hf, tokenizer, begin, end, sizes[i], options);
  }
  return Status::Ok();
}

}  // namespace gale
