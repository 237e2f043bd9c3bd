// Megatron's rank layout: which global ranks form each tensor/pipeline/data/context/expert group.
//
// A pure computation (no communication), identical to Megatron's parallel_state.RankGenerator:
// a global rank is a mixed-radix number over the dimensions of the order string, the first
// token varying fastest. With the default order tp-cp-ep-dp-pp,
//   rank = tp + TP*(cp + CP*(ep + EP*(dp + DP*pp))).
// `--use-tp-pp-dp-mapping` selects tp-cp-ep-pp-dp. The group for a token set X ("dp", "tp-pp")
// is the set of ranks that agree on every coordinate not in X; groups are listed by the other
// coordinates (first token fastest) and, inside a group, ranks follow the coordinates in X
// (first token fastest). Two generators exist as in Megatron: the dense one (ep = 1, real CP)
// and the expert one (tp = expert TP, ep = EP, dp = world/(ETP*EP*PP), cp = 1), which must have
// the same pipeline groups.
//
// Worked example (docs/parallelism.md): world 8, TP 2, PP 2 -> DP 2, rank = tp + 2*dp + 4*pp;
// TP groups [0,1] [2,3] [4,5] [6,7], DP [0,2] [1,3] [4,6] [5,7], PP [0,4] [1,5] [2,6] [3,7].
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

using RankGroups = std::vector<std::vector<int>>;

// Megatron's RankGenerator over one factorisation of the world.
class RankGenerator {
 public:
  // `order` lists dimensions among tp, cp, ep, dp, pp separated by '-'; dimensions of size 1 may
  // be omitted (they are appended). Errors: unknown or repeated token, a dimension of size > 1
  // missing from the order, a non-positive size, EP and CP both > 1 (Megatron keeps them in
  // separate generators).
  static StatusOr<RankGenerator> create(int tp, int ep, int dp, int pp, int cp, const std::string& order);

  // Every group of the dimensions in `token` ("tp", "dp-cp", "tp-ep-pp", ... in any order).
  RankGroups get_ranks(const std::string& token) const;
  // The coordinate of `rank` along dimension `dim` ("tp", "cp", "ep", "dp" or "pp").
  int coordinate(int rank, const std::string& dim) const;
  int size_of(const std::string& dim) const;
  int world_size() const { return world_size_; }
  const std::string& order() const { return order_; }  // with the appended dimensions
  // "tp + 2*dp + 4*pp": the rank formula over dimensions of size > 1 ("0" for a world of one).
  std::string formula() const;

 private:
  std::string order_;
  std::vector<std::string> dims_;  // in order, fastest first
  std::vector<int> sizes_;         // size of each entry of dims_
  std::vector<int> strides_;       // product of the sizes before it
  int world_size_ = 1;
  int index_of(const std::string& dim) const;
};

// The parallel sizes of a job (the flags), from which every group follows.
struct ParallelSizes {
  int world_size = 1;
  int tp = 1;   // --tensor-model-parallel-size
  int pp = 1;   // --pipeline-model-parallel-size
  int cp = 1;   // --context-parallel-size
  int ep = 1;   // --expert-model-parallel-size
  int etp = 0;  // --expert-tensor-parallel-size (0: same as tp)
  bool use_tp_pp_dp_mapping = false;
};

// Every process group Megatron builds (parallel_state.initialize_model_parallel).
enum class Group : int {
  kTensor = 0,                  // "tp"
  kPipeline,                    // "pp"
  kData,                        // "dp"
  kContext,                     // "cp"
  kDataContext,                 // "dp-cp": gradient reduction and the distributed optimizer's shards
  kModel,                       // "tp-pp": Megatron's model-parallel group
  kTensorDataContext,           // "tp-dp-cp"
  kTensorData,                  // "tp-dp"
  kTensorContext,               // "tp-cp"
  kEmbedding,                   // first and last stage of each pipeline group (tied embedding/output grads)
  kPositionEmbedding,           // first stage of each pipeline group
  kExpert,                      // expert generator "ep"
  kExpertTensor,                // expert generator "tp"
  kExpertTensorExpert,          // expert generator "tp-ep"
  kExpertTensorExpertPipeline,  // expert generator "tp-ep-pp"
  kExpertData,                  // expert generator "dp"
  kCount
};
constexpr int kNumGroups = static_cast<int>(Group::kCount);
// Short names used in logs, CommStats and Communicator::name(): "tp", "dp-cp", "embedding",
// "expert-dp", ...
const char* group_name(Group g);

// One rank's coordinates in the dense and the expert generator.
struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;  // dense generator
  int ep = 0, etp = 0, edp = 0;        // expert generator
};

// The complete layout of a job.
struct RankLayout {
  ParallelSizes sizes;  // etp resolved (never 0)
  int dp = 1;           // world / (tp*pp*cp)
  int expert_dp = 1;    // world / (etp*ep*pp)
  std::string order;    // the dense order, e.g. "tp-cp-ep-dp-pp"
  std::string formula;  // e.g. "tp + 2*dp + 4*pp"
  std::array<RankGroups, kNumGroups> groups;

  const RankGroups& of(Group g) const { return groups[static_cast<int>(g)]; }
  // The group of kind `g` that holds `rank`; empty when none does (the embedding groups leave
  // out middle pipeline stages).
  std::vector<int> group_of(Group g, int rank) const;
  RankCoords coords(int rank) const;

 private:
  friend StatusOr<RankLayout> compute_rank_layout(const ParallelSizes& sizes);
  std::vector<RankCoords> coords_;
};

// Checks the sizes against the world (one-line errors naming the flag) and computes every group.
StatusOr<RankLayout> compute_rank_layout(const ParallelSizes& sizes);

// A readable description for `gale pretrain` to print on rank 0 at start-up: a header line with
// the sizes, order and rank formula, one line per rank (the first `max_rank_lines`) with its
// coordinates, and one line per group kind listing its groups (long lists are shortened).
std::string render_rank_layout(const RankLayout& layout, int max_rank_lines = 64);

}  // namespace gale
