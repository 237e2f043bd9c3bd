// Parallel invariance: every TP / SP / CP / DP / PP layout (1F1B, interleaved, uneven and explicit stages), with
// and without the distributed optimizer, the communication overlaps and activation recomputation,
// reproduces the single-process run (with the same attention kernel): the losses and gradient
// norms of 5 iterations and the final parameters and gradients, within 1e-5 relative in fp32 (with the distributed optimizer, the
// gradients of the shards this rank owns: the rest of its buffer is never reduced).
//
// Each rank also runs the single-process reference itself (the models are tiny), so it can
// compare its own shards with the matching slices of the reference tensors without gathering.
// Dropout is on: its masks are drawn from global sample/position/head indices, so they are
// layout-independent too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "kernels/cpu/fused_ops.h"
#include "layouts.h"
#include "mpi_test_env.h"
#include "testing_run.h"
#include "train/engine.h"
#include "train/grad_sync.h"
#include "train/trainer.h"

namespace gale {
namespace {

using testing::Layout;

const std::vector<Layout>& layouts() {
  static const std::vector<Layout> all = {
      {"single", 1, {}},
      {"tp2", 2, {"--tensor-model-parallel-size", "2"}},
      {"tp2_sp", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp2", 2, {}},
      {"tp4", 4, {"--tensor-model-parallel-size", "4"}},
      {"tp4_sp", 4, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_dp2", 4, {"--tensor-model-parallel-size", "2"}},
      {"tp2_dp2_sp", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}},
      {"dp4", 4, {}},
      {"tp4_dp2_sp", 8, {"--tensor-model-parallel-size", "4", "--sequence-parallel"}},
      {"tp2_dp4", 8, {"--tensor-model-parallel-size", "2"}},
      // Pipeline parallelism: 1F1B, interleaved 1F1B and uneven first/last stages. A layout may
      // set --num-layers; its single-process reference then has the same number of layers.
      {"pp2", 2, {"--pipeline-model-parallel-size", "2"}},
      {"pp2_vpp2", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1"}},
      // Megatron's micro-batch groups larger than P: 5 micro-batches in groups of 3 and 2.
      {"pp2_vpp2_group3", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                              "--global-batch-size", "10", "--microbatch-group-size-per-virtual-pipeline-stage", "3"}},
      {"pp2_uneven", 2, {"--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
                         "--decoder-last-pipeline-num-layers", "3"}},
      {"pp2_vpp2_uneven", 2, {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                              "--num-layers", "6", "--decoder-first-pipeline-num-layers", "2"}},
      {"pp4", 4, {"--pipeline-model-parallel-size", "4"}},
      // Megatron's --account-for-embedding/loss-in-pipeline-split: the first stage holds the
      // embedding and 1 layer, the second 2; with virtual stages the first and the last virtual
      // stage hold no transformer layer at all.
      {"pp2_account_embedding", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "3",
                                    "--account-for-embedding-in-pipeline-split"}},
      {"pp2_vpp2_account_embedding_loss", 2, {"--pipeline-model-parallel-size", "2",
                                              "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers", "2",
                                              "--account-for-embedding-in-pipeline-split",
                                              "--account-for-loss-in-pipeline-split"}},
      {"pp4_account_loss", 4, {"--pipeline-model-parallel-size", "4", "--num-layers", "7",
                               "--account-for-loss-in-pipeline-split"}},
      // MindSpeed's --noop-layers (identity layers balancing the stages): the first stage holds the
      // embedding and one real layer, the second two real layers; the reference has the same noop layer.
      {"pp2_noop_layers", 2, {"--pipeline-model-parallel-size", "2", "--noop-layers", "0"}},
      {"pp2_vpp2_noop_layers_dp2", 4, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                       "1", "--noop-layers", "1,2", "--recompute-granularity", "full",
                                       "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      // Explicit splits: MindSpeed-LLM's --num-layer-list (one count per rank) and MindSpeed's
      // --pipeline-num-transformer-layers (one per virtual stage), with uneven virtual stages
      // inside a rank and virtual stages without any layer (the second chunk of rank 0 holds
      // nothing at all: no parameter), and full recomputation over chunks of different sizes.
      {"pp2_num_layer_list", 2, {"--pipeline-model-parallel-size", "2", "--num-layer-list", "1,3"}},
      {"pp4_num_layer_list", 4, {"--pipeline-model-parallel-size", "4", "--num-layers", "7", "--num-layer-list",
                                 "2,1,3,1"}},
      {"pp2_dp2_num_layer_list_distopt", 4, {"--pipeline-model-parallel-size", "2", "--num-layer-list", "3,1",
                                             "--use-distributed-optimizer"}},
      {"pp2_vpp2_unaligned", 2, {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                                 "--num-layers", "5", "--pipeline-num-transformer-layers", "[[1,2],[1,1]]"}},
      {"pp2_vpp2_unaligned_empty", 2, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
                                       "1", "--pipeline-num-transformer-layers", "[[2,0],[1,1]]"}},
      {"pp2_num_layer_list_full_recompute_block", 2, {"--pipeline-model-parallel-size", "2", "--num-layer-list", "1,3",
                                                      "--recompute-granularity", "full", "--recompute-method", "block",
                                                      "--recompute-num-layers", "2"}},
      {"pp2_vpp2_unaligned_full_recompute_uniform", 2, {"--pipeline-model-parallel-size", "2",
                                                        "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers",
                                                        "6", "--pipeline-num-transformer-layers", "[[3,0],[1,2]]",
                                                        "--recompute-granularity", "full", "--recompute-method",
                                                        "uniform", "--recompute-num-layers", "2"}},
      {"pp4_vpp2_unaligned", 4, {"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
                                 "--num-layers", "8", "--pipeline-num-transformer-layers", "[[0,1],[1,1]*2,[3,0]]"}},
      // Megatron's --pipeline-model-parallel-layout: PP 2 x VPP 2 from the stage count, rank 0's
      // second virtual stage empty (the same placement path as the explicit splits above).
      {"pp2_vpp2_layout", 2, {"--pipeline-model-parallel-size", "2", "--num-layers", "5",
                              "--pipeline-model-parallel-layout", "Et|tt||ttL"}},
      {"pp4_vpp2", 4, {"--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2",
                       "--num-layers", "8"}},
      {"pp4_uneven", 4, {"--pipeline-model-parallel-size", "4", "--num-layers", "6",
                         "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "1"}},
      {"tp2_pp2", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
      {"tp2_pp2_vpp2_sp", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                              "--num-layers-per-virtual-pipeline-stage", "1", "--sequence-parallel"}},
      {"pp2_dp2", 4, {"--pipeline-model-parallel-size", "2"}},
      {"tp2_pp2_dp2", 8, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"}},
      {"tp2_pp2_dp2_sp", 8, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                             "--sequence-parallel"}},
      {"pp2_vpp2_dp4", 8, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                           "--global-batch-size", "16"}},
      // Data parallelism in buckets and the distributed optimizer. Megatron's rule gives one bucket
      // per chunk without --overlap-grad-reduce; the layouts with a bucket size cut the ~220k
      // elements into 6-12 buckets, whose boundaries and shards cut through parameters and whose
      // sizes are not all multiples of DP (the padded staging path).
      {"dp2_distopt", 2, {"--use-distributed-optimizer"}},
      {"dp2_overlap", 2, {"--overlap-grad-reduce"}, 20000},
      {"dp2_distopt_overlap_paramgather", 2,
       {"--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"}, 20000},
      {"dp4_distopt", 4, {"--use-distributed-optimizer"}, 30001},
      // LoRA (adapters on all four linears, frozen base): gradients reduced and optimizer state
      // sharded over the adapters only; the frozen parameters stay out of every bucket.
      {"dp2_lora", 2, {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv", "linear_proj",
                       "linear_fc1", "linear_fc2"}},
      {"tp2_lora", 2, {"--tensor-model-parallel-size", "2", "--lora-r", "4", "--lora-alpha", "8",
                       "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}},
      {"tp2_sp_dp2_lora", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--lora-r", "4",
                              "--lora-target-modules", "linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}},
      {"pp2_lora", 2, {"--pipeline-model-parallel-size", "2", "--lora-r", "4", "--lora-target-modules", "linear_proj",
                       "linear_fc1"}},
      {"cp2_lora", 2, {"--context-parallel-size", "2", "--lora-r", "4", "--lora-target-modules", "linear_qkv",
                       "linear_fc2"}},
      {"dp2_lora_distopt_overlap", 2, {"--lora-r", "4", "--lora-alpha", "8", "--lora-target-modules", "linear_qkv",
                                       "linear_fc2", "--use-distributed-optimizer", "--overlap-grad-reduce",
                                       "--overlap-param-gather"}, 2000},
      // --lora-modules-to-save: the tied embedding (both pipeline stages' copies) and the final
      // norm train whole beside the adapters.
      {"tp2_lora_save", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--lora-r", "4",
                            "--lora-target-modules", "linear_qkv", "linear_fc2", "--lora-modules-to-save",
                            "word_embeddings", "final_layernorm"}},
      {"pp2_dp2_lora_save", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--lora-r", "4",
                                "--lora-target-modules", "linear_proj", "linear_fc1", "--lora-modules-to-save",
                                "word_embeddings", "final_layernorm"}},
      {"tp2_dp2_distopt_sp", 4, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--use-distributed-optimizer"}},
      {"tp2_dp4_distopt", 8, {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--overlap-grad-reduce"},
       25000},
      // With pipeline parallelism the tied embedding shared by the first and last stage gets a
      // bucket of its own on both (so they shard it alike before its all-reduce).
      {"pp2_dp2_distopt", 4, {"--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"}},
      {"tp2_pp2_dp2_distopt_overlap", 8, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                           "--use-distributed-optimizer", "--overlap-grad-reduce",
                                           "--overlap-param-gather"}, 20000},
      // Activation recomputation (--recompute-activation-function, --recompute-norm): with sequence
      // parallelism the recomputed norm outputs are all-gathered again in backward; with pipeline
      // chunks the layer counts start at each chunk's first layer.
      {"tp2_sp_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel"}, 0,
       {RecomputePlan::kAllLayers, RecomputePlan::kAllLayers}},
      {"pp2_vpp2_recompute", 2, {"--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
                                 "--num-layers", "8"}, 0, {1, RecomputePlan::kAllLayers}},
      {"tp2_pp2_sp_recompute", 4, {"--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                                   "--sequence-parallel"}, 0, {1, 1}},
      // Megatron's full recomputation: reruns a layer group's forward (with SP: its all-gathers) in backward.
      {"tp2_sp_full_recompute", 2, {"--tensor-model-parallel-size", "2", "--sequence-parallel", "--recompute-granularity",
                                    "full", "--recompute-method", "uniform", "--recompute-num-layers", "3"}},
      // --distribute-saved-activations (no SP): each TP rank keeps half of a group's input, all-gathered
      // before the rerun.
      {"tp2_full_recompute_distributed", 2, {"--tensor-model-parallel-size", "2", "--recompute-granularity", "full",
                                             "--recompute-method", "uniform", "--recompute-num-layers", "2",
                                             "--distribute-saved-activations"}},
      {"tp2_pp2_full_recompute_block_distributed", 4, {"--tensor-model-parallel-size", "2",
                                                       "--pipeline-model-parallel-size", "2", "--recompute-granularity",
                                                       "full", "--recompute-method", "block", "--recompute-num-layers",
                                                       "1", "--distribute-saved-activations"}},
      // Context parallelism (load-balanced split; 16 positions cut into 2·CP chunks) with ring
      // attention (--cp-comm-type p2p, the default), alone and with document masks, TP+SP, PP (1F1B
      // and interleaved), DP with the distributed optimizer and full recomputation.
      {"cp2_docs", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}},
      {"cp4", 4, {"--context-parallel-size", "4"}},
      {"tp2_cp2_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"}},
      {"pp2_cp2", 4, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2"}},
      {"pp2_vpp2_cp2", 4, {"--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1",
                           "--context-parallel-size", "2"}},
      {"tp2_cp2_dp2_sp_distopt", 8, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                     "--sequence-parallel", "--use-distributed-optimizer", "--overlap-grad-reduce"},
       20000},
      // The ring with the level-2 flash attention kernel (key blocks of non-consecutive positions).
      {"cp2_docs_flash", 2, {"--context-parallel-size", "2", "--reset-attention-mask"}, 0, {}, true},
      {"cp4_docs_flash", 4, {"--context-parallel-size", "4", "--reset-attention-mask"}, 0, {}, true},
      // All-gathered keys and values (--cp-comm-type allgather): non-consecutive query positions,
      // Sq < Sk; with documents, flash attention, TP+SP and DP with the distributed optimizer.
      {"cp2_docs_allgather", 2, {"--context-parallel-size", "2", "--reset-attention-mask", "--cp-comm-type",
                                 "allgather"}},
      {"cp4_allgather_flash", 4, {"--context-parallel-size", "4", "--cp-comm-type", "allgather"}, 0, {}, true},
      {"tp2_cp2_sp_allgather", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                   "--sequence-parallel", "--cp-comm-type", "allgather"}},
      {"dp2_cp2_distopt_allgather", 4, {"--context-parallel-size", "2", "--use-distributed-optimizer",
                                        "--cp-comm-type", "allgather"}},
      // DeepSpeed-Ulysses (--context-parallel-algo ulysses_cp_algo): heads (8) and query groups
      // (GPT 8, LLaMA 4) split over TP x CP.
      {"cp2_ulysses", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"cp2_ulysses_docs_flash", 2, {"--context-parallel-size", "2", "--context-parallel-algo", "ulysses_cp_algo",
                                     "--reset-attention-mask"}, 0, {}, true},
      {"cp4_ulysses", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "ulysses_cp_algo"}},
      {"tp2_cp2_ulysses_sp", 4, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "2",
                                 "--context-parallel-algo", "ulysses_cp_algo", "--sequence-parallel"}},
      {"pp2_cp2_ulysses_full_recompute", 4, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "2",
                                             "--context-parallel-algo", "ulysses_cp_algo", "--recompute-granularity",
                                             "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"}},
      // Megatron's names for the same algorithms: --cp-comm-type a2a (Ulysses) and a2a+p2p with
      // --hierarchical-context-parallel-sizes (the hybrid).
      {"cp2_megatron_a2a", 2, {"--context-parallel-size", "2", "--cp-comm-type", "a2a"}},
      {"cp4_megatron_a2a_p2p", 4, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                                   "--hierarchical-context-parallel-sizes", "2", "2"}},
      // Hybrid (--context-parallel-algo hybrid_cp_algo): Ulysses over U consecutive cp ranks (heads
      // and query groups split over TP x U), ring attention across the CP/U Ulysses groups; with
      // documents and flash attention, TP+SP, PP with full recomputation, and rings of 2 and 4.
      {"cp4_hybrid_u2", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                            "--ulysses-degree-in-cp", "2"}},
      {"cp4_hybrid_u2_docs_flash", 4, {"--context-parallel-size", "4", "--context-parallel-algo", "hybrid_cp_algo",
                                       "--ulysses-degree-in-cp", "2", "--reset-attention-mask"}, 0, {}, true},
      {"tp2_cp4_hybrid_u2_sp", 8, {"--tensor-model-parallel-size", "2", "--context-parallel-size", "4",
                                   "--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp", "2",
                                   "--sequence-parallel"}},
      {"pp2_cp4_hybrid_u2_full_recompute", 8, {"--pipeline-model-parallel-size", "2", "--context-parallel-size", "4",
                                               "--context-parallel-algo", "hybrid_cp_algo", "--ulysses-degree-in-cp",
                                               "2", "--recompute-granularity", "full", "--recompute-method",
                                               "uniform", "--recompute-num-layers", "1"}},
      {"cp8_hybrid_u2_docs", 8, {"--context-parallel-size", "8", "--context-parallel-algo", "hybrid_cp_algo",
                                 "--ulysses-degree-in-cp", "2", "--reset-attention-mask"}},
      // Megatron's partial distributed optimizer (--num-distributed-optimizer-instances): shards
      // inside instances of consecutive dp-cp ranks, gradient shards all-reduced across them; with
      // overlap and several buckets, one rank per instance, and instances cutting cp groups apart.
      {"dp4_distopt_2instances", 4, {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"}},
      {"dp4_distopt_2instances_overlap", 4, {"--use-distributed-optimizer", "--overlap-grad-reduce",
                                             "--overlap-param-gather", "--num-distributed-optimizer-instances", "2"},
       20000},
      {"dp2_distopt_2instances", 2, {"--use-distributed-optimizer", "--num-distributed-optimizer-instances", "2"}},
      {"cp2_dp2_distopt_4instances", 4, {"--context-parallel-size", "2", "--use-distributed-optimizer",
                                         "--num-distributed-optimizer-instances", "4"}},
      {"tp2_dp4_sp_distopt_2instances", 8, {"--tensor-model-parallel-size", "2", "--sequence-parallel",
                                            "--use-distributed-optimizer", "--num-distributed-optimizer-instances",
                                            "2"}},
      // --overlap-param-gather-with-optimizer-step: the first chunk's all-gather (one bucket) starts
      // inside the optimizer step.
      {"pp2_vpp2_dp2_distopt_gather_with_step", 4, {"--pipeline-model-parallel-size", "2",
                                                    "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers", "8",
                                                    "--use-distributed-optimizer", "--overlap-grad-reduce",
                                                    "--overlap-param-gather",
                                                    "--overlap-param-gather-with-optimizer-step"}},
      {"cp2_full_recompute", 2, {"--context-parallel-size", "2", "--recompute-granularity", "full",
                                 "--recompute-method", "uniform", "--recompute-num-layers", "2"}},
      {"pp2_vpp2_full_recompute_block", 2, {"--pipeline-model-parallel-size", "2",
                                            "--num-virtual-stages-per-pipeline-rank", "2", "--num-layers", "8",
                                            "--recompute-granularity", "full", "--recompute-method", "block",
                                            "--recompute-num-layers", "1"}},
  };
  return all;
}

const std::vector<std::string> kCommon = {
    "--num-layers", "4", "--hidden-size", "64", "--seq-length", "16", "--max-position-embeddings", "16",
    "--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters", "5", "--lr", "2e-3",
    "--lr-warmup-iters", "1", "--lr-decay-style", "cosine", "--mock-data", "--make-vocab-size-divisible-by", "64",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--eval-iters", "0", "--log-interval", "1000",
    "--clip-grad", "0.5"};

const std::vector<std::string>& kGpt = testing::kTinyGpt;
const std::vector<std::string>& kLlama = testing::kTinyLlama;
constexpr int64_t kVocab = testing::kTinyVocab;

// One layout's run of the model: the common flags, the model's, then the layout's.
struct LayoutRun : testing::TestRun {
  LayoutRun(const std::vector<std::string>& model, const std::vector<std::string>& layout, const Comm& world,
            int64_t bucket_size = 0, RecomputePlan recompute = {}, bool flash_attention = false)
      : TestRun(testing::join({kCommon, model, layout}), world, kVocab, EngineOptions{bucket_size, recompute},
                attention_ops(flash_attention)) {
    GALE_CHECK_EQ(args.model.padded_vocab_size, 256);
  }
  // The reference kernels, with the flash attention kernel (best build of this CPU) when asked.
  static OpTable attention_ops(bool flash) {
    OpTable ops = reference_ops();
    if (flash) GALE_CHECK_OK(install_fused_kernel(ops, "attention", Isa::kAvx512));
    return ops;
  }
};

// The single-process run a layout is compared with: the same model (and batch) flags, no
// parallelism. Computed once per process for each distinct set of flags.
const LayoutRun& single_process_run(bool llama, const std::vector<std::string>& layout_flags, bool flash) {
  std::vector<std::string> same_model;
  for (size_t i = 0; i < layout_flags.size(); ++i) {
    if (layout_flags[i] == "--reset-attention-mask") same_model.push_back(layout_flags[i]);
    if (layout_flags[i].rfind("--lora-", 0) == 0)  // a LoRA flag and its values: the same adapters
      for (size_t j = i; j < layout_flags.size() && (j == i || layout_flags[j].rfind("--", 0) != 0); ++j)
        same_model.push_back(layout_flags[j]);
    if (i + 1 < layout_flags.size() && (layout_flags[i] == "--num-layers" || layout_flags[i] == "--global-batch-size" ||
                                        layout_flags[i] == "--noop-layers"))
      same_model.insert(same_model.end(), {layout_flags[i], layout_flags[i + 1]});
  }
  static std::map<std::tuple<bool, bool, std::vector<std::string>>, std::unique_ptr<LayoutRun>> runs;
  auto& run = runs[{llama, flash, same_model}];
  if (!run) {
    run = std::make_unique<LayoutRun>(llama ? kLlama : kGpt, same_model, make_self_communicator("world"), 0,
                                      RecomputePlan{}, flash);
    run->train(5);
  }
  return *run;
}

// ||shard − slice of reference|| / ||slice of reference|| for one parameter or gradient, over the
// local elements in `ranges` (flat-buffer offsets; the distributed optimizer's owned shards hold
// the only reduced gradients) or all of them when `ranges` is null.
double relative_error(const ParamSpec& shard_spec, const float* shard, const ParamSpec& ref_spec, const float* ref,
                      const std::vector<FlatRange>* ranges = nullptr) {
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < shard_spec.local_numel(); ++i) {
    if (ranges && std::none_of(ranges->begin(), ranges->end(), [&](const FlatRange& r) {
          return r.begin <= shard_spec.offset + i && shard_spec.offset + i < r.end;
        }))
      continue;
    double r = ref[shard_spec.global_index(i)];
    diff += (shard[i] - r) * (shard[i] - r);
    norm += r * r;
  }
  (void)ref_spec;
  return norm > 0.0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

class Invariance : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(Invariance, MatchesSingleProcess) {
  const auto& [name, llama] = GetParam();
  const Layout* layout = testing::find_layout(layouts(), name);
  ASSERT_NE(layout, nullptr);
  Comm world = test::world();
  if (layout->world != world->size()) GTEST_SKIP() << name << " needs " << layout->world << " ranks";
  const auto& model = llama ? kLlama : kGpt;
  const LayoutRun& reference = single_process_run(llama, layout->flags, layout->flash_attention);
  LayoutRun run(model, layout->flags, world, layout->bucket_size, layout->recompute, layout->flash_attention);
  run.train(5);
  finish_param_sync(*run.engine);  // --overlap-param-gather leaves the last all-gather to the next forward
  for (int i = 0; i < 5; ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-5 * reference.losses[i]) << "loss of iteration " << i + 1;
    EXPECT_NEAR(run.grad_norms[i], reference.grad_norms[i], 1e-5 * reference.grad_norms[i])
        << "grad norm of iteration " << i + 1;
  }
  const ParamBuffer& ref = reference.engine->chunks[0]->params();
  for (size_t c = 0; c < run.engine->chunks.size(); ++c) {
    const ParamBuffer& pb = run.engine->chunks[c]->params();
    const std::vector<FlatRange> owned = run.engine->dp_sync[c]->owned_ranges();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      int rid = ref.find(s.name);
      ASSERT_GE(rid, 0) << s.name;
      // Parameters get a looser bound than gradients: AdamW divides each gradient element by its
      // own magnitude, so a mathematically zero gradient (the key part of the QKV bias: softmax
      // ignores a constant added to every key) turns fp32 rounding into ±lr updates.
      EXPECT_LT(relative_error(s, pb.param_data(id), ref.spec(rid), ref.param_data(rid)), 1e-3) << "parameter " << s.name;
      EXPECT_LT(relative_error(s, pb.grad_data(id), ref.spec(rid), ref.grad_data(rid), &owned), 1e-5)
          << "gradient " << s.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Invariance, ::testing::Combine(::testing::ValuesIn(testing::layout_names(layouts())), ::testing::Bool()),
                         testing::layout_model_test_name);

}  // namespace
}  // namespace gale
