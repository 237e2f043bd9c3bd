// Megatron's total_loss_dict as training_log keeps it: what is summed, when, in which order.
#include "train/total_loss_dict.h"

#include <gtest/gtest.h>

namespace gale {
namespace {

// training_log adds the loss dict only for an iteration that advanced; the trackers' values
// (MoE, MTP, DSA indexer) every iteration; both are divided by max(1, advanced iterations).
TEST(TotalLossDict, SkippedIterationsAddOnlyTrackedValues) {
  TotalLossDict d;
  d.add_loss_dict({{"lm loss", 4.0}}, /*advanced=*/true);
  d.add_tracked({{"load_balancing_loss", 1.0}, {"mtp_1 loss", 3.0}});
  d.add_loss_dict({{"lm loss", 100.0}}, /*advanced=*/false);  // skipped: not summed
  d.add_tracked({{"load_balancing_loss", 0.5}, {"mtp_1 loss", 1.0}});
  d.add_loss_dict({{"lm loss", 2.0}}, /*advanced=*/true);
  d.add_tracked({{"load_balancing_loss", 0.5}, {"mtp_1 loss", 2.0}});
  const LossDict avg = d.averages(/*advanced=*/2);
  ASSERT_EQ(avg.size(), 3u);
  EXPECT_EQ(avg[0].first, "lm loss");
  EXPECT_DOUBLE_EQ(avg[0].second, 3.0);
  EXPECT_EQ(avg[1].first, "load_balancing_loss");
  EXPECT_DOUBLE_EQ(avg[1].second, 1.0);
  EXPECT_EQ(avg[2].first, "mtp_1 loss");
  EXPECT_DOUBLE_EQ(avg[2].second, 3.0);
}

// Keys keep their first insertion's place: an fp16 run whose first iteration overflowed inserts
// the MoE tracker's key before lm loss (Megatron's dict order), and an interval in which nothing
// advanced divides by max(1, 0) = 1.
TEST(TotalLossDict, OrderOfFirstInsertion) {
  TotalLossDict d;
  d.add_loss_dict({{"lm loss", 9.0}}, /*advanced=*/false);
  d.add_tracked({{"z_loss", 0.25}});
  LossDict avg = d.averages(0);
  ASSERT_EQ(avg.size(), 1u);  // lm loss was never summed: absent, not printed
  EXPECT_EQ(avg[0], (std::pair<std::string, double>{"z_loss", 0.25}));
  d.add_loss_dict({{"lm loss", 3.0}}, /*advanced=*/true);
  d.add_tracked({{"z_loss", 0.25}});
  avg = d.averages(1);
  ASSERT_EQ(avg.size(), 2u);
  EXPECT_EQ(avg[0].first, "z_loss");
  EXPECT_DOUBLE_EQ(avg[0].second, 0.5);
  EXPECT_EQ(avg[1].first, "lm loss");
  EXPECT_DOUBLE_EQ(avg[1].second, 3.0);
}

// After a line Megatron zeroes the sums but keeps the keys: an interval whose iterations were all
// skipped prints "lm loss: 0.000000E+00" (training_log's `avg >= 0.0`).
TEST(TotalLossDict, ResetKeepsKeysSoAnAllSkippedIntervalPrintsZero) {
  TotalLossDict d;
  d.add_loss_dict({{"lm loss", 5.0}}, /*advanced=*/true);
  d.reset();
  d.add_loss_dict({{"lm loss", 7.0}}, /*advanced=*/false);
  d.add_loss_dict({{"lm loss", 7.0}}, /*advanced=*/false);
  TrainingLogFields f;
  f.timestamp = "2026-01-01 00:00:00";
  f.iteration = 4;
  f.train_iters = 4;
  f.consumed_samples = 8;
  f.elapsed_ms_per_iteration = 10.0;
  f.learning_rate = 1.0e-4;
  f.global_batch_size = 2;
  f.losses = d.averages(/*advanced=*/0);
  f.loss_scale = 2048.0;
  f.has_grad_norm = false;
  f.skipped_iterations = 2;
  EXPECT_EQ(format_training_log_line(f),
            " [2026-01-01 00:00:00] iteration        4/       4 | consumed samples:            8 | elapsed time per "
            "iteration (ms): 10.0 | learning rate: 1.000000E-04 | global batch size:     2 | lm loss: 0.000000E+00 | "
            "loss scale: 2048.0 | number of skipped iterations:   2 | number of nan iterations:   0 |");
}

// training_log's track_names: `"aux_loss" in args.moe_router_load_balancing_type` is a substring
// test on Megatron's scalar form (a one-element list becomes its string), membership in a list.
TEST(TotalLossDict, MoeTrackNamesAsMegatronsInTest) {
  using K = std::vector<int>;
  EXPECT_EQ(moe_tracked_aux_kinds("aux_loss", {}), (K{0}));
  EXPECT_EQ(moe_tracked_aux_kinds("seq_aux_loss", {}), (K{0, 1}));  // "aux_loss" in "seq_aux_loss"
  EXPECT_EQ(moe_tracked_aux_kinds("global_aux_loss", {}), (K{0, 2}));
  EXPECT_EQ(moe_tracked_aux_kinds("sinkhorn", {}), K{});
  EXPECT_EQ(moe_tracked_aux_kinds("none", {}), K{});
  EXPECT_EQ(moe_tracked_aux_kinds("quantile_balancing", {}), K{});
  EXPECT_EQ(moe_tracked_aux_kinds("", {"seq_aux_loss", "global_aux_loss"}), (K{1, 2}));  // list: membership
  EXPECT_EQ(moe_tracked_aux_kinds("", {"global_aux_loss", "aux_loss"}), (K{0, 2}));     // Megatron's order
}

}  // namespace
}  // namespace gale
