// The 2-layer GPT the optimizer MPI tests train (distributed optimizer, swap optimizer,
// low-precision states, EMA AdamW): 8 samples of 16 tokens per step, AdamW with weight decay,
// gradient clipping and a cosine schedule.
#pragma once

#include <string>
#include <vector>

namespace gale::testing {

inline std::vector<std::string> optimizer_test_model(const std::string& train_iters, const std::string& dropout) {
  return {"--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "16",
          "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters",
          train_iters, "--lr", "5e-3", "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data",
          "--make-vocab-size-divisible-by", "64", "--hidden-dropout", dropout, "--attention-dropout", dropout,
          "--eval-iters", "0", "--log-interval", "1000", "--clip-grad", "0.5", "--weight-decay", "0.1"};
}

}  // namespace gale::testing
