// `gale pretrain --perform-rl-step` end to end: a tiny GPT trained by online GRPO in a contains-answer
// environment (NullTokenizer prompts) logs its collections and Megatron's RL log line, two runs are
// identical, the first iteration (policy = reference = π_old) has ratio 1 and KL 0, data parallelism 2
// (every rank generates the same rollouts), tensor parallelism 2 and pipeline parallelism 2 (rollouts from a
// whole-model copy refit from the shards) and, for a MoE policy, expert parallelism 2 reproduce one process, the importance-sampling
// correction against the sampler's log-probabilities (and its truncation) acts on the loss, the
// flags accepted without effect change nothing, and the refusals are one-line errors naming the flag.
#include <gtest/gtest.h>

#include <regex>

#include "cli/log_line.h"
#include "cli/mpi_cli.h"
#include "data/data_test_util.h"
#include "subprocess.h"

namespace gale {
namespace {

using testing::logged_values;
using testing::TempDir;

// The environment: 4 prompts of NullTokenizer ids, the answer a single id, reward when the
// completion contains it.
std::string write_env(const TempDir& dir, const std::string& extra = "") {
  testing::write_file(dir.file("prompts.jsonl"),
                      "{\"prompt\": \"1 2 3\", \"answer\": \"4\"}\n{\"prompt\": \"5 6\", \"answer\": 7}\n"
                      "{\"prompt\": \"2 4 6\", \"answer\": \"8\"}\n{\"prompt\": \"3 3\", \"answer\": \"6\"}\n");
  testing::write_file(dir.file("env.yaml"),
                      "environment: contains\ndata: prompts.jsonl\nmax_new_tokens: 4\n" + extra);
  return dir.file("env.yaml");
}

std::vector<std::string> rl(const std::string& env, std::vector<std::string> extra) {
  std::vector<std::string> argv = {
      GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
      "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "2", "--global-batch-size", "4",
      "--lr", "1e-2", "--vocab-size", "15", "--log-interval", "1", "--eval-iters", "0", "--num-threads", "1",
      "--attention-dropout", "0", "--hidden-dropout", "0", "--train-iters", "6", "--perform-rl-step",
      "--langrl-env-config", env, "--grpo-prompts-per-step", "2", "--grpo-group-size", "4", "--grpo-iterations", "2",
      "--grpo-kl-beta", "0.05", "--grpo-clamp-eps-lower", "0.2", "--grpo-clamp-eps-upper", "0.28"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

test::RunResult gale(std::vector<std::string> argv) { return test::run_with_timeout(argv, {}, 300); }

// The log's lines holding `needle`; training lines without their timestamp and elapsed time.
std::vector<std::string> lines_with(const std::string& output, const std::string& needle) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < output.size()) {
    size_t end = output.find('\n', start);
    if (end == std::string::npos) end = output.size();
    std::string line = output.substr(start, end - start);
    if (line.find(needle) != std::string::npos) {
      const size_t e = line.find("| elapsed time per iteration");  // the timestamp and the time cut out
      if (e != std::string::npos) {
        const size_t next = line.find(" |", e + 2);
        line = line.substr(0, e) + line.substr(next + 2);
        line = line.substr(line.find(" iteration "));
        // Megatron's RL throughput fields (tokens per second) vary with the time too.
        line = std::regex_replace(line, std::regex(" [a-z_]*toks/s(/gpu)?: [0-9]+ \\|"), "");
      }
      out.push_back(line);
    }
    start = end + 1;
  }
  return out;
}

// `flags` (without the binary) on `np` ranks with `layout` appended.
test::RunResult run_layout(const std::vector<std::string>& flags, const std::vector<std::string>& layout, int np) {
  std::vector<std::string> f = flags;
  f.insert(f.end(), layout.begin(), layout.end());
  return test::run_with_timeout(testing::launch_argv(np, {GALE_BINARY}, f), np > 1 ? testing::kMpiEnv : std::vector<std::string>{},
                                300);
}

// Every logged value of each key in `two` is `one`'s within 1e-5 relative (summation order), as many.
void expect_same_logged_values(const test::RunResult& one, const test::RunResult& two,
                               std::initializer_list<const char*> keys, const std::string& layout) {
  for (const char* key : keys) {
    const std::vector<double> a = logged_values(one.output, key), b = logged_values(two.output, key);
    ASSERT_FALSE(a.empty()) << key << one.output;
    ASSERT_EQ(a.size(), b.size()) << key << " " << layout << two.output;
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], 1e-5 * std::max(1.0, std::abs(a[i]))) << key << " " << layout << " " << i;
  }
}

// `flags` on 2 ranks with `layout` logs `one`'s collections and evaluations, and its losses and
// gradient norms up to summation order.
void expect_layout_reproduces(const test::RunResult& one, const std::vector<std::string>& flags,
                              const std::vector<std::string>& layout) {
  std::string name;
  for (const std::string& f : layout) name += f + " ";
  const test::RunResult two = run_layout(flags, layout, 2);
  ASSERT_EQ(two.exit_code, 0) << name << two.output;
  EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration"),
            lines_with(two.output, "> GRPO collection at iteration")) << name;
  EXPECT_EQ(lines_with(one.output, "_eval_mean_"), lines_with(two.output, "_eval_mean_")) << name;
  expect_same_logged_values(one, two, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"}, name);
}

TEST(GalePretrainGrpo, TrainsDeterministically) {
  TempDir dir;
  const std::string env = write_env(dir);
  const test::RunResult a = gale(rl(env, {}));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const test::RunResult b = gale(rl(env, {"--log-memory-interval", "3"}));  // the same training
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // 2 prompts x 4 completions = 2 global batches of 4, 2 passes: a collection every 4 iterations.
  const std::vector<std::string> collections = lines_with(a.output, "> GRPO collection");
  ASSERT_EQ(collections.size(), 2u) << a.output;
  EXPECT_NE(collections[0].find("collection at iteration 0: 2 prompts x 4 completions, reward mean "),
            std::string::npos) << collections[0];
  EXPECT_NE(collections[1].find("collection at iteration 4:"), std::string::npos) << collections[1];
  EXPECT_NE(a.output.find("environment contains, 4 prompts from"), std::string::npos) << a.output;
  const std::vector<double> grad_norm = logged_values(a.output, "grad norm");
  ASSERT_EQ(grad_norm.size(), 6u) << a.output;
  for (double g : grad_norm) EXPECT_GT(g, 0.0);
  // Two runs: the same rollouts, rewards and updates.
  EXPECT_EQ(collections, lines_with(b.output, "> GRPO collection"));
  EXPECT_EQ(grad_norm, logged_values(b.output, "grad norm"));
  EXPECT_EQ(logged_values(a.output, "rl/pi_over_pi_old"), logged_values(b.output, "rl/pi_over_pi_old"));
  // Iteration 1: the policy is π_old and the reference: ratio 1, KL 0 (Megatron's training_log prints
  // every entry whose average is >= 0, zeros included).
  const std::vector<std::string> log = lines_with(a.output, "| consumed samples:");
  ASSERT_EQ(log.size(), 6u);
  // Megatron's print_datetime around train() (its RL loop is train()'s): before the first line and
  // after the last.
  const size_t before = a.output.find("[before the start of training step] datetime: ");
  const size_t after = a.output.find("[after training is done] datetime: ");
  ASSERT_NE(before, std::string::npos) << a.output;
  ASSERT_NE(after, std::string::npos) << a.output;
  EXPECT_LT(before, a.output.find("] iteration        1/       6 |"));
  EXPECT_GT(after, a.output.find("] iteration        6/       6 |"));
  EXPECT_NE(log[0].find("rl/pi_over_pi_old: 1.000000E+00 |"), std::string::npos) << log[0];
  EXPECT_NE(log[0].find("| rl/kl_term: 0.000000E+00 | rl/pi_over_pi_old: 1.000000E+00 |"), std::string::npos) << log[0];
  // After an update the policy moved: π/π_old ≠ 1 on the second batch, a KL to the reference.
  EXPECT_NE(log[1].find("rl/kl_term: "), std::string::npos) << log[1];
  EXPECT_EQ(log[1].find("rl/pi_over_pi_old: 1.000000E+00 |"), std::string::npos) << log[1];
  EXPECT_NE(log[3].find("rl/truncated_from_"), std::string::npos) << log[3];
  // Megatron's memory report (train/memory_report.h) after the log lines, as the trainer's: the
  // footprint and the line after iterations 1 and 2 (report_memory_flag), then the line at every
  // --log-memory-interval 3 iteration.
  for (const test::RunResult* r : {&a, &b}) {
    std::vector<size_t> at;
    for (size_t p = r->output.find("\n[Rank 0] (after "); p != std::string::npos;
         p = r->output.find("\n[Rank 0] (after ", p + 1))
      at.push_back(p);
    const std::vector<const char*> expected =
        r == &a ? std::vector<const char*>{"1", "2"} : std::vector<const char*>{"1", "2", "3", "6"};
    ASSERT_EQ(at.size(), expected.size()) << r->output;
    for (size_t i = 0; i < at.size(); ++i) {
      const std::string it = expected[i];
      const std::string line = "\n[Rank 0] (after " + it + " iterations) memory (MB) | allocated: ";
      EXPECT_EQ(r->output.compare(at[i], line.size(), line), 0) << r->output.substr(at[i], 80);
      EXPECT_LT(r->output.find("] iteration        " + it + "/       6 |"), at[i]);
    }
    const size_t footprint = r->output.find("Theoretical memory footprints: weight and optimizer=");
    ASSERT_NE(footprint, std::string::npos) << r->output;
    EXPECT_NE(r->output.find("Theoretical memory footprints: ", footprint + 1), std::string::npos);
    EXPECT_EQ(r->output.find("Theoretical memory footprints: ", r->output.find("] iteration        3/")),
              std::string::npos);
  }
}

TEST(GalePretrainGrpo, GroupFilterAndExactMatch) {
  TempDir dir;
  const std::string env = write_env(dir);
  testing::write_file(dir.file("never.jsonl"), "{\"prompt\": \"1 2\", \"answer\": \"99\"}\n");  // ids are 0..14
  testing::write_file(env, "environment: exact_match\ndata: never.jsonl\nmax_new_tokens: 2\n");
  const test::RunResult r = gale(rl(env, {"--train-iters", "1", "--grpo-filter-groups-with-same-reward",
                                          "--grpo-iterations", "1", "--global-batch-size", "8"}));
  // No completion can be "99" (NullTokenizer decodes ids joined by spaces): every group has reward 0.
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("gale pretrain: error: --grpo-filter-groups-with-same-reward: 200 prompts drawn for "
                          "the collection at iteration 0 and only 0 of 2 groups had different rewards"),
            std::string::npos)
      << r.output;
}

// One global batch per collection (8 rows, one pass): DP 2 trains on the same rows as one process,
// each rank on its half in micro-batches of 2, so the logged values agree up to summation order.
TEST(GalePretrainGrpo, DataParallelReproducesOneProcess) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags = rl(env, {"--train-iters", "2", "--global-batch-size", "8", "--grpo-iterations", "1",
                                            "--eval-iters", "1", "--eval-interval", "1", "--rl-prompts-per-eval", "2"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const test::RunResult two = run_layout(flags, {}, 2);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration 0:"),
            lines_with(two.output, "> GRPO collection at iteration 0:"));
  // The evaluations (after iterations 1 and 2, and after training) agree too.
  const std::vector<std::string> evals = lines_with(one.output, "_eval_mean_");
  ASSERT_EQ(evals.size(), 9u) << one.output;  // 3 evaluations x (pass@1, pass@32, greedy reward)
  EXPECT_EQ(evals, lines_with(two.output, "_eval_mean_"));
  for (const char* key : {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old"}) {
    const std::vector<double> a = logged_values(one.output, key), b = logged_values(two.output, key);
    ASSERT_EQ(a.size(), 2u) << key << one.output;
    ASSERT_EQ(b.size(), 2u) << key << two.output;
    EXPECT_NEAR(a[0], b[0], 1e-5 * std::max(1.0, std::abs(a[0]))) << key;
  }
}

// Tensor parallelism 2 with sequence parallelism (SwiGLU, RMSNorm: the gated fc1 rows), pipeline
// parallelism 2 (1F1B; the tied embedding on both stages) and context parallelism 2 (ring and Ulysses:
// each cp rank's positions, the loss from the whole rows' log-probabilities): the rollouts come from
// the policy's whole-model copy refit from the shards, so every collection and evaluation is the one process's
// (the same initial weights; after a step equal up to the TP sums' rounding, which no sampled token
// notices here), and the logged losses agree up to summation order. A padded vocabulary of 16 at
// TP 1 and 2 (--make-vocab-size-divisible-by 8) keeps the models the same.
TEST(GalePretrainGrpo, TensorPipelineAndContextParallelReproduceOneProcess) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations", "2", "--eval-iters", "1",
               "--eval-interval", "2", "--rl-prompts-per-eval", "2", "--swiglu", "--normalization", "RMSNorm",
               "--make-vocab-size-divisible-by", "8", "--rl-inference-logprobs-is-correction"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> collections = lines_with(one.output, "> GRPO collection at iteration");
  ASSERT_EQ(collections.size(), 2u) << one.output;
  const std::vector<std::string> evals = lines_with(one.output, "_eval_mean_");
  ASSERT_EQ(evals.size(), 9u) << one.output;  // after iterations 2 and 4, and after training
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--rl-inference-tensor-model-parallel-size", "1"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}})
    expect_layout_reproduces(one, flags, layout);
}

// The layouts with more than one model chunk per rank or another cut of the sequence: virtual
// pipeline stages (PP 2, one layer per virtual stage: two chunks per rank through the interleaved
// schedule), DualPipeV (PP 2: rank 0 holds the first and the last chunk), adaptive_cp_algo (each
// micro-batch cut by the planner's layout) and --tp-2d (X 2 and Y 2: 2-D weight blocks); the
// rollout copy is refit from every chunk, so collections and evaluations are one process's.
TEST(GalePretrainGrpo, VirtualStagesDualPipeVAdaptiveCpAndTp2dReproduceOneProcess) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--num-layers", "4", "--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations", "2",
               "--eval-iters", "1", "--eval-interval", "2", "--rl-prompts-per-eval", "2", "--swiglu", "--normalization",
               "RMSNorm", "--make-vocab-size-divisible-by", "8"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> collections = lines_with(one.output, "> GRPO collection at iteration");
  ASSERT_EQ(collections.size(), 2u) << one.output;
  const std::vector<std::string> evals = lines_with(one.output, "_eval_mean_");
  ASSERT_EQ(evals.size(), 9u) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2", "--schedules-method", "dualpipev"},
        std::vector<std::string>{"--context-parallel-size", "2", "--context-parallel-algo", "adaptive_cp_algo"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--tp-2d", "--tp-x", "2", "--tp-y", "1"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--tp-2d", "--tp-x", "1", "--tp-y", "2"}})
    expect_layout_reproduces(one, flags, layout);
}

// --rl-use-sequence-packing (micro-batches of one bin): the packing line and Megatron's consumed bins,
// the global batch size counting the rollouts; with gbs = P·G an iteration trains every bin, so the
// first iteration's token means (entropy) are the unpacked run's while the gradient is not (each
// bin's token mean, averaged over the bins, instead of each row's); TP 2 + SP, PP 2 and DP 2 (fifo
// and round-robin bins) reproduce the one-process packed run. At CP 2 (ring, Ulysses) each rollout's
// slot is a multiple of 4 positions, so later collections may pack differently: there the first
// iteration's token means, which every bin takes part in, are compared.
TEST(GalePretrainGrpo, SequencePackingTrainsOnBinsAcrossLayouts) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> unpacked =
      rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations", "2", "--micro-batch-size", "1",
               "--swiglu", "--normalization", "RMSNorm", "--make-vocab-size-divisible-by", "8"});
  unpacked.erase(unpacked.begin());  // the binary
  std::vector<std::string> flags = unpacked;
  flags.push_back("--rl-use-sequence-packing");
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_EQ(lines_with(one.output, "[SequencePacker] Packing distribution: ").size(), 2u) << one.output;
  const std::vector<std::string> log = lines_with(one.output, "| consumed samples:");
  ASSERT_EQ(log.size(), 4u) << one.output;
  const std::vector<double> bins = logged_values(one.output, "consumed bins");
  ASSERT_EQ(bins.size(), 4u) << one.output;
  const std::vector<std::string> packing = lines_with(one.output, "[SequencePacker]");
  const int64_t per_iteration = std::stoll(packing[0].substr(packing[0].find("distribution: ") + 14));
  EXPECT_EQ(bins[0], static_cast<double>(per_iteration));
  EXPECT_EQ(bins[1], 2.0 * static_cast<double>(per_iteration)) << "every iteration trains all the collection's bins";
  EXPECT_LT(per_iteration, 8) << "the 8 rollouts share bins";
  EXPECT_NE(log[0].find("| global batch size:     8 |"), std::string::npos) << log[0];
  // Megatron's RL throughput fields: every bin's positions (compute) against the rollouts' tokens.
  for (const char* key : {"toks/s", "toks/s/gpu", "compute_toks/s", "actual_toks/s", "avg_seq_len"})
    EXPECT_EQ(logged_values(one.output, key).size(), 4u) << key << log[0];
  const double avg_len = logged_values(one.output, "avg_seq_len")[0];
  const size_t eff = log[0].find("| packing_eff: ");
  ASSERT_NE(eff, std::string::npos) << log[0];
  const double efficiency = std::stod(log[0].substr(eff + 15)) / 100.0;  // Σ lengths / (bins · S)
  // avg_seq_len is printed to 0.1 and packing_eff to 0.1 %: the tolerance is their rounding.
  EXPECT_NEAR(efficiency, avg_len * 8.0 / (static_cast<double>(per_iteration) * 16.0),
              0.05 * 8.0 / (static_cast<double>(per_iteration) * 16.0) + 5e-4) << log[0];
  EXPECT_GT(logged_values(one.output, "compute_toks/s")[0], logged_values(one.output, "actual_toks/s")[0]);
  const test::RunResult plain = run_layout(unpacked, {}, 1);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration 0:"),
            lines_with(plain.output, "> GRPO collection at iteration 0:"));
  EXPECT_NEAR(logged_values(one.output, "rl/entropy_term")[0], logged_values(plain.output, "rl/entropy_term")[0], 1e-6);
  EXPECT_GT(std::abs(logged_values(one.output, "grad norm")[0] - logged_values(plain.output, "grad norm")[0]), 1e-3);
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--context-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}}) {
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << layout.back() << two.output;
    EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration 0:"),
              lines_with(two.output, "> GRPO collection at iteration 0:")) << layout.back();
    for (const char* key : {"rl/entropy_term", "rl/pi_over_pi_old"})
      EXPECT_NEAR(logged_values(one.output, key)[0], logged_values(two.output, key)[0], 1e-6) << layout.back();
  }
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--rl-sequence-packing-algo", "fifo"},
        std::vector<std::string>{"--rl-sequence-packing-algo", "round-robin"}})
    expect_layout_reproduces(one, flags, layout);
}

// --rl-use-sequence-packing with recurrent layers and MTP: `model` packed trains on bins whose
// first iteration's entropy (every rollout's tokens, policy = π_old) is the unpacked run's, which
// holds only when the Mamba and Gated DeltaNet scans restart at each rollout. (A rollout without
// generated tokens is a micro-batch of its own unpacked, counting one token of ratio 0, as Megatron's:
// the unpacked token means are then over E more tokens, N/(N+E) = the unpacked ratio, while every
// bin holds tokens, ratio 1.) Each of `layouts` reproduces the one-process packed run (`first_only`:
// its first iteration's token means, for CP 2, whose 4-position slots may pack later collections
// differently).
void expect_packing_matches_rows(const std::string& env, const std::vector<std::string>& model,
                                 const std::vector<std::vector<std::string>>& layouts,
                                 const std::vector<std::vector<std::string>>& first_only) {
  std::vector<std::string> unpacked = rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations",
                                               "2", "--micro-batch-size", "1", "--make-vocab-size-divisible-by", "8"});
  unpacked.erase(unpacked.begin());  // the binary
  unpacked.insert(unpacked.end(), model.begin(), model.end());
  std::vector<std::string> flags = unpacked;
  flags.push_back("--rl-use-sequence-packing");
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> packing = lines_with(one.output, "[SequencePacker] Packing distribution: ");
  ASSERT_EQ(packing.size(), 2u) << one.output;
  EXPECT_LT(std::stoll(packing[0].substr(packing[0].find("distribution: ") + 14)), 8) << "the 8 rollouts share bins";
  const test::RunResult plain = run_layout(unpacked, {}, 1);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration 0:"),
            lines_with(plain.output, "> GRPO collection at iteration 0:"));
  EXPECT_NEAR(logged_values(one.output, "rl/pi_over_pi_old").at(0), 1.0, 1e-6);
  const double unpacked_ratio = logged_values(plain.output, "rl/pi_over_pi_old").at(0);
  EXPECT_NEAR(logged_values(one.output, "rl/entropy_term").at(0),
              logged_values(plain.output, "rl/entropy_term").at(0) / unpacked_ratio,
              2e-6 * logged_values(one.output, "rl/entropy_term").at(0));
  for (const std::vector<std::string>& layout : layouts) expect_layout_reproduces(one, flags, layout);
  for (const std::vector<std::string>& layout : first_only) {
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << layout[0] << two.output;
    EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration 0:"),
              lines_with(two.output, "> GRPO collection at iteration 0:")) << layout[0];
    for (const char* key : {"rl/entropy_term", "rl/pi_over_pi_old"})
      EXPECT_NEAR(logged_values(one.output, key).at(0), logged_values(two.output, key).at(0), 1e-6) << layout[0];
  }
}

// A hybrid Mamba policy ("M*-M"): TP 2 + SP and PP 2 reproduce one process, CP 2 (the scan's
// all-to-all over whole sequences) its first iteration.
TEST(GalePretrainGrpo, SequencePackingWithMambaLayers) {
  TempDir dir;
  expect_packing_matches_rows(
      write_env(dir),
      {"--num-layers", "4", "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--mamba-state-dim", "16",
       "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--normalization", "RMSNorm", "--position-embedding-type",
       "none"},
      {{"--tensor-model-parallel-size", "2", "--sequence-parallel"}, {"--pipeline-model-parallel-size", "2"}},
      {{"--context-parallel-size", "2"}});
}

// Gated DeltaNet layers (--experimental-attention-variant gdn, layers 0 and 2): TP 2 + SP reproduces one
// process, CP 2 its first iteration.
TEST(GalePretrainGrpo, SequencePackingWithGatedDeltaNetLayers) {
  TempDir dir;
  expect_packing_matches_rows(
      write_env(dir),
      {"--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--experimental-attention-variant", "gdn",
       "--linear-attention-freq", "2", "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
       "--linear-key-head-dim", "8", "--linear-value-head-dim", "8", "--linear-conv-kernel-dim", "3"},
      {{"--tensor-model-parallel-size", "2", "--sequence-parallel"}}, {{"--context-parallel-size", "2"}});
}

// --mtp-num-layers 1 (its rolls inside each rollout: tests/model/packed_sequences_test.cc): TP 2 + SP and
// PP 2 reproduce one process, the MTP loss logged.
TEST(GalePretrainGrpo, SequencePackingWithMtp) {
  TempDir dir;
  const std::string env = write_env(dir);
  expect_packing_matches_rows(env, {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"},
                              {{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
                               {"--pipeline-model-parallel-size", "2"}},
                              {});
  std::vector<std::string> flags = rl(env, {"--train-iters", "2", "--global-batch-size", "8", "--micro-batch-size", "1",
                                            "--make-vocab-size-divisible-by", "8", "--mtp-num-layers", "1",
                                            "--rl-use-sequence-packing"});
  const test::RunResult one = gale(flags);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> mtp = logged_values(one.output, "mtp_1 loss");
  ASSERT_EQ(mtp.size(), 2u) << one.output;
  for (double v : mtp) EXPECT_GT(v, 1.0);  // cross-entropy over a padded vocabulary of 16 at start: about ln 16
}

// Sharded state at DP 2: the distributed optimizer (ZeRO-1), ZeRO-2 (--use-custom-fsdp optim_grads: gradients and optimizer state
// sharded), ZeRO-3 (optim_grads_params: values too) and PyTorch FSDP2 (ZeRO-3 with its own units):
// the rollouts and the evaluation come from a whole-model copy refit from the shards (an all-gather),
// the reference model is that copy's weights, and every collection, evaluation and logged value is
// the one process's (untied embeddings: FSDP2 needs them).
TEST(GalePretrainGrpo, ShardedParametersReproduceOneProcess) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations", "2", "--eval-iters", "1",
               "--eval-interval", "2", "--rl-prompts-per-eval", "2", "--untie-embeddings-and-output-weights"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> collections = lines_with(one.output, "> GRPO collection at iteration");
  ASSERT_EQ(collections.size(), 2u) << one.output;
  const std::vector<std::string> evals = lines_with(one.output, "_eval_mean_");
  ASSERT_EQ(evals.size(), 9u) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--use-distributed-optimizer"},
        std::vector<std::string>{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads"},
        std::vector<std::string>{"--use-custom-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"},
        std::vector<std::string>{"--use-torch-fsdp2"}}) {
    const std::string name = layout.back();
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << name << two.output;
    EXPECT_EQ(collections, lines_with(two.output, "> GRPO collection at iteration")) << name;
    EXPECT_EQ(evals, lines_with(two.output, "_eval_mean_")) << name;
    expect_same_logged_values(one, two, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"}, name);
  }
}

// --calculate-per-token-loss (Megatron's schedule keeps each micro-batch's masked sum and
// finalize_model_grads divides the gradients by the global batch's tokens): every token weighs the
// same however the rows are cut, so micro-batches of 2 train as the whole global batch in one
// micro-batch (where the token mean is the same loss) on one process and at DP 2, PP 2 (the count
// broadcast from the loss stage) and CP 2; without it micro-batches of 2 average their token means.
TEST(GalePretrainGrpo, PerTokenLossIsIndependentOfTheMicroBatches) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags = rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--grpo-iterations", "2"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult whole = run_layout(flags, {"--micro-batch-size", "8"}, 1);
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const test::RunResult mean = run_layout(flags, {}, 1);
  ASSERT_EQ(mean.exit_code, 0) << mean.output;
  const std::vector<double> a = logged_values(whole.output, "grad norm"), b = logged_values(mean.output, "grad norm");
  ASSERT_EQ(a.size(), 4u) << whole.output;
  ASSERT_EQ(b.size(), 4u) << mean.output;
  EXPECT_GT(std::abs(a[0] - b[0]), 1e-3) << "micro-batches of unequal token counts weigh their tokens unequally";
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--micro-batch-size", "8"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2"}}) {
    std::vector<std::string> l = layout;
    l.push_back("--calculate-per-token-loss");
    const bool one = layout.empty() || layout[0] == "--micro-batch-size";
    const test::RunResult r = run_layout(flags, l, one ? 1 : 2);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    expect_same_logged_values(whole, r, {"grad norm", "lm loss", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"},
                              layout.empty() ? "mbs 2" : layout[0]);
  }
  // ... and at DP 2.
  std::vector<std::string> dp = flags;
  dp.push_back("--calculate-per-token-loss");
  const test::RunResult r = run_layout(dp, {}, 2);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_same_logged_values(whole, r, {"grad norm", "lm loss", "rl/kl_term"}, "DP 2");
}

// --overlap-param-gather with the distributed optimizer: the stepped parameters' all-gathers are
// still pending when the next collection starts; the rollouts must see them. DP 2 (the policy
// generates: its decoding forwards wait in their hooks) and TP 2 x DP 2 (the whole-model copy is refit
// after the pending gathers complete) train as the same layouts without the overlap, evaluations
// included, over two collections.
TEST(GalePretrainGrpo, OverlapParamGatherRolloutsSeeTheGatheredParameters) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--train-iters", "8", "--eval-iters", "1", "--eval-interval", "4", "--rl-prompts-per-eval", "2",
               "--make-vocab-size-divisible-by", "8", "--use-distributed-optimizer"});
  flags.erase(flags.begin());  // the binary
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--tensor-model-parallel-size", "2"}}) {
    const int np = layout.empty() ? 2 : 4;
    const std::string name = layout.empty() ? "DP 2" : "TP 2 x DP 2";
    const test::RunResult plain = run_layout(flags, layout, np);
    ASSERT_EQ(plain.exit_code, 0) << plain.output;
    const std::vector<std::string> collections = lines_with(plain.output, "> GRPO collection at iteration");
    ASSERT_EQ(collections.size(), 2u) << plain.output;
    std::vector<std::string> overlap = layout;
    overlap.insert(overlap.end(), {"--overlap-param-gather", "--overlap-grad-reduce"});
    const test::RunResult r = run_layout(flags, overlap, np);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(collections, lines_with(r.output, "> GRPO collection at iteration")) << name;
    EXPECT_EQ(lines_with(plain.output, "_eval_mean_"), lines_with(r.output, "_eval_mean_")) << name;
    expect_same_logged_values(plain, r, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old"}, name);
  }
}

// --exit-interval 4 (a collection boundary): the run saves and exits after iteration 4, as the
// uninterrupted run trained to there and without the evaluation after training (Megatron exits
// from the loop); resumed with --load, it trains iterations 5-8 as the uninterrupted run (the
// reference model from --pretrained-checkpoint in all of them, as a resumed run needs).
TEST(GalePretrainGrpo, ExitIntervalSavesAndExitsAtACollectionBoundary) {
  TempDir dir;
  const std::string env = write_env(dir);
  const std::string ckpt = dir.file("ckpt"), pretrained = dir.file("pretrained");
  const test::RunResult first = gale(rl(env, {"--train-iters", "4", "--save", pretrained, "--save-interval", "4"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "8", "--eval-iters", "1", "--eval-interval", "8",
                               "--rl-prompts-per-eval", "2", "--pretrained-checkpoint", pretrained});
    return gale(rl(env, extra));
  };
  const test::RunResult straight = run({});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const test::RunResult exited = run({"--exit-interval", "4", "--save", ckpt, "--save-interval", "8"});
  ASSERT_EQ(exited.exit_code, 0) << exited.output;
  EXPECT_NE(exited.output.find("[exiting program at iteration 4] datetime:"), std::string::npos) << exited.output;
  EXPECT_EQ(testing::read_file(ckpt + "/latest_checkpointed_iteration.txt"), "4");
  EXPECT_TRUE(lines_with(exited.output, "_eval_mean_").empty()) << exited.output;
  const std::vector<std::string> all = lines_with(straight.output, "| consumed samples:");
  ASSERT_EQ(all.size(), 8u) << straight.output;
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + 4), lines_with(exited.output, "| consumed samples:"));
  const test::RunResult resumed = run({"--load", ckpt});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(std::vector<std::string>(all.begin() + 4, all.end()), lines_with(resumed.output, "| consumed samples:"));
  EXPECT_EQ(lines_with(straight.output, "_eval_mean_"), lines_with(resumed.output, "_eval_mean_"));
}

// --async-save with --non-persistent-save-interval 4 (global): the run trains as the one without
// checkpoints, the non-persistent checkpoint falls at the collection boundary (iteration 4) and the
// persistent one at the end, both finalised (their trackers written); resumed from the non-persistent
// one, the run trains iterations 5-8 as the uninterrupted run.
TEST(GalePretrainGrpo, AsyncAndNonPersistentSavesResumeAtACollectionBoundary) {
  TempDir dir;
  const std::string env = write_env(dir);
  const std::string ckpt = dir.file("ckpt"), pretrained = dir.file("pretrained");
  const test::RunResult first = gale(rl(env, {"--train-iters", "4", "--save", pretrained, "--save-interval", "4"}));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--train-iters", "8", "--pretrained-checkpoint", pretrained});
    return gale(rl(env, extra));
  };
  const test::RunResult straight = run({});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const test::RunResult saved = run({"--save", ckpt, "--save-interval", "8", "--non-persistent-save-interval", "4",
                                     "--non-persistent-ckpt-type", "global", "--async-save"});
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const std::vector<std::string> all = lines_with(straight.output, "| consumed samples:");
  ASSERT_EQ(all.size(), 8u) << straight.output;
  EXPECT_EQ(all, lines_with(saved.output, "| consumed samples:"));
  EXPECT_NE(saved.output.find("saving checkpoint at iteration       4 to " + ckpt + "/non_persistent"),
            std::string::npos) << saved.output;
  EXPECT_EQ(testing::read_file(ckpt + "/non_persistent/latest_checkpointed_iteration.txt"), "4");
  EXPECT_EQ(testing::read_file(ckpt + "/latest_checkpointed_iteration.txt"), "8");
  const test::RunResult resumed = run({"--load", ckpt + "/non_persistent"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(std::vector<std::string>(all.begin() + 4, all.end()), lines_with(resumed.output, "| consumed samples:"));
}

// --train-samples 24 at --global-batch-size 4 (Megatron's update_train_iters: 24 // 4 = 6 iterations,
// the learning rate decayed over 24 samples) trains as --train-iters 6.
TEST(GalePretrainGrpo, TrainSamplesTrainsAsTheEquivalentIterations) {
  TempDir dir;
  const std::string env = write_env(dir);
  const test::RunResult iters = gale(rl(env, {}));
  ASSERT_EQ(iters.exit_code, 0) << iters.output;
  std::vector<std::string> argv = rl(env, {"--train-samples", "24"});
  const auto it = std::find(argv.begin(), argv.end(), "--train-iters");
  argv.erase(it, it + 2);
  const test::RunResult samples = gale(argv);
  ASSERT_EQ(samples.exit_code, 0) << samples.output;
  const std::vector<std::string> lines = lines_with(iters.output, "| consumed samples:");
  ASSERT_EQ(lines.size(), 6u) << iters.output;
  EXPECT_EQ(lines, lines_with(samples.output, "| consumed samples:"));
}

// --bf16 --reuse-fp32-param (MindSpeed: the f32 masters stored as their bf16 copy + a residual, bit
// for bit): GRPO trains as --bf16 alone, on one process (the policy generates from its split storage)
// and at PP 2 (the whole-model copy refit from the merged values).
TEST(GalePretrainGrpo, ReuseFp32ParamTrainsAsBf16) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags = rl(env, {"--train-iters", "4", "--global-batch-size", "8", "--bf16"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult bf16 = run_layout(flags, {}, 1);
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::vector<std::string> lines = lines_with(bf16.output, "| consumed samples:");
  ASSERT_EQ(lines.size(), 4u) << bf16.output;
  const test::RunResult reuse = run_layout(flags, {"--reuse-fp32-param"}, 1);
  ASSERT_EQ(reuse.exit_code, 0) << reuse.output;
  EXPECT_EQ(lines, lines_with(reuse.output, "| consumed samples:"));
  const test::RunResult pp = run_layout(flags, {"--reuse-fp32-param", "--pipeline-model-parallel-size", "2"}, 2);
  ASSERT_EQ(pp.exit_code, 0) << pp.output;
  EXPECT_EQ(lines_with(bf16.output, "> GRPO collection"), lines_with(pp.output, "> GRPO collection"));
  expect_same_logged_values(bf16, pp, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"}, "PP 2");
}

// A LoRA policy (adapters on all four linears; the base frozen): DP 2 and TP 2 (the whole-model
// copy holds the adapters, refit from their shards) train as one process; resumed from trained
// adapters (--lora-load), the reference is the policy with its adapters merged (W + s·B·A), so the
// first iteration's KL is 0 up to rounding (the unmerged base would be far from it).
TEST(GalePretrainGrpo, LoraPolicyTrainsItsAdapters) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "--lora-r", "4",
               "--lora-alpha", "8", "--lr-decay-style", "constant", "--make-vocab-size-divisible-by", "8",
               "--train-iters", "4", "--global-batch-size", "8"});
  flags.erase(flags.begin());  // the binary
  const std::string adapters = dir.file("adapters");
  const test::RunResult one = run_layout(flags, {"--save", adapters, "--save-interval", "4"}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(lines_with(one.output, "| consumed samples:").size(), 4u) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--tensor-model-parallel-size", "2"}}) {
    const std::string name = layout.empty() ? "DP 2" : "TP 2";
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(lines_with(one.output, "> GRPO collection"), lines_with(two.output, "> GRPO collection")) << name;
    expect_same_logged_values(one, two, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"}, name);
  }
  std::vector<std::string> resume = flags;
  resume.insert(resume.end(), {"--train-iters", "8", "--lora-load", adapters});
  const test::RunResult resumed = run_layout(resume, {}, 1);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<std::string> log = lines_with(resumed.output, "| consumed samples:");
  ASSERT_EQ(log.size(), 4u) << resumed.output;
  EXPECT_NE(log[0].find("iteration        5/"), std::string::npos) << log[0];
  const std::vector<double> kl = logged_values(resumed.output, "rl/kl_term");
  ASSERT_FALSE(kl.empty()) << resumed.output;
  if (log[0].find("rl/kl_term") != std::string::npos) EXPECT_LT(kl[0], 1e-10) << log[0];
  EXPECT_GT(kl.back(), 1e-6) << "the adapters moved away from the reference";
}

// An MTP policy (--mtp-num-layers 1): as Megatron's RL forward (no labels, no loss mask) the MTP loss
// over every position with a rolled label joins the GRPO loss, scaled by --mtp-loss-scaling-factor,
// and is logged as "mtp_1 loss". Factor 0 trains as the policy without MTP layers (their loss
// logged, no gradient); factor 0.3 moves the gradient, and DP 2 and PP 2 (the MTP layer on the last
// stage) reproduce one process.
TEST(GalePretrainGrpo, MtpPolicyAddsTheMtpLoss) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags = rl(env, {"--train-iters", "4", "--global-batch-size", "8"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult plain = run_layout(flags, {}, 1);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const test::RunResult zero = run_layout(flags, {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0"}, 1);
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  expect_same_logged_values(plain, zero, {"grad norm", "rl/entropy_term", "rl/pi_over_pi_old", "rl/kl_term"}, "factor 0");
  const std::vector<double> mtp0 = logged_values(zero.output, "mtp_1 loss");
  ASSERT_EQ(mtp0.size(), 4u) << zero.output;
  for (double v : mtp0) EXPECT_GT(v, 1.0);  // cross-entropy over a padded vocabulary of 128 at start: about ln 128
  std::vector<std::string> mtp = {"--mtp-num-layers", "1", "--mtp-loss-scaling-factor", "0.3"};
  const test::RunResult one = run_layout(flags, mtp, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  EXPECT_NEAR(logged_values(one.output, "mtp_1 loss").at(0), mtp0[0], 1e-6);  // the same first forward
  EXPECT_GT(std::abs(logged_values(one.output, "grad norm").at(0) - logged_values(plain.output, "grad norm").at(0)), 1e-2);
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{}, std::vector<std::string>{"--pipeline-model-parallel-size", "2"}}) {
    std::vector<std::string> l = mtp;
    l.insert(l.end(), layout.begin(), layout.end());
    const std::string name = layout.empty() ? "DP 2" : "PP 2";
    const test::RunResult two = run_layout(flags, l, 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(lines_with(one.output, "> GRPO collection"), lines_with(two.output, "> GRPO collection")) << name;
    expect_same_logged_values(one, two, {"grad norm", "mtp_1 loss", "rl/pi_over_pi_old", "rl/kl_term"}, name);
  }
}

// A MoE policy (4 experts, top-2, aux and z losses): expert parallelism 2 (the EP ranks decode the rollouts
// in lockstep through the experts' all-to-all), TP 2 + SP and TP 2 + SP with EP 2 (ETP 1; the whole-model
// copy holds every expert, gathered over EP) reproduce one process, the log line carries Megatron's load_balancing_loss and z_loss entries, and
// the auxiliary loss's gradient reaches the parameters (another coefficient, another gradient norm).
TEST(GalePretrainGrpo, MoeWithExpertAndTensorParallelismReproducesOneProcess) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--train-iters", "2", "--global-batch-size", "8", "--grpo-iterations", "1", "--num-experts", "4",
               "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01", "--moe-z-loss-coeff", "0.001",
               "--moe-grouped-gemm", "--make-vocab-size-divisible-by", "8"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<double> balancing = logged_values(one.output, "load_balancing_loss");
  ASSERT_EQ(balancing.size(), 2u) << one.output;
  EXPECT_GT(balancing[0], 0.5);  // ~1 for balanced routing (Megatron's normalisation)
  ASSERT_EQ(logged_values(one.output, "z_loss").size(), 2u) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--expert-model-parallel-size", "2"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
        std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                 "--expert-model-parallel-size", "2", "--expert-tensor-parallel-size", "1"}}) {
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(lines_with(one.output, "> GRPO collection at iteration"),
              lines_with(two.output, "> GRPO collection at iteration")) << layout[0];
    expect_same_logged_values(one, two, {"lm loss", "grad norm", "rl/kl_term", "load_balancing_loss", "z_loss"}, layout[0]);
  }
  std::vector<std::string> strong = flags;
  strong[std::find(strong.begin(), strong.end(), "--moe-aux-loss-coeff") - strong.begin() + 1] = "0.5";
  const test::RunResult aux = run_layout(strong, {}, 1);
  ASSERT_EQ(aux.exit_code, 0) << aux.output;
  EXPECT_EQ(logged_values(aux.output, "lm loss")[0], logged_values(one.output, "lm loss")[0]);
  EXPECT_GT(std::abs(logged_values(aux.output, "grad norm")[0] - logged_values(one.output, "grad norm")[0]), 1e-3);
}

// A hybrid Mamba policy (--is-hybrid-model, "M*-M": Mamba, attention, MLP, Mamba): its rollouts decode
// with per-request Mamba states, and TP 2 + SP, PP 2 and CP 2 reproduce one process.
TEST(GalePretrainGrpo, HybridMambaPolicyReproducesOneProcessAcrossLayouts) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> flags =
      rl(env, {"--train-iters", "2", "--global-batch-size", "8", "--grpo-iterations", "1", "--num-layers", "4",
               "--is-hybrid-model", "--hybrid-override-pattern", "M*-M", "--mamba-state-dim", "16",
               "--mamba-head-dim", "16", "--mamba-num-groups", "2", "--normalization", "RMSNorm",
               "--position-embedding-type", "none", "--make-vocab-size-divisible-by", "8"});
  flags.erase(flags.begin());  // the binary
  const test::RunResult one = run_layout(flags, {}, 1);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const std::vector<std::string> collections = lines_with(one.output, "> GRPO collection at iteration");
  ASSERT_EQ(collections.size(), 2u) << one.output;
  for (const std::vector<std::string>& layout :
       {std::vector<std::string>{"--tensor-model-parallel-size", "2", "--sequence-parallel"},
        std::vector<std::string>{"--pipeline-model-parallel-size", "2"},
        std::vector<std::string>{"--context-parallel-size", "2"}}) {
    const test::RunResult two = run_layout(flags, layout, 2);
    ASSERT_EQ(two.exit_code, 0) << two.output;
    EXPECT_EQ(collections, lines_with(two.output, "> GRPO collection at iteration")) << layout[0];
    expect_same_logged_values(one, two, {"grad norm", "rl/kl_term", "rl/entropy_term"}, layout[0]);
  }
}

// --fp16: every backward starts from the loss scale (with the 1 / micro-batches) and the optimizer
// unscales: with a static --loss-scale 1024 the gradient norms are the fp32 run's within fp16's
// rounding; the dynamic scaler (initial 2^32) skips the overflowing first step and halves its scale,
// as in pretraining.
TEST(GalePretrainGrpo, Fp16ScalesTheLossAndUnscalesTheGradients) {
  TempDir dir;
  const std::string env = write_env(dir);
  const test::RunResult fp32 = gale(rl(env, {"--train-iters", "4"}));
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const test::RunResult fp16 = gale(rl(env, {"--train-iters", "4", "--fp16", "--loss-scale", "1024"}));
  ASSERT_EQ(fp16.exit_code, 0) << fp16.output;
  const std::vector<double> a = logged_values(fp32.output, "grad norm"), b = logged_values(fp16.output, "grad norm");
  ASSERT_EQ(a.size(), 4u) << fp32.output;
  ASSERT_EQ(b.size(), 4u) << fp16.output;
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i], 1e-2 * a[i]) << i;
  EXPECT_EQ(logged_values(fp16.output, "loss scale"), std::vector<double>(4, 1024.0));
  const test::RunResult dynamic = gale(rl(env, {"--train-iters", "2", "--fp16"}));
  ASSERT_EQ(dynamic.exit_code, 0) << dynamic.output;
  const std::vector<std::string> log = lines_with(dynamic.output, "| consumed samples:");
  ASSERT_EQ(log.size(), 2u) << dynamic.output;
  // Megatron's hysteresis 2: the scale halves at the second consecutive overflow; no grad norm is printed.
  EXPECT_NE(log[0].find("loss scale: 4294967296.0 | number of skipped iterations:   1 |"), std::string::npos) << log[0];
  EXPECT_NE(log[1].find("loss scale: 2147483648.0 | number of skipped iterations:   1 |"), std::string::npos) << log[1];
}

// A run saved at iteration 8 (a collection boundary) and resumed from it logs iterations 9-12 and
// the collection at 8 exactly as the uninterrupted run; both take their reference model from
// --pretrained-checkpoint (a GRPO run of 4 iterations), as Megatron.
TEST(GalePretrainGrpo, ResumesAtACollectionBoundary) {
  TempDir dir;
  const std::string env = write_env(dir);
  const std::string a = dir.file("a"), b = dir.file("b");
  // A constant learning rate: the 8-iteration run's schedule is the 12-iteration run's.
  auto run = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), {"--lr-decay-style", "constant"});
    return gale(rl(env, extra));
  };
  const test::RunResult first = run({"--train-iters", "4", "--save", a, "--save-interval", "4"});
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const test::RunResult straight = run({"--train-iters", "12", "--pretrained-checkpoint", a});
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  EXPECT_NE(straight.output.find("GRPO reference model loaded from --pretrained-checkpoint " + a), std::string::npos);
  const test::RunResult part1 = run({"--train-iters", "8", "--pretrained-checkpoint", a, "--save", b, "--save-interval", "4"});
  ASSERT_EQ(part1.exit_code, 0) << part1.output;
  const test::RunResult part2 = run({"--train-iters", "12", "--pretrained-checkpoint", a, "--load", b});
  ASSERT_EQ(part2.exit_code, 0) << part2.output;
  const std::vector<std::string> all = lines_with(straight.output, "| consumed samples:");
  const std::vector<std::string> resumed = lines_with(part2.output, "| consumed samples:");
  ASSERT_EQ(resumed.size(), 4u) << part2.output;
  ASSERT_GE(all.size(), 4u) << straight.output;
  EXPECT_EQ(std::vector<std::string>(all.end() - 4, all.end()), resumed);
  const std::vector<std::string> collections = lines_with(straight.output, "> GRPO collection at iteration 8:");
  ASSERT_EQ(collections.size(), 1u) << straight.output;
  EXPECT_EQ(collections, lines_with(part2.output, "> GRPO collection at iteration 8:"));
}

// --rl-inference-logprobs-is-correction: the sampler's log-probabilities equal π_old's up to float
// rounding (the same policy, KV cache against a full forward), so the weight is about 1 and the run
// follows the plain one; --rl-importance-sampling-truncation-coef 0.5 caps every weight at 0.5, which
// halves iteration 1's gradient (KL 0 and no entropy term there: the policy term is all of it).
// --use-same-sampling-seed-across-dp-ranks is noted and changes nothing; so does --[no-]rl-skip-bos-token
// with a tokenizer that has no BOS (tests/train/grpo_prompt_test.cc has those that do).
TEST(GalePretrainGrpo, ImportanceSamplingCorrectionAndAcceptedFlags) {
  TempDir dir;
  const std::string env = write_env(dir);
  const test::RunResult plain = gale(rl(env, {"--train-iters", "4"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const test::RunResult is = gale(rl(env, {"--train-iters", "4", "--rl-inference-logprobs-is-correction",
                                          "--rl-importance-sampling-truncation-coef", "2"}));
  ASSERT_EQ(is.exit_code, 0) << is.output;
  const test::RunResult half = gale(rl(env, {"--train-iters", "1", "--rl-inference-logprobs-is-correction",
                                            "--rl-importance-sampling-truncation-coef", "0.5"}));
  ASSERT_EQ(half.exit_code, 0) << half.output;
  const std::vector<double> g = logged_values(plain.output, "grad norm"), gi = logged_values(is.output, "grad norm"),
                            gh = logged_values(half.output, "grad norm");
  ASSERT_EQ(g.size(), 4u) << plain.output;
  ASSERT_EQ(gi.size(), 4u) << is.output;
  ASSERT_EQ(gh.size(), 1u) << half.output;
  for (size_t i = 0; i < g.size(); ++i) EXPECT_NEAR(gi[i], g[i], 1e-3 * g[i]) << i;
  EXPECT_NEAR(gh[0], 0.5 * g[0], 1e-3 * g[0]);  // the log prints 4 significant digits
  EXPECT_EQ(lines_with(plain.output, "> GRPO collection"), lines_with(is.output, "> GRPO collection"));

  const test::RunResult noted =
      gale(rl(env, {"--train-iters", "4", "--use-same-sampling-seed-across-dp-ranks"}));
  ASSERT_EQ(noted.exit_code, 0) << noted.output;
  EXPECT_NE(noted.output.find("accepted without effect: --use-same-sampling-seed-across-dp-ranks: "),
            std::string::npos);
  EXPECT_EQ(lines_with(plain.output, "| consumed samples:"), lines_with(noted.output, "| consumed samples:"));
  // NullTokenizer has no BOS: Megatron's warning, and --[no-]rl-skip-bos-token changes nothing.
  EXPECT_NE(plain.output.find("Tokenizer has no BOS token so prompt will not have BOS token"), std::string::npos);
  for (const char* flag : {"--rl-skip-bos-token", "--no-rl-skip-bos-token"}) {
    const test::RunResult bos = gale(rl(env, {"--train-iters", "4", flag}));
    ASSERT_EQ(bos.exit_code, 0) << bos.output;
    EXPECT_EQ(lines_with(plain.output, "| consumed samples:"), lines_with(bos.output, "| consumed samples:")) << flag;
  }

  const test::RunResult alone = gale(rl(env, {"--train-iters", "1", "--rl-importance-sampling-truncation-coef", "0.5"}));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  EXPECT_NE(alone.output.find("--rl-importance-sampling-truncation-coef: no effect without "
                              "--rl-inference-logprobs-is-correction"),
            std::string::npos)
      << alone.output;
  EXPECT_EQ(logged_values(alone.output, "grad norm"), std::vector<double>{g[0]});
}

// --rl-prompts-per-eval: Megatron's RL evaluation at every --eval-interval and after training when
// --eval-iters > 0 (none with --eval-iters 0, as every other test here runs).
TEST(GalePretrainGrpo, EvaluatesAtTheEvalIntervalAndAfterTraining) {
  TempDir dir;
  const std::string env = write_env(dir, "max_k: 4\n");
  const test::RunResult r =
      gale(rl(env, {"--train-iters", "4", "--eval-iters", "1", "--eval-interval", "2", "--rl-prompts-per-eval", "3"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::vector<std::string> heads = lines_with(r.output, "> GRPO evaluation at iteration");
  ASSERT_EQ(heads.size(), 3u) << r.output;
  EXPECT_NE(heads[0].find("> GRPO evaluation at iteration 2: 3 prompts x 4 samples and 1 greedy completion"),
            std::string::npos) << heads[0];
  EXPECT_NE(heads[1].find("at iteration 4:"), std::string::npos) << heads[1];
  EXPECT_NE(heads[2].find("at iteration 4:"), std::string::npos) << heads[2];
  EXPECT_EQ(heads[1], heads[2]);
  EXPECT_EQ(lines_with(r.output, "Evaluation results:").size(), 3u);
  const std::vector<double> p1 = testing::regex_values(r.output, "\tcontains_eval_mean_pass_at_1: ([0-9.]+)"),
                            p4 = testing::regex_values(r.output, "\tcontains_eval_mean_pass_at_4: ([0-9.]+)"),
                            gr = testing::regex_values(r.output, "\tcontains_eval_mean_greedy_reward: ([0-9.]+)");
  ASSERT_EQ(p1.size(), 3u) << r.output;
  ASSERT_EQ(p4.size(), 3u);
  ASSERT_EQ(gr.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_GE(p4[i], p1[i]);
    EXPECT_LE(p4[i], 1.0);
    EXPECT_NEAR(gr[i] * 3, std::round(gr[i] * 3), 1e-3) << gr[i];  // 3 greedy rewards of 0 or 1
  }
  EXPECT_EQ(p1[1], p1[2]);  // the same policy, the same draws
  // The training lines are the plain run's: evaluation changes nothing.
  const test::RunResult plain = gale(rl(env, {"--train-iters", "4"}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_EQ(lines_with(plain.output, "| consumed samples:"), lines_with(r.output, "| consumed samples:"));
  EXPECT_TRUE(lines_with(plain.output, "Evaluation results:").empty());
}

void expect_usage_error(const std::vector<std::string>& argv, const std::string& message) {
  const test::RunResult r = gale(argv);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("gale pretrain: error: " + message + "\n"), std::string::npos) << r.output;
}

TEST(GalePretrainGrpo, Refusals) {
  TempDir dir;
  const std::string env = write_env(dir);
  std::vector<std::string> no_rl = rl(env, {"--mock-data"});
  no_rl.erase(std::find(no_rl.begin(), no_rl.end(), "--perform-rl-step"));
  expect_usage_error(no_rl, "--grpo-prompts-per-step needs --perform-rl-step");
  std::vector<std::string> no_env = rl(env, {});
  no_env.erase(std::find(no_env.begin(), no_env.end(), "--langrl-env-config"), std::find(no_env.begin(), no_env.end(), env) + 1);
  expect_usage_error(no_env, "--perform-rl-step: expected --langrl-env-config FILE (the environment), found none");
  expect_usage_error(rl(env, {"--global-batch-size", "6", "--micro-batch-size", "2"}),
                     "--global-batch-size: expected a divisor of --grpo-prompts-per-step x --grpo-group-size = 8 "
                     "(each collection trains in whole global batches), found 6");
  expect_usage_error(rl(env, {"--save", dir.file("ckpt"), "--save-interval", "6"}),
                     "--save-interval: expected a multiple of --grpo-iterations x (--grpo-prompts-per-step x "
                     "--grpo-group-size / --global-batch-size) = 4 (a checkpoint falls between rollout collections), "
                     "found 6");
  expect_usage_error(rl(env, {"--exit-interval", "6"}),
                     "--exit-interval: expected a multiple of --grpo-iterations x (--grpo-prompts-per-step x "
                     "--grpo-group-size / --global-batch-size) = 4 (the run exits between rollout collections), found 6");
  expect_usage_error(rl(env, {"--save", dir.file("ckpt"), "--save-interval", "8", "--non-persistent-save-interval", "2",
                              "--non-persistent-ckpt-type", "global"}),
                     "--non-persistent-save-interval: expected a multiple of --grpo-iterations x "
                     "(--grpo-prompts-per-step x --grpo-group-size / --global-batch-size) = 4 (a checkpoint falls "
                     "between rollout collections), found 2");
  std::vector<std::string> rampup = rl(env, {"--rampup-batch-size", "2", "2", "8", "--train-samples", "48"});
  rampup.erase(std::find(rampup.begin(), rampup.end(), "--train-iters"), std::find(rampup.begin(), rampup.end(), "--train-iters") + 2);
  expect_usage_error(rampup,
                     "--perform-rl-step with --rampup-batch-size: not supported (Megatron's RL cuts each collection "
                     "into whole --global-batch-size batches; a ramping batch size does not)");
  expect_usage_error(rl(env, {"--rl-default-top-p", "1.5"}), "--rl-default-top-p: expected a number in [0, 1], found 1.5");
  expect_usage_error(rl(env, {"--rl-importance-sampling-truncation-coef", "0"}),
                     "--rl-importance-sampling-truncation-coef: expected a positive number, found 0");
  // Megatron's RL flags Gale does not run: one line each, naming the flag and why.
  expect_usage_error(rl(env, {"--rl-use-sequence-packing"}),
                     "--rl-use-sequence-packing: micro_batch_size must be 1 when using sequence packing. To increase "
                     "compute per micro batch increase the sequence length. (found --micro-batch-size 2)");
  expect_usage_error(rl(env, {"--rl-use-sequence-packing", "--micro-batch-size", "1", "--rl-sequence-packing-algo",
                              "lifo"}),
                     "--rl-sequence-packing-algo: expected fifo or round-robin, found 'lifo'");
  expect_usage_error({GALE_BINARY, "pretrain", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
                      "--seq-length", "16", "--max-position-embeddings", "16", "--micro-batch-size", "1",
                      "--global-batch-size", "4", "--train-iters", "1", "--vocab-size", "15", "--lr", "1e-3", "--mock-data",
                      "--rl-sequence-packing-max-sequences-per-bin", "4"},
                     "--rl-sequence-packing-max-sequences-per-bin needs --perform-rl-step");
  expect_usage_error(rl(env, {"--rl-prompts-per-eval", "0"}), "--rl-prompts-per-eval: expected a positive number, found 0");
  expect_usage_error(rl(env, {"--rl-offload-optimizer-during-inference"}),
                     "--rl-offload-optimizer-during-inference: not supported yet (GPU memory and CUDA-graph management "
                     "between rollouts and training)");
  expect_usage_error(rl(env, {"--rl-inference-tensor-model-parallel-size", "2"}),
                     "--rl-inference-tensor-model-parallel-size: expected 1 (Gale generates the rollouts with a "
                     "whole-model copy of the policy on each process), found 2");
  expect_usage_error(rl(env, {"--rl-inference-pipeline-model-parallel-size", "2"}),
                     "--rl-inference-pipeline-model-parallel-size: not supported yet (Gale generates the rollouts on "
                     "each process with the policy itself, at TP > 1 with its whole-model copy refit over the TP "
                     "group; there is no separate inference model or server)");
  testing::write_file(env, "environment: regex\ndata: prompts.jsonl\n");
  const test::RunResult bad = gale(rl(env, {}));
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_NE(bad.output.find("gale pretrain: error: --langrl-env-config " + env +
                            ": environment: expected exact_match or contains, found 'regex'"),
            std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace gale
