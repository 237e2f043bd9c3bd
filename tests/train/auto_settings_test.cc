// --auto-settings without running anything: its flags and their errors, the command-line editing,
// the --prof-file format, the model fit on synthetic profiles, and the search on synthetic models
// with a hand-checked optimum (train/auto_settings*.h).
#include "train/auto_settings.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "features/registry.h"
#include "flag_inventory.h"
#include "train/auto_parallel_search.h"
#include "train/auto_settings_model.h"
#include "train/auto_settings_profile.h"
#include "train/auto_settings_search.h"

namespace gale {
namespace {

using testing::FullCli;

Status parse_full(const std::vector<std::string>& extra) {
  FullCli cli;
  GALE_RETURN_IF_ERROR(cli.parse_minimal(extra));
  std::vector<std::string> notices;
  return cli.registry->resolve(make_feature_context(cli.args, cli.parser, *cli.registry), &notices);
}

TEST(AutoSettingsFlags, AcceptedAndActive) {
  FullCli cli;
  ASSERT_TRUE(cli.parse_minimal({"--auto-settings", "--auto-settings-ranks", "16", "--target-nnodes", "2",
                                 "--auto-settings-work-dir", "w", "--nproc-per-node", "4", "--auto-settings-type",
                                 "white", "--auto-settings-log-level", "debug"})
                  .ok());
  std::vector<std::string> notices;
  ASSERT_TRUE(cli.registry->resolve(make_feature_context(cli.args, cli.parser, *cli.registry), &notices).ok());
  EXPECT_TRUE(cli.registry->active("auto-settings"));
  EXPECT_EQ(cli.args.auto_settings.auto_settings_ranks, 16);
  EXPECT_EQ(cli.args.auto_settings.target_nnodes, 2);
  EXPECT_EQ(cli.args.auto_settings.nproc_per_node, 4);
  ASSERT_TRUE(parse_full({"--prof-file", "p.json"}).ok());
}

TEST(AutoSettingsFlags, ErrorsNameTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--target-nnodes", "2"}, "--target-nnodes: only with --auto-settings"},
      {{"--auto-settings-ranks", "16"}, "--auto-settings-ranks: only with --auto-settings"},
      {{"--nproc-per-node", "2"}, "--nproc-per-node: only with --auto-settings"},
      {{"--auto-settings", "--auto-settings-type", "black"}, "--auto-settings-type black: not supported yet"},
      {{"--auto-settings", "--auto-settings-type", "mixed"}, "--auto-settings-type mixed: not supported yet"},
      {{"--auto-settings", "--auto-settings-type", "grey"}, "--auto-settings-type"},
      {{"--auto-settings", "--auto-settings-ranks", "0"}, "--auto-settings-ranks: expected a positive number of ranks, found 0"},
      {{"--auto-settings", "--auto-settings-ranks", "12", "--target-nnodes", "5"},
       "--target-nnodes: expected a divisor of --auto-settings-ranks 12 (ranks per node), found 5"},
      {{"--auto-settings", "--nproc-per-node", "0"}, "--nproc-per-node: expected a positive number of local ranks, found 0"},
      {{"--auto-settings", "--auto-settings-inter-node-bandwidth-ratio", "1.5"},
       "--auto-settings-inter-node-bandwidth-ratio: expected a fraction in (0, 1], found 1.5"},
      {{"--auto-settings", "--auto-settings-memory-limit-gib", "-1"}, "--auto-settings-memory-limit-gib: expected a non-negative size"},
      {{"--auto-settings", "--prof-file", "p.json"}, "--prof-file: conflicts with --auto-settings"},
      {{"--auto-parallel", "--prof-file", "p.json"}, "--prof-file: conflicts with --auto-parallel"},
      {{"--auto-parallel", "--auto-settings"}, "--auto-parallel: conflicts with --auto-settings"},
      {{"--nnodes", "2"}, "--nnodes: only with --auto-parallel"},
      {{"--auto-settings", "--nnodes", "2"}, "--nnodes: only with --auto-parallel"},
      {{"--auto-parallel", "--target-nnodes", "2"}, "--target-nnodes: only with --auto-settings"},
      {{"--auto-parallel", "--nnodes", "0"}, "--nnodes: expected a positive number of nodes, found 0"},
      {{"--auto-parallel", "--auto-parallel-max-trials", "0"},
       "--auto-parallel-max-trials: expected a positive number of runs, found 0"},
      {{"--auto-settings-work-dir", "w"}, "--auto-settings-work-dir: only with --auto-settings or --auto-parallel"},
  };
  for (const auto& [flags, expected] : cases) {
    SCOPED_TRACE(flags[flags.size() > 1 ? 1 : 0]);
    const Status st = parse_full(flags);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(expected), std::string::npos) << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.message();
  }
}

TEST(AutoSettingsArgv, RemoveSetAndQuote) {
  std::vector<std::string> t = {"--num-layers", "8", "--data-path", "0.3", "a", "0.7", "b", "--save=ck", "--swiglu",
                                "--save", "x"};
  remove_flag(t, "--data-path");
  remove_flag(t, "--save");
  EXPECT_EQ(t, (std::vector<std::string>{"--num-layers", "8", "--swiglu"}));
  set_flag(t, "--num-layers", "2");
  EXPECT_EQ(t, (std::vector<std::string>{"--swiglu", "--num-layers", "2"}));
  EXPECT_EQ(shell_join({"gale", "--data-path", "my data", "it's"}), "gale --data-path 'my data' 'it'\\''s'");
}

RunProfile synthetic_profile(int64_t tp, int64_t cp, int64_t layers) {
  // Per rank: 1000·layers/tp + 500/tp params, 16 bytes each plus 64; transient 300·layers/(tp·cp)
  // + 100.
  RunProfile p;
  p.world_size = tp * cp;
  p.tp = tp;
  p.cp = cp;
  p.num_layers = layers;
  p.micro_batch_size = 1;
  p.global_batch_size = 2;
  p.num_micro_batches = 2;
  p.seq_length = 16;
  p.hidden_size = 8;
  p.measured_iterations = 2;
  const int64_t d = tp * cp;
  const int64_t params = (1000 * layers + 500) / tp;
  const int64_t persistent = 16 * params + 64;
  for (int64_t r = 0; r < p.world_size; ++r) {
    p.param_elems.push_back(params);
    p.persistent_bytes.push_back(persistent);
    p.peak_bytes.push_back(persistent + 300 * layers / d + 100);
  }
  // Megatron's FLOPs: 2e8 per layer and micro-batch, 5e7 fixed, at 1e9 FLOP/s; with d > 1 the
  // ranks pass 1e7 bytes per layer and micro-batch and 1e6 fixed to their TP or CP group at 1e8 B/s.
  p.flops_per_iteration = 2 * (2e8 * static_cast<double>(layers) + 5e7);
  const double bytes = d > 1 ? 2 * (1e7 * static_cast<double>(layers) + 1e6) : 0.0;
  (tp > 1 ? p.tp_comm_bytes : p.cp_comm_bytes) = static_cast<int64_t>(bytes);
  p.forward_backward_seconds = p.flops_per_iteration / static_cast<double>(d) / 1e9 + bytes / 1e8;
  p.optimizer_seconds = 1e-6 * static_cast<double>(params);
  p.step_seconds = p.forward_backward_seconds + p.optimizer_seconds;
  return p;
}

TEST(AutoSettingsProfile, JsonRoundTripAndErrors) {
  const RunProfile p = synthetic_profile(2, 1, 2);
  StatusOr<RunProfile> back = profile_from_json(profile_to_json(p));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back.value().peak_bytes, p.peak_bytes);
  EXPECT_EQ(back.value().param_elems, p.param_elems);
  EXPECT_EQ(back.value().tp, 2);
  EXPECT_DOUBLE_EQ(back.value().forward_backward_seconds, p.forward_backward_seconds);
  std::string text = profile_to_json(p);
  std::string bad_magic = text;
  bad_magic.replace(bad_magic.find("gale-profile"), 12, "gale-profilX");
  EXPECT_NE(profile_from_json(bad_magic).status().message().find("expected magic \"gale-profile\""), std::string::npos);
  std::string bad_version = text;
  bad_version.replace(bad_version.find("\"version\": 1"), 12, "\"version\": 7");
  EXPECT_NE(profile_from_json(bad_version).status().message().find("expected version 1, found 7"), std::string::npos);
  EXPECT_FALSE(profile_from_json("{").ok());
}

TEST(AutoSettingsModel, FitSplit) {
  const SplitFit f = fit_split({{1, 10}, {2, 6}, {4, 4}});  // 2 + 8 / d
  EXPECT_NEAR(f.alpha, 2.0, 1e-9);
  EXPECT_NEAR(f.beta, 8.0, 1e-9);
  const SplitFit g = fit_split({{2, 6}});  // one degree: everything splits
  EXPECT_NEAR(g.alpha, 0.0, 1e-12);
  EXPECT_NEAR(g.beta, 12.0, 1e-9);
}

TEST(AutoSettingsModel, FitRecoversTheSyntheticProfiles) {
  std::vector<RunProfile> profiles;
  for (auto [tp, cp] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 1}, {1, 2}})
    for (int64_t layers : {1, 2}) profiles.push_back(synthetic_profile(tp, cp, layers));
  AutoTarget target;
  target.num_layers = 8;
  target.global_batch_size = 2;
  target.seq_length = 16;
  target.hidden_size = 8;
  target.ranks_per_node = 8;
  StatusOr<AutoModels> m = fit_auto_models(profiles, target);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_NEAR(m.value().bytes_per_param, 16.0, 1e-9);
  EXPECT_NEAR(m.value().persistent_intercept, 64.0, 1e-6);
  EXPECT_NEAR(m.value().layer_seconds_1, 0.2, 1e-9);
  EXPECT_NEAR(m.value().layer_params.at(4), 250.0, 1e-6);
  EXPECT_NEAR(m.value().layer_activation.at(4), 75.0, 1e-6);
  // Memory of an unprofiled layout, by hand: TP 4, PP 2, DP 1, 2 micro-batches, 4 layers a stage:
  // params 4·250 + 500/4 = 1125 (tied: the first stage keeps the embedding part), persistent
  // 16·1125 + 64, activations 4 layers · 2 in flight · 75 + 100 (the synthetic fixed part does not split).
  const AutoPrediction p = predict(m.value(), AutoLayout{4, 1, 2, 1});
  EXPECT_NEAR(p.persistent_bytes, 16.0 * 1125 + 64, 1e-6);
  EXPECT_NEAR(p.peak_bytes, 16.0 * 1125 + 64 + 4 * 2 * 75 + 100, 1e-6);
  // Time: the rate and the bandwidth come back, and a TP 2 layout by hand: 2 micro-batches of
  // 8 layers · (2e8 / 2 / 1e9 s + 1e7 B / 1e8 B/s) + (5e7 / 2 / 1e9 + 1e6 / 1e8), plus the
  // optimizer: 1e-6 s · (8000 + 500) / 2 parameters.
  EXPECT_NEAR(m.value().flops_per_second, 1e9, 1e-3);
  EXPECT_NEAR(m.value().intra_bandwidth, 1e8, 1e-3);
  const AutoPrediction t = predict(m.value(), AutoLayout{2, 1, 1, 1});
  EXPECT_NEAR(t.step_seconds, 2 * (8 * (0.1 + 0.1) + (0.025 + 0.01)) + 1e-6 * 4250, 1e-9);
  // With a PP 2 run (one layer a stage, 2 micro-batches): the first stage holds 300 of the 500
  // fixed parameters and 40 of the 100 fixed activation bytes beyond its 2 layers in flight, the
  // last 250 and 80 beyond its one. PP 2 of 8 layers, 2 micro-batches: both in flight at the first.
  RunProfile staged = synthetic_profile(1, 1, 2);
  staged.pp = 2;
  staged.world_size = 2;
  staged.param_elems = {1000 + 300, 1000 + 250};
  staged.persistent_bytes = {16 * 1300 + 64, 16 * 1250 + 64};
  staged.peak_bytes = {16 * 1300 + 64 + 2 * 300 + 40, 16 * 1250 + 64 + 300 + 80};
  std::vector<RunProfile> with_staged = profiles;
  with_staged.push_back(staged);
  StatusOr<AutoModels> ms = fit_auto_models(with_staged, target);
  ASSERT_TRUE(ms.ok()) << ms.status().message();
  EXPECT_TRUE(ms.value().stage_shares);
  EXPECT_NEAR(ms.value().first_param_share, 0.6, 1e-9);
  EXPECT_NEAR(ms.value().last_activation_share, 0.8, 1e-9);
  const AutoPrediction staged_peak = predict(ms.value(), AutoLayout{1, 1, 2, 1});
  const double first = 16.0 * (4 * 1000 + 300) + 64 + 4 * 2 * 300 + 40;
  const double last = 16.0 * (4 * 1000 + 250) + 64 + 4 * 300 + 80;
  EXPECT_NEAR(staged_peak.peak_bytes, std::max(first, last), 1e-6);
  EXPECT_FALSE(m.value().stage_shares);  // without it: the conservative rule
  EXPECT_NEAR(predict(m.value(), AutoLayout{1, 1, 2, 1}).peak_bytes, 16.0 * (4 * 1000 + 500) + 64 + 4 * 2 * 300 + 100,
              1e-6);
  // No profile lacks the TP = CP = 1 pair.
  profiles.erase(profiles.begin(), profiles.begin() + 2);
  EXPECT_NE(fit_auto_models(profiles, target).status().message().find("at tensor- and context-parallel size 1"),
            std::string::npos);
}

// Hand-made models: 8 layers of 1e4 parameters (split over TP, 16 bytes each) and 1e6 activation
// bytes (split over TP·CP), 1 s of compute per layer and micro-batch (split over TP·CP), 1e9 bytes of
// TP/CP traffic per layer at d = 2 over 1e10 B/s within a node, a tenth of it across nodes.
AutoModels hand_models(int64_t ranks_per_node) {
  AutoModels m;
  m.layer_params = {0.0, 1e4};
  m.layer_activation = {0.0, 1e6};
  m.bytes_per_param = 16.0;
  m.layer_seconds_1 = 1.0;
  m.layer_comm_bytes = 1e9;
  m.intra_bandwidth = 1e10;
  m.bandwidth_measured = true;
  m.target.num_layers = 8;
  m.target.micro_batch_size = 1;
  m.target.global_batch_size = 8;
  m.target.seq_length = 64;
  m.target.hidden_size = 64;
  m.target.ranks_per_node = ranks_per_node;
  m.target.inter_node_bandwidth_ratio = 0.1;
  return m;
}

AutoSearchSpace hand_space() {
  AutoSearchSpace s;
  s.world_size = 8;
  s.num_layers = 8;
  s.num_attention_heads = 8;
  s.num_query_groups = 8;
  s.ffn_hidden_size = 256;
  s.seq_length = 64;
  s.micro_batch_size = 1;
  s.global_batch_size = 8;
  s.memory_limit_bytes = 6e6;
  return s;
}

const AutoCandidate* find(const std::vector<AutoCandidate>& v, AutoLayout l) {
  for (const AutoCandidate& c : v)
    if (c.layout.tp == l.tp && c.layout.cp == l.cp && c.layout.pp == l.pp) return &c;
  return nullptr;
}

TEST(AutoSettingsSearch, HandCheckedOptimum) {
  const AutoModels m = hand_models(4);  // 2 nodes of 4
  const AutoSearchResult r = search_layouts(m, hand_space());
  // DP 8: 1 micro-batch of 8 layers · 1 s = 8 s, the fastest, but 16·8e4 + 8e6 = 9.28e6 bytes > 6e6.
  const AutoCandidate* dp8 = find(r.over_memory, {1, 1, 1, 8});
  ASSERT_NE(dp8, nullptr);
  EXPECT_NEAR(dp8->prediction.step_seconds, 8.0, 1e-3);
  EXPECT_NEAR(dp8->prediction.peak_bytes, 9.28e6, 1.0);
  // The best that fits: TP 2 × DP 4: 2 micro-batches of 8 · (0.5 s + 1e9 B / 1e10 B/s) = 9.6 s,
  // 16·4e4 + 4e6 = 4.64e6 bytes; CP 2 × DP 4 takes as long but keeps 16·8e4 + 4e6 (the tie goes to
  // the smaller peak).
  ASSERT_FALSE(r.ranked.empty());
  const AutoCandidate& best = r.ranked.front();
  EXPECT_EQ(best.layout.tp, 2);
  EXPECT_EQ(best.layout.cp, 1);
  EXPECT_EQ(best.layout.pp, 1);
  EXPECT_EQ(best.layout.dp, 4);
  EXPECT_NEAR(best.prediction.step_seconds, 9.6, 1e-3);
  EXPECT_NEAR(best.prediction.peak_bytes, 4.64e6, 1.0);
  EXPECT_EQ(r.ranked[1].layout.cp, 2);
  EXPECT_NEAR(r.ranked[1].prediction.step_seconds, 9.6, 1e-3);
  EXPECT_LT(dp8->prediction.step_seconds, best.prediction.step_seconds);
  // PP 8: 8 micro-batches + 7 bubble slots of 1 s; its first stage keeps 8 micro-batches of its
  // layer in flight: 16·1e4 + 8·1e6 bytes, over the limit.
  const AutoCandidate* pp8 = find(r.over_memory, {1, 1, 8, 1});
  ASSERT_NE(pp8, nullptr);
  EXPECT_NEAR(pp8->prediction.step_seconds, 15.0, 1e-3);
  EXPECT_NEAR(pp8->prediction.peak_bytes, 8.16e6, 1.0);
  // TP 8 spans both nodes: its traffic (1e9 · 2·7/8 B per layer) goes at 1e9 B/s, not 1e10.
  const AutoCandidate* tp8 = find(r.ranked, {8, 1, 1, 1});
  ASSERT_NE(tp8, nullptr);
  EXPECT_TRUE(tp8->prediction.tp_cp_spans_nodes);
  EXPECT_NEAR(tp8->prediction.step_seconds, 8 * 8 * (0.125 + 1.75), 1e-2);
  const AutoSearchResult one_node = search_layouts(hand_models(8), hand_space());
  const AutoCandidate* tp8_one_node = find(one_node.ranked, {8, 1, 1, 1});
  ASSERT_NE(tp8_one_node, nullptr);
  EXPECT_FALSE(tp8_one_node->prediction.tp_cp_spans_nodes);
  EXPECT_NEAR(tp8_one_node->prediction.step_seconds, 8 * 8 * (0.125 + 0.175), 1e-2);
  // Every layout of 8 ranks is there once: 20 (tp, cp, pp) triples divide 8.
  EXPECT_EQ(r.ranked.size() + r.over_memory.size() + r.excluded.size(), 20u);
}

TEST(AutoSettingsSearch, DivisibilityExcludes) {
  AutoSearchSpace s = hand_space();
  s.num_attention_heads = 4;  // TP 8 cannot split 4 heads
  s.num_query_groups = 4;
  s.num_layers = 6;           // PP 4 and 8 cannot split 6 layers
  s.seq_length = 24;          // CP 8 needs 16 | 24: no
  s.global_batch_size = 4;    // DP 8 cannot take micro-batches of 1 out of 4
  AutoModels m = hand_models(4);
  m.target.num_layers = 6;
  m.target.global_batch_size = 4;
  const AutoSearchResult r = search_layouts(m, s);
  auto excluded = [&](const std::string& prefix, const std::string& why) {
    for (const std::string& e : r.excluded)
      if (e.rfind(prefix, 0) == 0) return e.find(why) != std::string::npos;
    return false;
  };
  EXPECT_TRUE(excluded("tp=8 cp=1 pp=1 dp=1", "TP 8 does not divide the 4 attention heads"));
  EXPECT_TRUE(excluded("tp=1 cp=1 pp=4 dp=2", "PP 4 does not divide the 6 layers"));
  EXPECT_TRUE(excluded("tp=1 cp=8 pp=1 dp=1", "CP 8: the sequence length 24 is not a multiple of 2·CP"));
  EXPECT_TRUE(excluded("tp=1 cp=1 pp=1 dp=8", "the global batch 4 is not a multiple of micro-batch 1 × DP 8"));
  for (const auto* list : {&r.ranked, &r.over_memory})
    for (const AutoCandidate& c : *list) {
      EXPECT_EQ(4 % c.layout.tp, 0);
      EXPECT_EQ(6 % c.layout.pp, 0);
      EXPECT_EQ(4 % c.layout.dp, 0);
    }
  s.cp_algo = "ulysses_cp_algo";
  EXPECT_EQ(layout_exclusion(s, AutoLayout{2, 4, 1, 1}), "Ulysses CP 4 does not divide the 2 heads per TP rank");
}

std::vector<AutoCandidate> candidates(const std::vector<double>& predicted) {
  std::vector<AutoCandidate> c;
  for (size_t i = 0; i < predicted.size(); ++i) {
    AutoCandidate a;
    a.layout = AutoLayout{static_cast<int64_t>(i + 1), 1, 1, 1};  // tp = index + 1 names it
    a.prediction.step_seconds = predicted[i];
    a.fits = true;
    c.push_back(a);
  }
  return c;
}

TEST(AutoParallelSearch, AccurateModelConvergesOnItsBest) {
  // The model is right: the first draw is almost surely the clear best (1 s against 3 s and up,
  // priors ±30%), it runs once, measures 1 s ± 5%, and the next draw picks it again: done.
  const std::vector<double> truth = {3.0, 1.0, 4.0, 5.0};
  int runs = 0;
  const AutoParallelResult r = thompson_search(candidates(truth), 8, 7, [&](const AutoLayout& l) -> StatusOr<double> {
    ++runs;
    return truth[static_cast<size_t>(l.tp - 1)];
  });
  EXPECT_TRUE(r.converged);
  ASSERT_GE(r.best, 0);
  EXPECT_EQ(r.trials[static_cast<size_t>(r.best)].layout.tp, 2);
  EXPECT_EQ(runs, static_cast<int>(r.trials.size()));
  EXPECT_LE(runs, 2);
}

TEST(AutoParallelSearch, WrongModelExploresFailuresDropAndTheLimitHolds) {
  // The model ranks layout 1 far ahead, but it fails (out of memory, say), and layout 2 runs far
  // slower than predicted: the search must drop the first, move on to the others and answer the
  // fastest measured.
  const std::vector<double> predicted = {0.5, 1.1, 1.2, 1.3};
  const std::vector<double> truth = {-1.0, 5.0, 1.25, 1.3};
  std::vector<int64_t> ran;
  auto runner = [&](const AutoLayout& l) -> StatusOr<double> {
    ran.push_back(l.tp);
    const double t = truth[static_cast<size_t>(l.tp - 1)];
    if (t < 0) return InvalidArgument("exit 1");
    return t;
  };
  const AutoParallelResult r = thompson_search(candidates(predicted), 8, 7, runner);
  ASSERT_GE(r.best, 0);
  EXPECT_EQ(r.trials[static_cast<size_t>(r.best)].layout.tp, 3);  // 1.25 s, the fastest that runs
  std::vector<int64_t> sorted = ran;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::unique(sorted.begin(), sorted.end()), sorted.end()) << "a layout ran twice";
  for (const AutoParallelTrial& t : r.trials) {
    if (t.layout.tp == 1) {
      EXPECT_EQ(t.error, "exit 1");
    }
  }
  // The same seed gives the same trials; the limit caps them.
  ran.clear();
  const AutoParallelResult again = thompson_search(candidates(predicted), 8, 7, runner);
  ASSERT_EQ(again.trials.size(), r.trials.size());
  for (size_t k = 0; k < r.trials.size(); ++k) EXPECT_EQ(again.trials[k].layout.tp, r.trials[k].layout.tp);
  const AutoParallelResult capped = thompson_search(candidates(predicted), 1, 7, runner);
  EXPECT_EQ(capped.trials.size(), 1u);
  EXPECT_FALSE(capped.converged);
}

}  // namespace
}  // namespace gale
