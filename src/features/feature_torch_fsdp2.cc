// Megatron's --use-torch-fsdp2 with MindSpeed's --fsdp2-config-path FILE.yaml
// (TorchFullyShardedDataParallelFeature, level 2) in the registry.
//
// PyTorch FSDP2 on Gale's ZeRO-3 (optim/zero3_sync.h): the parameters, gradients and optimizer
// state sharded over groups of sharding_size consecutive data-parallel ranks (the whole group by
// default; smaller: HSDP, the shard gradients all-reduced across the groups, each group a replica),
// each wrapped unit (by default the embedding and every transformer layer, as Megatron's
// TransformerLayer / LanguageModelEmbedding / RotaryEmbedding) all-gathered for its forward and
// backward and its gradients reduce-scattered after its backward; the units not wrapped (the head
// by default) form FSDP2's root, gathered from the forward's start to the backward's end. The YAML
// keys (train/fsdp2_config.h): sub_modules_to_wrap, reshard_after_forward, num_to_forward_prefetch
// (asynchronous all-gathers of the next wrapped units), recompute_modules [layers] (full
// recomputation, one layer per group), param_dtype / reduce_dtype (bf16: with --bf16, the linear
// weights all-gathered as bf16 from the f32 master shards; reduce-scatter in bf16; output_dtype
// bf16 and fp16 refused), offload/pin accepted without effect on a CPU,
// ignored_modules refused. Without the file: Megatron's
// --use-torch-fsdp2 (whole DP, embedding and layers wrapped, reshard after forward).
//
// Rules: Megatron's (no pipeline or expert parallelism, no distributed optimizer, no --fp16,
// --untie-embeddings-and-output-weights required), no --layerzero or --use-custom-fsdp with it,
// and ZeRO-3's restrictions (docs/parallelism.md §16: DP only; fp32 or, FSDP2 only, --bf16).
// Level 2, as MindSpeed's; below it training is plain data parallelism (a notice says so). The flags belong to the
// distributed argument group (train/arguments.cc). Tests: tests/optim/fsdp2_mpi_test.cc,
// tests/optim/fsdp2_precision_mpi_test.cc, tests/train/fsdp2_config_test.cc.
#include "features/registry.h"
#include "train/fsdp2_config.h"

namespace gale {

namespace {

class TorchFsdp2 : public Feature {
 public:
  std::string name() const override { return "torch-fsdp2"; }
  std::string flag() const override { return "--use-torch-fsdp2"; }
  FeatureModule module() const override { return FeatureModule::kMegatron; }
  int level() const override { return 2; }
  std::string counterpart() const override {
    return "Megatron-LM --use-torch-fsdp2; MindSpeed TorchFullyShardedDataParallelFeature (L2)";
  }
  std::string description() const override {
    return "PyTorch FSDP2 on Gale's ZeRO-3 (--fsdp2-config-path YAML: sharding_size (HSDP below DP), "
           "sub_modules_to_wrap, reshard_after_forward, num_to_forward_prefetch, param_dtype/reduce_dtype bf16 with "
           "--bf16); DP only, untied embeddings; "
           "conflicts with --layerzero, --use-custom-fsdp and the distributed optimizer";
  }
  bool requested(const FeatureContext& ctx) const override { return ctx.args->parallel.use_torch_fsdp2; }
  Status validate(const FeatureContext& ctx) const override { return check_torch_fsdp2_conflicts(*ctx.args); }
};

}  // namespace

void register_feature_torch_fsdp2(FeatureRegistry& registry) { registry.add(std::make_unique<TorchFsdp2>()); }

}  // namespace gale
