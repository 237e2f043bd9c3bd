// --dataloader-fast-cache-load and --dataloader-defer-npy-index-mmap (Megatron-LM main): the flags
// and Megatron's checks (BlendedMegatronDatasetConfig.__post_init__).
#include <utility>

#include "train/arguments.h"

namespace gale {

void add_data_cache_args(ArgParser& p, DataArgs& a) {
  p.add_flag("--dataloader-fast-cache-load", &a.dataloader_fast_cache_load,
             "use the fast cache loading path when building the datasets: the cached indices are trusted as they "
             "are (not checked against the .idx, not rebuilt). Requires all the dataset caches to be built and "
             "stored in --data-cache-path");
  p.add_flag("--dataloader-defer-npy-index-mmap", &a.dataloader_defer_npy_index_mmap,
             "defer the loading of the dataset indexes (.npy files) until the first access. Requires all the "
             "dataset caches to be built and stored in --data-cache-path");
}

Status validate_data_cache_args(const Arguments& a, const ArgParser& p) {
  const DataArgs& d = a.data;
  if (d.dataloader_fast_cache_load) {
    if (d.data_cache_path.empty())
      return InvalidArgument("--data-cache-path must be provided when using --dataloader-fast-cache-load.");
    if (!d.data_path.empty() || !d.data_args_path.empty())
      return InvalidArgument(
          "--dataloader-fast-cache-load and --data-path cannot be used together. Use --per-split-data-args-path "
          "or --train-data-path, --valid-data-path and --test-data-path instead.");
  }
  if (d.dataloader_defer_npy_index_mmap && d.data_cache_path.empty())
    return InvalidArgument("--data-cache-path must be provided when using --dataloader-defer-npy-index-mmap.");
  // Gale caches only the indices of the GPT datasets (and --fim-data's, which wrap them).
  for (const auto& [on, flag] : {std::pair<bool, const char*>{d.dataloader_fast_cache_load, "--dataloader-fast-cache-load"},
                                 {d.dataloader_defer_npy_index_mmap, "--dataloader-defer-npy-index-mmap"}}) {
    if (!on) continue;
    const char* other = d.mock_data                ? "--mock-data"
                        : d.is_instruction_dataset ? "--is-instruction-dataset"
                        : d.sft                    ? "--sft"
                        : a.dpo.is_pairwise_dataset ? "--is-pairwise-dataset"
                                                    : nullptr;
    if (other)
      return InvalidArgument(flag, " with ", other, ": not supported (Gale keeps only the GPT datasets' indices in "
                             "--data-cache-path)");
  }
  (void)p;
  return Status::Ok();
}

}  // namespace gale
