// Every other flag of Megatron's pretrain_gpt.py parser: accepted where it changes nothing in Gale,
// refused with its reason where Gale lacks it, rejected with Megatron's own error where Megatron
// rejects it. tests/train/megatron_flags_test.cc checks that no Megatron flag is unknown.
#include "train/arguments.h"

namespace gale {

namespace {

struct Reason {
  const char* why;
  std::vector<const char*> flags;
};

// Flags Gale knows and does not implement (yet): "<flag>: not supported yet (<why>)".
const std::vector<Reason>& unsupported_flags() {
  static const std::vector<Reason> reasons = {
      {"Transformer Engine userbuffer settings; --tp-comm-overlap itself runs Gale's chunked TP overlap",
       {"--tp-comm-overlap-cfg", "--tp-comm-overlap-rs-dgrad", "--tp-comm-bootstrap-backend",
        "--disable-tp-comm-bulk-dgrad", "--disable-tp-comm-bulk-wgrad", "--disable-tp-comm-overlap-ag",
        "--disable-tp-comm-overlap-rs", "--disable-tp-comm-split-ag", "--disable-tp-comm-split-rs"}},
      {"FP8 training options beyond Megatron's emulated FP8 recipes (--fp8-format, model/fp8.h)",
       {"--keep-fp8-transpose-cache-when-using-custom-fsdp",
        // MindSpeed's FP8 options of its Transformer Engine API, and its online comparison of the
        // quantised casts and GEMMs against a CPU or BF16 reference.
        "--fp8-reuse-quantized-weight", "--no-use-gmm-fp8", "--te-gmm-mode", "--te-comparison-with-cpu",
        "--te-comparison-with-bf16"}},
      {"legacy Megatron models (Gale implements the MCore GPT model)", {"--use-legacy-models"}},
      {"encoder-decoder models",
       {"--encoder-num-layers", "--decoder-num-layers", "--encoder-seq-length", "--decoder-seq-length",
        "--encoder-tensor-model-parallel-size", "--encoder-pipeline-model-parallel-size",
        "--pipeline-model-parallel-split-rank"}},
      {"CUDA graphs", {"--enable-cuda-graph", "--cuda-graph-scope", "--cuda-graph-warmup-steps", "--external-cuda-graph"}},
      {"Megatron-FSDP's unit and meta-device settings (--use-custom-fsdp runs "
       "--data-parallel-sharding-strategy no_shard and optim)",
       {"--suggested-communication-unit-size", "--init-model-with-meta-device"}},
      {"ADLR autoresume (use --exit-signal-handler or --exit-duration-in-mins)",
       {"--adlr-autoresume", "--adlr-autoresume-interval"}},
      {"the legacy distributed-optimizer checkpoint layout (deprecated by Megatron in February 2024)",
       {"--ckpt-convert-update-legacy-dist-opt-format"}},
      {"the DeepEP (flex) token dispatcher", {"--moe-enable-deepep"}},
      {"datasets on S3", {"--s3-cache-path"}},
      {"process groups initialised outside Gale", {"--lazy-mpu-init"}},
      {"per-group NCCL communicator settings", {"--nccl-communicator-config-path"}},
      {"ring-exchange pipeline communication (a custom PyTorch build)", {"--use-ring-exchange-p2p"}},
      {"the workload inspector server", {"--run-workload-inspector-server"}},
      {"multimodal rotary embeddings", {"--mrope-section"}},
  };
  return reasons;
}

// Flags of Megatron's other models and tools: "<flag>: <message>".
const std::vector<Reason>& rejected_flags() {
  static const std::vector<Reason> reasons = {
      {"a flag of Megatron's BERT, T5, retrieval and vision models; gale pretrain trains GPT models "
       "(pretrain_gpt.py)",
       {"--bert-embedder-type", "--bert-load", "--bert-no-binary-head", "--biencoder-projection-dim",
        "--biencoder-shared-query-context-model", "--block-data-path", "--classes-fraction",
        "--data-per-class-fraction", "--dino-bottleneck-size", "--dino-freeze-last-layer", "--dino-head-hidden-size",
        "--dino-local-crops-number", "--dino-local-img-size", "--dino-norm-last-layer", "--dino-teacher-temp",
        "--dino-warmup-teacher-temp", "--dino-warmup-teacher-temp-epochs", "--embedding-path", "--evidence-data-path",
        "--ict-head-size", "--ict-load", "--img-h", "--img-w", "--indexer-batch-size", "--indexer-log-interval",
        "--iter-per-epoch", "--mask-factor", "--mask-prob", "--mask-type", "--num-channels", "--num-classes",
        "--output-bert-embeddings", "--patch-dim", "--query-in-block-prob", "--relative-attention-max-distance",
        "--relative-attention-num-buckets", "--retriever-report-topk-accuracies", "--retriever-score-scaling",
        "--retriever-seq-length", "--retro-add-retriever", "--retro-attention-gate", "--retro-cyclic-train-iters",
        "--retro-encoder-attention-dropout", "--retro-encoder-hidden-dropout", "--retro-encoder-layers",
        "--retro-no-verify-neighbor-count", "--retro-num-neighbors", "--retro-num-retrieved-chunks",
        "--retro-project-dir", "--short-seq-prob", "--swin-backbone-type", "--titles-data-path",
        "--use-one-sent-docs", "--vision-backbone-type", "--vision-pretraining", "--vision-pretraining-type"}},
      {"a flag of gale preprocess (Megatron's tools/preprocess_data.py), which splits the sentences of the "
       "datasets it writes",
       {"--split-sentences"}},
      // Megatron's own errors for its removed flags (validate_args).
      {"no longer valid, use --micro-batch-size instead", {"--batch-size"}},
      {"no longer valid, use --lr-warmup-fraction instead", {"--warmup"}},
      {"no longer valid, use --tensor-model-parallel-size instead", {"--model-parallel-size"}},
      {"no longer valid, use --recompute-activations, or, for more control, --recompute-granularity and "
       "--recompute-method",
       {"--checkpoint-activations"}},
      {"a legacy ONNX-export switch of Megatron's legacy models", {"--onnx-safe"}},
  };
  return reasons;
}

struct Compat {
  const char* flag;
  bool takes_value;
  const char* note;
};

// Flags of existing Megatron/MindSpeed scripts that change nothing in Gale: accepted, and reported
// at start-up with the reason.
const std::vector<Compat>& compat_flags() {
  static const std::vector<Compat> compat = {
      {"--use-mcore-models", false, "Gale implements the Megatron-Core GPT model"},
      {"--attention-softmax-in-fp32", false, "Gale always computes the attention softmax in fp32"},
      {"--no-masked-softmax-fusion", false,
       "Gale has no separate masked-softmax kernel; fused attention is --use-flash-attn"},
      {"--no-gradient-accumulation-fusion", false,
       "Gale always writes weight gradients straight into the fp32 gradient buffer"},
      {"--no-create-attention-mask-in-dataloader", false, "Gale never materialises attention masks"},
      {"--no-bias-swiglu-fusion", false, "the fused SwiGLU kernel is --use-fused-swiglu (MindSpeed)"},
      {"--no-rope-fusion", false, "the fused RoPE kernel is --use-fused-rotary-pos-emb (MindSpeed)"},
      {"--no-persist-layer-norm", false, "Gale has one fused LayerNorm kernel (level 1)"},
      {"--fp16-lm-cross-entropy", false, "Gale computes the cross entropy in fp32 from f32 logits"},
      {"--apply-query-key-layer-scaling", false,
       "Gale computes the attention softmax in fp32, where this scaling changes nothing"},
      {"--num-dataset-builder-threads", true, "Gale builds dataset indices in C++ at start-up"},
      {"--deterministic-mode", false,
       "Gale's kernels and reductions are deterministic for a given layout and thread count"},
      {"--auto-detect-ckpt-format", false,
       "Gale always detects the format of --load / --pretrained-checkpoint: its own, or Megatron's torch, "
       "torch_dist or torch_dcp format (docs/formats/megatron-checkpoint.md)"},
      {"--ckpt-fully-parallel-load", false, "every rank reads only the tensor pieces it holds"},
      {"--no-ckpt-fully-parallel-save", false, "every rank writes the shard of the pieces it holds"},
      {"--use-persistent-ckpt-worker", false,
       "Gale writes each --async-save from a background thread of the training process"},
      {"--no-overlap-p2p-communication", false,
       "Gale's pipeline sends are non-blocking and its receives posted ahead (schedule/pipeline_p2p.h)"},
      {"--overlap-p2p-communication-warmup-flush", false,
       "Gale's pipeline sends are non-blocking in every phase of the schedule (schedule/pipeline_p2p.h)"},
      {"--moe-permute-fusion", false, "Gale's dispatcher permutes tokens in one gather pass"},
      {"--moe-per-layer-logging", false,
       "per-layer MoE losses are not logged separately; the log line shows their mean over layers"},
      {"--attention-backend", true,
       "Gale has one attention kernel per level: the reference, or flash attention with --use-flash-attn"},
      {"--moe-use-legacy-grouped-gemm", false, "Gale has one grouped-GEMM implementation (--moe-grouped-gemm)"},
      {"--no-use-layer-wise-param-layout", false,
       "Gale's layer-wise distributed Muon always deals whole parameters to the ranks ping-pong, the layout this "
       "flag selects (docs/parallelism.md 8.2)"},
      // Deprecated in Megatron and without effect there.
      {"--no-async-tensor-model-parallel-allreduce", false, "deprecated in Megatron and ignored there"},
      {"--use-dist-ckpt", false, "deprecated in Megatron and ignored there (--ckpt-format chooses the format)"},
      {"--dist-ckpt-format", true, "deprecated in Megatron and ignored there (--ckpt-format chooses the format)"},
      {"--ckpt-fully-parallel-save", false, "deprecated in Megatron and ignored there (parallel save is the default)"},
      {"--moe-extended-tp", false, "deprecated in Megatron and ignored there (--expert-tensor-parallel-size)"},
      {"--moe-layer-recompute", false,
       "deprecated in Megatron and ignored there (--recompute-granularity selective --recompute-modules moe)"},
      {"--sample-rate", true, "read by no Megatron training code"},
      // PyTorch, CUDA and Python details with no counterpart in a C++ CPU engine.
      {"--manual-gc", false, "Python's garbage collector; Gale is C++ and frees memory as it goes"},
      {"--manual-gc-interval", true, "Python's garbage collector; Gale is C++ and frees memory as it goes"},
      {"--no-manual-gc-eval", false, "Python's garbage collector; Gale is C++ and frees memory as it goes"},
      {"--empty-unused-memory-level", true, "torch.cuda.empty_cache(); Gale's allocator returns freed blocks itself"},
      {"--train-sync-interval", true, "CPU-GPU synchronisation; Gale's training steps are synchronous"},
      {"--logging-level", true, "Python's logging level; Gale's output is the Megatron log"},
      {"--local-rank", true, "the torch launcher's rank; Gale takes ranks from MPI"},
      {"--use-cpu-initialization", false,
       "Gale initialises every parameter on the CPU from a counter-based RNG: the same values for any layout"},
      {"--no-initialization", false, "initialisation is cheap in Gale, and --load overwrites it"},
      {"--no-clone-scatter-output-in-embedding", false, "a PyTorch autograd memory detail"},
      {"--no-scatter-gather-tensors-in-pipeline", false, "Gale sends whole activations between pipeline stages"},
      {"--pipeline-model-parallel-comm-backend", true, "Gale's pipeline sends use the job's communicator (MPI or NCCL)"},
      {"--te-rng-tracker", false, "Gale's dropout draws from its own counter-based RNG (docs/model.md)"},
      {"--inference-rng-tracker", false, "Gale's dropout draws from its own counter-based RNG (docs/model.md)"},
      {"--inference-batch-times-seqlen-threshold", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching", false, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching-buffer-guaranteed-fraction", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching-buffer-overflow-factor", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching-buffer-size-gb", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching-max-requests-override", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-dynamic-batching-max-tokens-override", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-max-requests", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--inference-max-seq-length", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--max-tokens-to-oom", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--flash-decode", false, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--num-speculative-tokens", true, "a flag of Megatron's inference engine: `gale generate` takes it (docs/model.md); training ignores it"},
      {"--disable-bf16-reduced-precision-matmul", false, "Gale's bf16 GEMMs always accumulate in fp32"},
      {"--fp32-residual-connection", false, "under --bf16 and --fp16 Gale keeps the residual stream in fp32"},
      {"--disable-gloo-process-groups", false, "Gale creates no Gloo process groups"},
      {"--cross-entropy-fusion-impl", true,
       "native and te compute the same loss; Gale's fused cross entropy is --cross-entropy-loss-fusion"},
      {"--ckpt-assume-constant-structure", false, "Gale's saves keep no cached save plan to reuse"},
      {"--dist-ckpt-strictness", true, "Gale refuses a checkpoint whose tensors do not match the model"},
      // When data-parallel collectives start, or whether 1/DP is applied inside them: the values
      // change only by rounding, or not at all.
      {"--ddp-average-in-collective", false, "Gale scales gradients by 1/DP once, before the reduction"},
      {"--no-gradient-reduce-div-fusion", false, "Gale scales gradients by 1/DP once, before the reduction"},
      {"--ddp-pad-buckets-for-high-nccl-busbw", false, "bucket padding for NCCL bus bandwidth changes no values"},
      {"--no-align-grad-reduce", false, "when each pipeline stage starts its gradient reduction changes no values"},
      {"--no-align-param-gather", false, "when each pipeline stage starts its parameter all-gather changes no values"},
      {"--defer-embedding-wgrad-compute", false,
       "when the output layer's weight gradient is computed changes no values"},
      {"--wgrad-deferral-limit", true, "when the output layer's weight gradient is computed changes no values"},
      // Gale trains on the CPU: the optimizer and its state are in host memory already.
      {"--optimizer-cpu-offload", false, "Gale's optimizer and its state are in host memory already"},
      {"--optimizer-offload-fraction", true, "Gale's optimizer and its state are in host memory already"},
      {"--use-torch-optimizer-for-cpu-offload", false, "Gale's optimizer and its state are in host memory already"},
      {"--overlap-cpu-optimizer-d2h-h2d", false, "Gale's optimizer and its state are in host memory already"},
      {"--no-pin-cpu-grads", false, "pinned memory matters only for copies to a GPU"},
      {"--no-pin-cpu-params", false, "pinned memory matters only for copies to a GPU"},
      // NVIDIA's OneLogger telemetry, which Megatron itself skips when its package is not installed.
      {"--head-lr-mult", true, "Megatron applies it only in its vision fine-tuning task, not in pretrain_gpt.py"},
      {"--apply-residual-connection-post-layernorm", false,
       "read only by Megatron's legacy models; Megatron-Core's GPT layers (Gale's model) ignore it"},
      {"--no-one-logger", false, "Gale has no OneLogger telemetry"},
      {"--one-logger-project", true, "Gale has no OneLogger telemetry"},
      {"--one-logger-run-name", true, "Gale has no OneLogger telemetry"},
      {"--one-logger-async", false, "Gale has no OneLogger telemetry"},
      {"--app-tag-run-name", true, "Gale has no OneLogger telemetry"},
      {"--app-tag-run-version", true, "Gale has no OneLogger telemetry"},
      {"--no-position-embedding", false,
       "deprecated in Megatron: no effect with --position-embedding-type rope, an error otherwise"},
  };
  return compat;
}

}  // namespace

void add_megatron_compat_args(ArgParser& p, MegatronCompatArgs& a) {
  for (const Reason& r : unsupported_flags())
    for (const char* flag : r.flags) p.add_unsupported(flag, r.why);
  for (const Reason& r : rejected_flags())
    for (const char* flag : r.flags) p.add_rejected(flag, r.why);
  p.group("compatibility");
  for (const Compat& c : compat_flags()) p.add_compat(c.flag, c.takes_value, c.note);
  p.add_list("--spec", &a.spec,
             "Megatron's layer-spec module and name: only megatron.core.models.mamba.mamba_layer_specs "
             "mamba_stack_spec (what pretrain_mamba.py needs) with --is-hybrid-model; other custom specs are not "
             "supported yet");
  p.add_choice("--output-logit-dtype", &a.output_logit_dtype, {"bf16", "fp32"},
               "Megatron's output dtype of the output layer's GEMM: bf16 rounds the logits to bf16 before the "
               "cross entropy (and their gradient before the output layer's backward); default: its input's, f32 "
               "in Gale (its output layer multiplies f32 inputs), as fp32");
  p.add("--moe-router-dtype", &a.moe_router_dtype,
        "routing precision: fp32 is accepted (Gale's router computes in fp32); fp64 is not supported yet");
  // Implementation choices: Gale has one transformer implementation, which stands for both.
  p.group("model");
  p.add_choice("--transformer-impl", &a.transformer_impl, {"local", "transformer_engine"},
               "accepted for compatibility: Gale has one implementation of both");
  p.group("training");
  p.add("--yaml-cfg", &a.yaml_cfg,
        "Megatron's YAML argument file: it replaces the command line, whose other flags are ignored "
        "(train/yaml_cfg.h)");
}

Status validate_megatron_compat_args(const Arguments& a, const ArgParser& p) {
  const MegatronCompatArgs& c = a.megatron_compat;
  if (p.was_set("--moe-router-dtype")) {
    if (c.moe_router_dtype == "fp64")
      return Unimplemented("--moe-router-dtype fp64: not supported yet (Gale's router computes in fp32)");
    if (c.moe_router_dtype != "fp32")
      return InvalidArgument("--moe-router-dtype: expected fp32 or fp64, found '", c.moe_router_dtype, "'");
  }
  // Megatron's DistributedDataParallel: per-token gradients are summed, never averaged, in the collective.
  if (a.training.calculate_per_token_loss && p.was_set("--ddp-average-in-collective"))
    return InvalidArgument("--ddp-average-in-collective cannot be used with --calculate-per-token-loss (the "
                           "gradients are summed over data-parallel ranks, then divided by the loss tokens)");
  // Megatron's validate_args: the hybrid device optimizer reuses the precision-aware optimizer's path.
  if (p.was_set("--optimizer-cpu-offload") && !a.training.use_precision_aware_optimizer)
    return InvalidArgument("--optimizer-cpu-offload must be used with --use-precision-aware-optimizer (Megatron's "
                           "rule: its hybrid device optimizer reuses that code path)");
  // Megatron's validate_args: the deprecated switch only with RoPE (which has no position table).
  if (p.was_set("--no-position-embedding") && a.model.position_embedding_type != "rope")
    return InvalidArgument("--no-position-embedding is deprecated, use --position-embedding-type (found ",
                           a.model.position_embedding_type, ")");
  return Status::Ok();
}

}  // namespace gale
