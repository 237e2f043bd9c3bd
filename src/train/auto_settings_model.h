// --auto-settings' memory and step-time models: fitted to the profiling runs
// (train/auto_settings_profile.h), evaluated for a layout of the target cluster.
//
// The profiling runs are pipeline size 1, data-parallel size 1, the target's micro-batch size and
// sequence length, 2 micro-batches, and for each profiled (TP, CP) two layer counts (1 and 2), so
// that differences between the two isolate one transformer layer; plus, on 2 local ranks or more,
// one 2-layer run of pipeline size 2 (what the first and the last stage hold). Per split degree
// d = TP·CP:
//
//   memory   persistent bytes = b · params + c          (b, c: slope and intercept over the runs)
//            params per rank   = L_stage · p_layer(TP) + p_fixed(TP, stage)
//            transient peak    = L_stage · in_flight · a_layer(d) + a_fixed(d)
//            peak of a stage   = persistent (optimizer state / (DP·CP) under the distributed optimizer)
//                                + transient; 1F1B keeps min(PP − stage, micro-batches) in flight;
//                                the first and last stages hold the shares of p_fixed and a_fixed a
//                                PP 2 run measured (without it: all of a_fixed on every stage)
//   time     per micro-batch   = L_stage · t_layer(d) + t_fixed(d) + pipeline send/recv
//            t_layer(d)        = FLOPs_layer / d / rate + wire(d) / bandwidth  (TP/CP traffic)
//            step              = (m + PP − 1) · per micro-batch + optimizer + DP gradient reduction
//
// rate is the FLOP/s of the TP = CP = 1 runs (Megatron's FLOPs over their forward-backward
// seconds); the intra-node bandwidth is the d > 1 runs' TP/CP bytes over their time beyond their
// FLOPs at that rate. Where a (TP, CP) pair was profiled its per-layer values are used as
// measured; others come from f(d) = α + β / d fitted over the profiled degrees (β only, with one
// degree). Groups that span nodes use the bandwidth times --auto-settings-inter-node-bandwidth-ratio.
// Profiles without FLOPs: t_layer(1) and the bandwidth from differences of the runs' times.
// docs/auto_settings.md states the assumptions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/auto_settings_profile.h"

namespace gale {

// A layout of the target: world = tp · cp · pp · dp.
struct AutoLayout {
  int64_t tp = 1, cp = 1, pp = 1, dp = 1;
};

// What the target run is, apart from its layout (from the command line).
struct AutoTarget {
  int64_t num_layers = 1, micro_batch_size = 1, global_batch_size = 1, seq_length = 1, hidden_size = 1;
  bool tied_embeddings = true;         // not --untie-embeddings-and-output-weights
  bool distributed_optimizer = false;  // --use-distributed-optimizer
  bool sequence_parallel = false;
  // Persistent bytes per parameter the distributed optimizer shards over DP (white box: Adam's
  // two f32 moments, 8; SGD with momentum, 4; plus the f32 main copy, 4, under --bf16/--fp16).
  double shardable_bytes_per_param = 8.0;
  int64_t ranks_per_node = 1;
  double inter_node_bandwidth_ratio = 0.25;
};

// f(d) = alpha + beta / d.
struct SplitFit {
  double alpha = 0.0, beta = 0.0;
  double at(double d) const { return alpha + beta / d; }
};
// Least squares over (d, y) points; one distinct d: alpha = 0.
SplitFit fit_split(const std::vector<std::pair<double, double>>& points);

// What one profiled (TP, CP) pair measured, per transformer layer and for the rest.
struct PairMeasure {
  int64_t tp = 1, cp = 1;
  double layer_params = 0, fixed_params = 0;          // elements per rank
  double layer_activation = 0, fixed_activation = 0;  // transient bytes (one micro-batch in flight)
  double layer_seconds = 0, fixed_seconds = 0;        // forward-backward per micro-batch
  double layer_comm_bytes = 0, fixed_comm_bytes = 0;  // TP + CP bytes per micro-batch
  // FLOPs (Megatron's, whole model) per layer and fixed part per micro-batch, and the two runs'
  // totals per iteration: FLOPs, forward-backward seconds, TP + CP bytes (0: not in the profiles).
  double layer_flops = 0, fixed_flops = 0, run_flops = 0, run_seconds = 0, run_comm_bytes = 0;
};

struct AutoModels {
  std::vector<PairMeasure> pairs;
  SplitFit layer_params, fixed_params, layer_activation, fixed_activation, fixed_seconds;
  double bytes_per_param = 16.0, persistent_intercept = 0.0;
  double layer_seconds_1 = 0.0;                // t_layer(1)
  double layer_comm_bytes = 0.0;               // at d = 2 (0: none profiled)
  double intra_bandwidth = 10e9;               // bytes/s
  bool bandwidth_measured = false;
  double optimizer_seconds_per_param = 0.0;
  double flops_per_second = 0.0;  // a rank's compute rate (0: times from differences, no FLOPs)
  // From the PP 2 run (stage_shares): the shares of the TP = CP = 1 fixed parameters and fixed
  // activations the first and the last pipeline stage hold.
  bool stage_shares = false;
  double first_param_share = 1.0, last_param_share = 1.0, first_activation_share = 1.0, last_activation_share = 1.0;
  AutoTarget target;

  const PairMeasure* pair(int64_t tp, int64_t cp) const;
};

// The fit. `profiles` must hold, for TP = CP = 1 at least, runs of 1 and 2 layers (pp = dp = 1);
// a 2-layer run of PP 2 (TP = CP = DP = 1) is optional.
StatusOr<AutoModels> fit_auto_models(const std::vector<RunProfile>& profiles, const AutoTarget& target);

struct AutoPrediction {
  double peak_bytes = 0;         // the largest over the pipeline stages
  double persistent_bytes = 0;   // of that stage
  double step_seconds = 0;
  double compute_seconds = 0, tp_cp_comm_seconds = 0, pp_comm_seconds = 0, dp_comm_seconds = 0,
         optimizer_seconds = 0, bubble_seconds = 0;
  bool tp_cp_spans_nodes = false, dp_spans_nodes = false, pp_spans_nodes = false;
};
AutoPrediction predict(const AutoModels& m, const AutoLayout& l);

}  // namespace gale
