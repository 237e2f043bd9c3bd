// A training run for tests, built from `gale pretrain` flags the way the CLI builds it: parsed and
// validated arguments, the engine on a given world, and a trainer reading synthetic samples.
#pragma once

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing_data.h"
#include "train/engine.h"
#include "train/model_setup.h"
#include "train/trainer.h"

namespace gale::testing {

// The flag lists of a test, concatenated.
inline std::vector<std::string> join(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// The two tiny model shapes of the multi-rank tests (8 heads so that TP up to 4 divides them):
// GPT (LayerNorm, GeLU, learned positions, biases, tied embeddings) and LLaMA-style (GQA with 4
// groups, RMSNorm, SwiGLU, RoPE, no biases, untied output layer).
inline const std::vector<std::string> kTinyGpt = {"--num-attention-heads", "8"};
inline const std::vector<std::string> kTinyLlama = {
    "--num-attention-heads", "8", "--group-query-attention", "--num-query-groups", "4", "--normalization", "RMSNorm",
    "--swiglu", "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights"};
// Their token ids: 250, padded to 256 at TP 1, 2 and 4 with --make-vocab-size-divisible-by 64.
constexpr int64_t kTinyVocab = 250;

// The pipeline-schedule tests' run: 4 layers (tests at PP4 add --num-layers 8), hidden 64, 16
// sequences of 16 tokens per iteration in micro-batches of 2, 5 iterations, cosine LR with warm-up,
// dropout 0.1, clipping 0.5, no evaluation.
inline const std::vector<std::string> kPipelineTestFlags = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "16", "--train-iters", "5", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};

// A tiny Mixtral for the MoE multi-rank tests: kTinyLlama with 4 layers (0, 1 and 3 MoE; `experts`
// experts of FFN 48, top-2, load-balancing 0.1) and a gated SwiGLU shared expert of FFN 32, the
// `dispatcher` token dispatcher with grouped GEMMs; 3 iterations of 8 sequences of 16 tokens.
inline std::vector<std::string> tiny_mixtral_flags(int experts, const std::string& dispatcher) {
  return join({{"--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
                "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "3", "--lr", "2e-3",
                "--lr-warmup-iters", "1", "--mock-data", "--make-vocab-size-divisible-by", "64", "--hidden-dropout",
                "0.1", "--eval-iters", "0", "--log-interval", "1000"},
               kTinyLlama,
               {"--num-experts", std::to_string(experts), "--moe-router-topk", "2", "--moe-ffn-hidden-size", "48",
                "--moe-layer-freq", "[1,1,0,1]", "--moe-aux-loss-coeff", "0.1", "--moe-shared-expert-intermediate-size",
                "32", "--moe-shared-expert-gate", "--moe-token-dispatcher-type", dispatcher, "--moe-grouped-gemm",
                "--moe-permutation-async-comm"}});
}

// ‖shard − ref‖ / ‖ref‖ over the elements of parameter `s` this rank holds (`shard`, in its local
// layout) against the whole tensor `ref` of a single-process run (indexed by s.global_index); with
// `ranges`, only the flat-buffer elements inside them (the distributed optimizer's owned shards).
inline double shard_relative_error(const ParamSpec& s, const float* shard, const float* ref,
                                   const std::vector<FlatRange>* ranges) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < s.local_numel(); ++i) {
    if (ranges && std::none_of(ranges->begin(), ranges->end(),
                               [&](const FlatRange& r) { return r.begin <= s.offset + i && s.offset + i < r.end; }))
      continue;
    const double r = ref[s.global_index(i)];
    diff += (shard[i] - r) * (shard[i] - r);
    norm += r * r;
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

class TestRun {
 public:
  // `flags` are pretrain flags (no program name); samples come from SyntheticDataset over `vocab`
  // token ids, and the vocabulary is padded as the flags say (--make-vocab-size-divisible-by x TP).
  TestRun(const std::vector<std::string>& flags, const Comm& world, int64_t vocab, EngineOptions options = {},
          const OpTable& ops = reference_ops()) {
    add_all_pretrain_args(parser, args);
    std::vector<std::string> argv = {"gale"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::vector<char*> ptrs;
    for (auto& a : argv) ptrs.push_back(a.data());
    GALE_CHECK_OK(parser.parse(static_cast<int>(ptrs.size()), ptrs.data()));
    GALE_CHECK_OK(validate_all_pretrain_args(args, parser, world->size(), world->rank()));
    args.model.padded_vocab_size = pad_vocab_size(vocab, args.model.make_vocab_size_divisible_by,
                                                  args.parallel.tensor_model_parallel_size);
    data = std::make_unique<SyntheticDataset>(100000, args.model.seq_length, vocab);
    apply_recompute_modules(args.model, &options.recompute);  // --recompute-modules, as gale pretrain
    auto built = build_engine(args, world, ops, options);
    GALE_CHECK_OK(built.status());
    engine = std::move(built).value();
    trainer = std::make_unique<Trainer>(args, engine.get(), data.get(), nullptr, nullptr);
  }
  TestRun(const TestRun&) = delete;
  TestRun& operator=(const TestRun&) = delete;

  // Runs `n` iterations; returns their logged losses (also appended to `losses`, and the gradient
  // norms to `grad_norms`).
  std::vector<double> train(int n) {
    std::vector<double> out;
    for (int i = 0; i < n; ++i) {
      auto r = trainer->train_step();
      GALE_CHECK_OK(r.status());
      ++trainer->state().iteration;
      out.push_back(r->loss_sum / r->tokens);
      losses.push_back(out.back());
      grad_norms.push_back(r->step.grad_norm);
      double balancing = 0.0;  // the load-balancing losses of every kind that is on
      for (double v : r->load_balancing_loss) balancing += v;
      load_balancing_losses.push_back(balancing);
      mtp_losses.push_back(r->mtp_losses);
    }
    return out;
  }
  GPTModel& model(size_t chunk = 0) { return *engine->chunks.at(chunk); }
  // Trains on `d` instead (a new trainer, at iteration 0).
  void set_data(std::unique_ptr<SyntheticDataset> d) {
    data = std::move(d);
    trainer = std::make_unique<Trainer>(args, engine.get(), data.get(), nullptr, nullptr);
  }

  ArgParser parser{"gale pretrain", "test"};
  Arguments args;
  std::unique_ptr<SyntheticDataset> data;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Trainer> trainer;
  std::vector<double> losses, grad_norms;
  std::vector<double> load_balancing_losses;  // MoE: each iteration's logged load-balancing losses, summed over kinds
  std::vector<std::vector<double>> mtp_losses;  // --mtp-num-layers: each iteration's MTP losses
};

// The flat ranges of chunk `c` whose gradients this rank owns after the sync, dense and expert: with
// a sharded optimizer its segments (the only gradients its step reads, and clips in place).
inline std::vector<FlatRange> owned_flat_ranges(const TestRun& run, size_t c) {
  const Optimizer& optimizer = *run.engine->optimizer;
  if (optimizer.sharded(c)) {  // the optimizer's pieces: ZeRO-1's shards, or Muon's layer-wise whole parameters
    std::vector<FlatRange> owned;
    for (const Optimizer::Segment& seg : optimizer.segments(c)) owned.push_back({seg.begin, seg.begin + seg.numel});
    return owned;
  }
  std::vector<FlatRange> owned = run.engine->dp_sync[c]->owned_ranges();
  if (!run.engine->expert_dp_sync.empty())
    for (const FlatRange& r : run.engine->expert_dp_sync[c]->owned_ranges()) owned.push_back(r);
  return owned;
}

// A multi-rank `run` against the single-process `reference` of the same model, both trained
// `iterations` steps (call finish_param_sync on `run` first): losses and gradient norms of every
// iteration within 1e-5 (relative), every parameter this rank holds within 1e-3 and its gradient,
// over the flat ranges this rank owns (dense and expert), within `grad_tolerance`. Parameters are
// matched by their whole-model name (under EP: the global expert). Returns how many of this rank's
// parameters have `name_part` in their name, for the caller to check the layout holds them.
inline int expect_matches_reference(const TestRun& run, const TestRun& reference, int iterations,
                                    double grad_tolerance, const std::string& name_part) {
  for (int i = 0; i < iterations; ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], reference.grad_norms[i], 1e-5 * reference.grad_norms[i])
        << "grad norm of iteration " << i + 1;
  }
  const ParamBuffer& ref = reference.engine->chunks[0]->params();
  int named = 0;
  for (size_t c = 0; c < run.engine->chunks.size(); ++c) {
    const ParamBuffer& pb = run.engine->chunks[c]->params();
    std::vector<FlatRange> owned = owned_flat_ranges(run, c);
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      named += s.name.find(name_part) != std::string::npos;
      const int rid = ref.find(s.whole_model_name());
      EXPECT_GE(rid, 0) << s.name;
      if (rid < 0) continue;
      EXPECT_LT(shard_relative_error(s, pb.param_data(id), ref.param_data(rid), nullptr), 1e-3) << "parameter " << s.name;
      EXPECT_LT(shard_relative_error(s, pb.grad_data(id), ref.grad_data(rid), &owned), grad_tolerance)
          << "gradient " << s.name;
    }
  }
  return named;
}

}  // namespace gale::testing
