// Megatron's own parallelism and optimizer features, as the engine core implements them: listed
// in the registry so `gale features` shows what a command line turns on (their flags belong to
// the distributed/training argument groups).
#include <algorithm>

#include "features/registry.h"
#include "features/simple_feature.h"

namespace gale {

void register_feature_megatron_core(FeatureRegistry& registry) {
  auto add = [&](SimpleFeatureSpec s) { registry.add(std::make_unique<SimpleFeature>(std::move(s))); };
  add({"tensor-parallel", "--tensor-model-parallel-size", FeatureModule::kMegatron, 0,
       "Megatron tensor parallelism (MindSpeed: supported as in Megatron)",
       "column/row-parallel linears, vocab-parallel embedding and cross-entropy", true,
       [](const Arguments& a) { return a.parallel.tensor_model_parallel_size > 1; }});
  add({"sequence-parallel", "--sequence-parallel", FeatureModule::kMegatron, 0, "Megatron sequence parallelism",
       "activations outside attention/MLP split along the sequence inside the TP group", true,
       [](const Arguments& a) { return a.parallel.sequence_parallel; }});
  add({"pipeline-parallel", "--pipeline-model-parallel-size", FeatureModule::kMegatron, 0, "Megatron 1F1B pipeline",
       "layers split into stages with a 1F1B schedule", true,
       [](const Arguments& a) { return a.parallel.pipeline_model_parallel_size > 1; }});
  add({"expert-parallel", "--expert-model-parallel-size", FeatureModule::kMegatron, 0,
       "Megatron-Core expert parallelism (alltoall and allgather token dispatchers)",
       "each rank holds E/EP experts; tokens exchanged all-to-all; expert gradients reduced over expert-DP", true,
       [](const Arguments& a) { return expert_grid_ep_size(a) > 1; }});
  add({"virtual-pipeline", "--num-layers-per-virtual-pipeline-stage", FeatureModule::kMegatron, 0,
       "Megatron interleaved 1F1B", "several model chunks per pipeline rank (interleaved schedule)", true,
       [](const Arguments& a) {
         return a.parallel.num_layers_per_virtual_pipeline_stage != kUnset ||
                a.parallel.num_virtual_stages_per_pipeline_rank != kUnset;
       }});
  add({"data-parallel", "", FeatureModule::kMegatron, 0, "Megatron data parallelism (DDP)",
       "gradients reduced across data-parallel replicas", true,
       [](const Arguments& a) { return a.parallel.data_parallel_size > 1; }});
  add({"distributed-optimizer", "--use-distributed-optimizer", FeatureModule::kMegatron, 0,
       "Megatron distributed optimizer (ZeRO-1)", "optimizer state sharded across data-parallel ranks", true,
       [](const Arguments& a) { return a.parallel.use_distributed_optimizer; }});
  add({"muon", "--optimizer muon", FeatureModule::kMegatron, 0,
       "Megatron-LM Muon (emerging_optimizers; MindSpeed MuonOptimizerFeature, L0)",
       "Newton-Schulz-orthogonalised momentum for the layers' 2-D weights (QKV as separate query, key and "
       "value matrices; TP duplicated, distributed or blockwise; MoE experts each apart; layer-wise with the "
       "distributed optimizer), AdamW for the rest (--muon-scalar-optimizer lion: Lion with --lion-beta1/2)", true,
       [](const Arguments& a) { return a.training.optimizer == "muon"; }});
  add({"qk-clip", "--qk-clip", FeatureModule::kMegatron, 0, "Megatron-Core QK-clip (MuonClip, Kimi K2)",
       "each step's largest pre-softmax attention logit per head (every forward, reduced over data-parallel x "
       "context-parallel ranks); after the optimizer step the query and key rows of linear_qkv of each query group "
       "above --qk-clip-threshold scaled by eta^alpha and eta^(1-alpha), eta = threshold / max logit (MLA: the "
       "rotary query rows by eta, linear_kv_up_proj's key rows); --log-max-attention-logit writes it to "
       "TensorBoard/W&B; not yet with --use-ulysses-allgather-kv or repeated Ulysses key groups, --tp-2d, the "
       "attention output gate, DSA/GDN variants or hybrid models", true,
       [](const Arguments& a) { return a.model.qk_clip; }});
  add({"lion", "--optimizer lion", FeatureModule::kMegatron, 0, "Megatron-LM Lion (emerging_optimizers' Lion)",
       "sign of the interpolated momentum, one state tensor (exp_avg), decoupled weight decay, for the layers' "
       "2-D weights with betas --adam-beta1/--adam-beta2 as Megatron passes them; AdamW for the embedding, output "
       "layer, norms and biases; layer-wise with the distributed optimizer; not with --fp16, ZeRO-2/3, "
       "--swap-optimizer, --compress-optimizer, --quant-states or the precision-aware optimizer", true,
       [](const Arguments& a) { return a.training.optimizer == "lion"; }});
  add({"overlap-grad-reduce", "--overlap-grad-reduce", FeatureModule::kMegatron, 0, "Megatron async DDP",
       "bucketed gradient reduction overlapped with backward", true,
       [](const Arguments& a) { return a.parallel.overlap_grad_reduce; }});
  add({"bf16", "--bf16", FeatureModule::kMemory, 0, "Megatron bf16 mixed precision (MindSpeed: supported)",
       "bf16 weights and GEMM inputs, f32 master weights/gradients/optimizer; halves the GEMM-input activations kept "
       "for backward; bf16 GEMMs use AMX where present", true,
       [](const Arguments& a) { return a.training.bf16; }});
  add({"fp16", "--fp16", FeatureModule::kMemory, 0, "Megatron fp16 mixed precision with loss scaling",
       "f16 weights and GEMM inputs (emulated: widened to f32 for sgemm), f32 master weights/gradients/optimizer; "
       "dynamic or constant (--loss-scale) loss scaling skips overflowing iterations", true,
       [](const Arguments& a) { return a.training.fp16; }});
  add({"overlap-param-gather", "--overlap-param-gather", FeatureModule::kMegatron, 0,
       "Megatron param-gather overlap", "distributed-optimizer parameter all-gather overlapped with forward", true,
       [](const Arguments& a) { return a.parallel.overlap_param_gather; }});
  add({"mhc-connections", "--enable-mhc-connections", FeatureModule::kMegatron, 0,
       "Megatron-Core manifold-constrained hyper-connections (DeepSeek's mHC; HyperConnectionTransformerLayer)",
       "n residual streams (--mhc-num-residual-streams) mixed around every attention and MLP by per-token H_pre, "
       "H_post and a Sinkhorn-projected doubly stochastic H_res (--mhc-sinkhorn-iterations); dense GPT/LLaMA "
       "and MLA models with TP (and SP), DP and CP (every algorithm), --recompute-modules mhc "
       "(--mhc-recompute-layer-num blocks); refused: PP, MTP, MoE and full recomputation (as Megatron), hybrid and "
       "heterogeneous layers (not supported yet; docs/model.md)",
       true, [](const Arguments& a) { return a.model.enable_mhc_connections; }});
  add({"moe-router-force-load-balancing", "--moe-router-force-load-balancing", FeatureModule::kMegatron, 0,
       "Megatron-Core random router logits for MoE benchmarks (apply_random_logits)",
       "the router's logits replaced by N(0, 1) values drawn from Gale's Philox streams by seed, layer, global "
       "token and expert (the same at every parallel layout and rerun; not torch's values), gradient straight "
       "through",
       true, [](const Arguments& a) { return a.moe.moe_router_force_load_balancing; }});
  add({"recompute-granularity", "--recompute-granularity", FeatureModule::kMemory, 0,
       "Megatron activation recomputation (MindSpeed RecomputeMethodFeature, L2)",
       "full: layer groups (--recompute-method uniform|block, --recompute-num-layers) keep only their input and "
       "rerun their forward in backward; selective: --recompute-modules core_attn (the default) changes nothing "
       "(attention probabilities are never kept); layernorm, mlp, moe_act, shared_experts, moe, mla_up_proj and mhc "
       "drop those activations and recompute them in backward (docs/model.md)",
       true, [](const Arguments& a) {
         const ModelArgs& m = a.model;
         if (m.recompute_granularity == "full") return true;
         return m.recompute_granularity == "selective" &&
                std::any_of(m.recompute_modules.begin(), m.recompute_modules.end(),
                            [](const std::string& module) { return module != "core_attn"; });
       }});
}

}  // namespace gale
