// MindSpeed's --balanced-moe-experts (BalancedMoEFeature) in the registry: the hottest experts replicated on every EP rank so their tokens are computed locally.
//
// What it does in Gale (model/moe_hot_experts.h, model/moe_layer.h): in every MoE layer and
// micro-batch the all-to-all dispatcher all-gathers the EP ranks' per-expert row counts, picks
// N = --balanced-moe-hot-expert-num hot experts with MindSpeed's greedy rule (repeatedly the busiest
// expert of the busiest EP rank, whose rows then count on the ranks they come from), broadcasts
// their parameters from their owners, computes each rank's own rows of the remote hot experts with
// the replicas (while the other rows are dispatched), and in backward sends the replicas' weight
// gradients to the owners (while the input gradients are combined), which add them to their
// experts' gradients before the backward of the micro-batch returns. M = --trans-hot-expert-group-num
// is the number of duplicate EP groups the transfers run on (the experts of EP rank o on duplicate
// o mod M), reduced to N and to 8 as MindSpeed does.
//
// Requirements as MindSpeed's validate_args (one-line errors): a MoE model, the alltoall dispatcher,
// --moe-grouped-gemm, no --moe-expert-capacity-factor, 0 < N <= num_experts / EP, M > 0. Tighter
// than MindSpeed: EP > 1 (nothing to replicate without it), expert-TP size 1 (MindSpeed has it
// through --moe-fb-overlap), and not yet with --enable-expert-placement, --moe-zero-memory,
// --moe-tp-extend-ep, --reuse-fp32-param or --qat-scheme. Looser: MindSpeed requires
// --moe-fb-overlap because its implementation lives in the fb-overlap MoE layer; Gale's lives in the
// all-to-all dispatcher itself, so it runs under any schedule (and with --moe-fb-overlap under
// DualPipeV, where the replicas' work runs between the interleaving points like the local experts').
#include <algorithm>
#include <cmath>

#include "core/log.h"
#include "features/registry.h"

namespace gale {

namespace {

constexpr int64_t kMaxHotExpertGroups = 8;  // MindSpeed's MAX_GROUP_NUM

class BalancedMoeExpertsFeature : public Feature {
 public:
  std::string name() const override { return "balanced-moe-experts"; }
  std::string flag() const override { return "--balanced-moe-experts"; }
  FeatureModule module() const override { return FeatureModule::kKeyScenarios; }
  int level() const override { return 2; }
  std::string counterpart() const override { return "MindSpeed BalancedMoEFeature (L2)"; }
  std::string description() const override {
    return "the N hottest experts of each MoE layer and micro-batch broadcast to every EP rank, their tokens computed "
           "where they are (not sent through the all-to-all), the replicas' gradients returned to the owners; the same "
           "math per token; needs EP > 1, alltoall, --moe-grouped-gemm, dropless, ETP 1";
  }
  void register_args(ArgParser& parser) override {
    parser.add_flag("--balanced-moe-experts", &on_,
                    "MindSpeed: replicate the hottest experts on every EP rank so that their tokens are computed "
                    "locally (needs --expert-model-parallel-size > 1, --moe-token-dispatcher-type alltoall, "
                    "--moe-grouped-gemm)");
    parser.add("--balanced-moe-hot-expert-num", &hot_,
               "hot experts replicated per MoE layer and micro-batch (default 3; at most num_experts / EP)");
    parser.add("--trans-hot-expert-group-num", &groups_,
               "duplicate EP groups the hot experts' transfers run on (default 3; reduced to the hot expert number "
               "and to 8)");
  }
  bool requested(const FeatureContext& ctx) const override {
    return on_ || ctx.parser->was_set("--balanced-moe-hot-expert-num") ||
           ctx.parser->was_set("--trans-hot-expert-group-num");
  }
  Status validate(const FeatureContext& ctx) const override {
    const Arguments& a = *ctx.args;
    const MoeArgs& m = a.moe;
    const ParallelArgs& par = a.parallel;
    if (!on_)
      return InvalidArgument(ctx.parser->was_set("--balanced-moe-hot-expert-num") ? "--balanced-moe-hot-expert-num"
                                                                                   : "--trans-hot-expert-group-num",
                             " needs --balanced-moe-experts, found it off");
    if (m.num_experts <= 0)
      return InvalidArgument("--balanced-moe-experts needs --num-experts (a MoE model), found no --num-experts");
    if (par.expert_model_parallel_size <= 1)
      return InvalidArgument("--balanced-moe-experts: expected --expert-model-parallel-size greater than 1, found ",
                             par.expert_model_parallel_size);
    if (m.moe_token_dispatcher_type != "alltoall")
      return InvalidArgument("--balanced-moe-experts: expected --moe-token-dispatcher-type alltoall (as MindSpeed), "
                             "found ", m.moe_token_dispatcher_type);
    if (!m.moe_grouped_gemm)
      return InvalidArgument("--balanced-moe-experts needs --moe-grouped-gemm (as MindSpeed), found no --moe-grouped-gemm");
    if (!std::isnan(m.moe_expert_capacity_factor) && m.moe_expert_capacity_factor >= 0)
      return InvalidArgument("--balanced-moe-experts conflicts with --moe-expert-capacity-factor (as MindSpeed: "
                             "dropless only), found ", m.moe_expert_capacity_factor);
    const int64_t local = m.num_experts / par.expert_model_parallel_size;
    if (hot_ <= 0 || hot_ > local)
      return InvalidArgument("--balanced-moe-hot-expert-num: expected 1 to num_experts / expert-model-parallel-size = ",
                             m.num_experts, " / ", par.expert_model_parallel_size, " = ", local, " (as MindSpeed), found ",
                             hot_);
    if (groups_ <= 0)
      return InvalidArgument("--trans-hot-expert-group-num: expected a positive integer, found ", groups_);
    const int64_t etp =
        m.expert_tensor_parallel_size == kUnset ? par.tensor_model_parallel_size : m.expert_tensor_parallel_size;
    if (etp != 1)
      return InvalidArgument("--balanced-moe-experts needs expert-tensor-parallel size 1 (--expert-tensor-parallel-size "
                             "1, or no --tensor-model-parallel-size), found ", etp);
    const auto no = [](const std::string& what) {
      return Unimplemented("--balanced-moe-experts with ", what, ": not supported yet");
    };
    if (ctx.parser->was_set("--enable-expert-placement")) return no("--enable-expert-placement");
    if (ctx.parser->was_set("--moe-zero-memory")) return no("--moe-zero-memory");
    if (m.moe_tp_extend_ep) return no("--moe-tp-extend-ep");
    if (m.moe_pad_expert_input_to_capacity) return no("--moe-pad-expert-input-to-capacity");
    if (ctx.parser->was_set("--reuse-fp32-param")) return no("--reuse-fp32-param");
    if (ctx.parser->was_set("--qat-scheme")) return no("--qat-scheme");
    return Status::Ok();
  }
  Status apply(const FeatureContext& ctx, EngineSetup& setup) const override {
    setup.ops->moe_hot_experts = hot_;
    const int64_t groups = std::min({groups_, hot_, kMaxHotExpertGroups});  // as MindSpeed, with its warning
    if (groups != groups_)
      warn_rank0(str_cat("--trans-hot-expert-group-num ", groups_, " is greater than ",
                         groups_ > hot_ ? "--balanced-moe-hot-expert-num " : "the maximum ",
                         groups_ > hot_ ? hot_ : kMaxHotExpertGroups, ": using ", groups));
    setup.ops->moe_hot_expert_groups = groups;
    return Status::Ok();
  }

 private:
  bool on_ = false;
  int64_t hot_ = 3;     // MindSpeed's defaults
  int64_t groups_ = 3;
};

}  // namespace

void register_feature_balanced_moe_experts(FeatureRegistry& registry) {
  registry.add(std::make_unique<BalancedMoeExpertsFeature>());
}

}  // namespace gale
