// Running `gale generate`, `gale evaluate` and `gale convert` on a checkpoint a CLI test trained: the
// model from the checkpoint's args (NullTokenizer), batched greedy generation, and the one-line
// refusal of a conversion.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "subprocess.h"

namespace gale::testing {

// `gale <sub> --load <ckpt> --use-checkpoint-args` with the NullTokenizer of 4096 tokens, then `extra`
// (one OpenMP thread, 300 s).
inline test::RunResult infer_from_checkpoint(const char* sub, const std::string& ckpt, std::vector<std::string> extra) {
  std::vector<std::string> argv = {GALE_BINARY, sub, "--load", ckpt, "--use-checkpoint-args",
                                   "--tokenizer-type", "NullTokenizer", "--vocab-size", "4096"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return test::run_with_timeout(argv, {"OMP_NUM_THREADS=1"}, 300);
}

// Dynamic batching in a buffer of `buffer_gb` GiB of blocks of 8 positions for requests of up to
// `max_seq_length` positions, at most 16 tokens a step.
inline std::vector<std::string> small_dynamic_batching_flags(const char* buffer_gb, const char* max_seq_length) {
  return {"--inference-dynamic-batching", "--inference-dynamic-batching-buffer-size-gb", buffer_gb,
          "--inference-max-seq-length", max_seq_length, "--inference-dynamic-batching-block-size", "8",
          "--inference-dynamic-batching-max-tokens-override", "16"};
}

// Greedy `gale generate --prompts-file <prompts_file>` of `max_new` tokens from the checkpoint
// (infer_from_checkpoint): static batches of 2 requests, or with `dynamic` (its flags) dynamic batching.
inline test::RunResult generate_batched(const std::string& ckpt, const std::string& prompts_file, const char* max_new,
                                        const std::vector<std::string>& dynamic) {
  std::vector<std::string> flags = {"--prompts-file", prompts_file, "--temperature", "0", "--max-new-tokens", max_new};
  if (dynamic.empty()) flags.insert(flags.end(), {"--inference-max-requests", "2"});
  flags.insert(flags.end(), dynamic.begin(), dynamic.end());
  return infer_from_checkpoint("generate", ckpt, flags);
}

// `gale convert` of the Gale checkpoint `ckpt` to Hugging Face's format in `out` fails with `expected`.
inline void expect_hf_conversion_refused(const std::string& ckpt, const std::string& out, const std::string& expected) {
  const test::RunResult hf = test::run_with_timeout({GALE_BINARY, "convert", "--load-model-type", "gale",
                                                     "--save-model-type", "hf", "--load-dir", ckpt, "--save-dir", out},
                                                    {}, 60);
  EXPECT_NE(hf.exit_code, 0);
  EXPECT_NE(hf.output.find(expected), std::string::npos) << hf.output;
}

}  // namespace gale::testing
