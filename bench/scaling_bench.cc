// Scaling benchmark driver, started by bench/scaling under mpirun: trains a small GPT on random
// tokens at the layout given by the usual pretrain flags and reports tokens/s, the exposed
// communication time (CommStats wait_seconds: time blocked waiting for collectives) and the bytes
// each group counted per iteration.
//
//   mpirun -np 4 build/bench/scaling_bench --tensor-model-parallel-size 2 --use-distributed-optimizer
//       [--bench-iters 4] [--bench-warmup 1] [--bench-label tp2_dp2_distopt] [--bench-bucket-size ELEMENTS]
//       [--bench-moe-allgather-overlap]  (the op table's --moe-allgather-overlap-comm switch)
//
// Model flags default to the benchmark's small GPT (below) and may be overridden. Every rank
// prints nothing; the last rank prints one line of `key=value` fields.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "comm/mpi_communicator.h"
#include "core/log.h"
#include "core/rng.h"
#include "train/engine.h"
#include "train/model_setup.h"
#include "train/trainer.h"

namespace gale {
namespace {

// Tokens drawn uniformly from the vocabulary (the counter-based RNG: the same on every rank).
class RandomTokens final : public SampleDataset {
 public:
  RandomTokens(int64_t size, int64_t S, int64_t vocab) : size_(size), S_(S), vocab_(vocab) {}
  int64_t size() const override { return size_; }
  Status get(int64_t index, TrainingSample* out) const override {
    out->tokens.resize(S_);
    out->labels.resize(S_);
    out->loss_mask.assign(S_, 1.0f);
    out->position_ids.resize(S_);
    out->document_ids.assign(S_, 0);
    for (int64_t i = 0; i < S_; ++i) {
      auto draw = [&](int64_t k) {
        return static_cast<int32_t>(uniform_at(7, static_cast<uint64_t>(index), static_cast<uint64_t>(k)) *
                                    static_cast<double>(vocab_)) %
               static_cast<int32_t>(vocab_);
      };
      out->tokens[i] = draw(i);
      out->labels[i] = draw(i + 1);
      out->position_ids[i] = static_cast<int32_t>(i);
    }
    return Status::Ok();
  }

 private:
  int64_t size_, S_, vocab_;
};

// clang-format off
const std::vector<std::string> kSmallGpt = {
    "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
    "--max-position-embeddings", "128", "--micro-batch-size", "2", "--global-batch-size", "16", "--lr", "1e-4",
    "--train-iters", "1000", "--mock-data", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0"};
// clang-format on
constexpr int64_t kVocab = 8192;

struct BenchOptions {
  int iters = 4, warmup = 1;
  std::string label = "layout";
  int64_t bucket_size = 0;  // EngineOptions::ddp_bucket_size (0: Megatron's rule)
  bool moe_allgather_overlap = false;  // OpTable::moe_allgather_overlap
};

int run(int argc, char** argv) {
  StatusOr<Comm> w = init_mpi_world();
  if (!w.ok()) {
    std::fprintf(stderr, "scaling_bench: %s\n", w.status().to_string().c_str());
    return 1;
  }
  Comm world = w.value();
  BenchOptions bench;
  std::vector<std::string> flags = kSmallGpt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "scaling_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--bench-iters")
      bench.iters = std::atoi(value().c_str());
    else if (a == "--bench-warmup")
      bench.warmup = std::atoi(value().c_str());
    else if (a == "--bench-label")
      bench.label = value();
    else if (a == "--bench-bucket-size")
      bench.bucket_size = std::atoll(value().c_str());
    else if (a == "--bench-moe-allgather-overlap")
      bench.moe_allgather_overlap = true;
    else
      flags.push_back(a);  // a pretrain flag (repeated flags keep the last value)
  }
  ArgParser parser("scaling_bench", "scaling benchmark");
  Arguments args;
  add_all_pretrain_args(parser, args);
  std::vector<std::string> full = {"scaling_bench"};
  full.insert(full.end(), flags.begin(), flags.end());
  std::vector<char*> ptrs;
  for (auto& s : full) ptrs.push_back(s.data());
  Status st = parser.parse(static_cast<int>(ptrs.size()), ptrs.data());
  if (st.ok()) st = validate_all_pretrain_args(args, parser, world->size());
  if (!st.ok()) {
    if (world->rank() == 0) std::fprintf(stderr, "scaling_bench: %s\n", st.to_string().c_str());
    return 2;
  }
  args.model.padded_vocab_size =
      pad_vocab_size(kVocab, args.model.make_vocab_size_divisible_by, args.parallel.tensor_model_parallel_size);
  EngineOptions options;
  options.ddp_bucket_size = bench.bucket_size;
  OpTable ops = reference_ops();
  ops.moe_allgather_overlap = bench.moe_allgather_overlap;
  auto built = build_engine(args, world, ops, options);
  if (!built.ok()) {
    if (world->rank() == 0) std::fprintf(stderr, "scaling_bench: %s\n", built.status().to_string().c_str());
    return 1;
  }
  std::unique_ptr<Engine> engine = std::move(built).value();
  RandomTokens data(args.training.global_batch_size * (bench.iters + bench.warmup + 1), args.model.seq_length, kVocab);
  Trainer trainer(args, engine.get(), &data, nullptr, nullptr);
  for (int i = 0; i < bench.warmup; ++i)
    if (!trainer.train_step().ok()) return 1;
  world->barrier();
  engine->ps.reset_stats();
  const double start = now_seconds();
  double loss = 0.0;
  for (int i = 0; i < bench.iters; ++i) {
    auto r = trainer.train_step();
    if (!r.ok()) {
      std::fprintf(stderr, "scaling_bench: %s\n", r.status().to_string().c_str());
      return 1;
    }
    loss = r->loss_sum / r->tokens;
  }
  const double local_seconds = now_seconds() - start;
  const CommStats total = engine->ps.total_stats();
  // The slowest rank sets the pace; exposed communication: the mean and the worst rank.
  const double seconds = world->all_reduce_scalar(local_seconds, ReduceOp::kMax) / bench.iters;
  const double wait = total.wait_seconds / bench.iters;
  const double wait_max = world->all_reduce_scalar(wait, ReduceOp::kMax);
  const double wait_mean = world->all_reduce_scalar(wait, ReduceOp::kSum) / world->size();
  std::string groups;
  const Comm& expert_ep = engine->ps.group(Group::kExpert);
  if (expert_ep && expert_ep->size() > 1) {  // the MoE exchange's exposed time (mean over ranks)
    const double ep_wait = world->all_reduce_scalar(expert_ep->stats().wait_seconds / bench.iters, ReduceOp::kSum);
    groups += str_cat(" exposed_comm_expert_ep_s=", ep_wait / world->size());
  }
  for (int g = 0; g < kNumGroups; ++g) {
    const Comm& c = engine->ps.group(static_cast<Group>(g));
    if (!c || c->stats().total_bytes() == 0) continue;
    groups += str_cat(" bytes_", group_name(static_cast<Group>(g)), "=", c->stats().total_bytes() / bench.iters);
  }
  if (world->rank() == world->size() - 1) {
    const double tokens = static_cast<double>(args.training.global_batch_size * args.model.seq_length);
    std::printf(
        "label=%s ranks=%d tp=%lld dp=%lld buckets=%zu step_s=%.4f tokens_per_s=%.1f exposed_comm_s=%.4f "
        "exposed_comm_max_s=%.4f exposed_frac=%.3f loss=%.4f%s\n",
        bench.label.c_str(), world->size(), static_cast<long long>(args.parallel.tensor_model_parallel_size),
        static_cast<long long>(args.parallel.data_parallel_size), engine->dp_sync[0]->buckets().size(), seconds,
        tokens / seconds, wait_mean, wait_max, wait_mean / seconds, loss, groups.c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace gale

int main(int argc, char** argv) { return gale::run(argc, argv); }
