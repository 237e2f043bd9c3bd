// The flags of Megatron-LM main's pretrain_gpt.py parser that core_v0.12.1 lacks: run where they mean something on
// Gale's engine, accepted with a start-up note where they change nothing here, refused with their reason otherwise.
// tests/train/megatron_main_flags_test.cc checks that none of tests/data/reference/megatron_flags_main.txt is unknown.
#include "train/arguments.h"
#include "train/param_group_map.h"

namespace gale {

namespace {

struct Reason {
  const char* why;
  std::vector<const char*> flags;
};

// "<flag>: not supported yet (<why>)".
const std::vector<Reason>& unsupported_main_flags() {
  static const std::vector<Reason> reasons = {
      {"a setting of Megatron's dynamic inference engine (its paged KV cache, CUDA graphs, prefix caching, "
       "scheduling, coordinator and text-generation server), which Gale's inference (gale generate, the GRPO "
       "rollouts) does not have",
       {"--inference-dynamic-batching-paused-buffer-size-gb", "--inference-dynamic-batching-mamba-memory-ratio",
        "--inference-dynamic-batching-block-size", "--inference-dynamic-batching-max-requests",
        "--inference-dynamic-batching-max-tokens", "--inference-dynamic-batching-num-cuda-graphs",
        "--inference-dynamic-batching-track-paused-request-events",
        "--inference-dynamic-batching-track-generated-token-events",
        "--inference-dynamic-batching-unified-memory-level", "--inference-dynamic-batching-prefix-caching",
        "--no-inference-dynamic-batching-prefix-caching", "--inference-dynamic-batching-prefix-caching-eviction-policy",
        "--inference-dynamic-batching-prefix-caching-coordinator-policy",
        "--inference-dynamic-batching-prefix-caching-routing-alpha",
        "--inference-dynamic-batching-prefix-caching-mamba-gb",
        "--inference-dynamic-batching-cuda-graph-mixed-prefill-count",
        "--inference-dynamic-batching-cuda-graph-sizing-distribution", "--inference-dynamic-batching-sampling-backend",
        "--inference-dynamic-batching-async-sched-mode", "--inference-dynamic-batching-logprobs-mode",
        "--decode-only-cuda-graphs", "--inference-cuda-graph-all-prefills", "--inference-cuda-graph-max-tokens",
        "--enable-chunked-prefill", "--inference-logging-step-interval", "--inference-text-gen-server-logging",
        "--no-inference-text-gen-server-logging", "--inference-wandb-logging", "--no-inference-wandb-logging",
        "--inference-coordinator-port", "--mamba-inference-conv-states-dtype", "--mamba-inference-ssm-states-dtype",
        "--inference-use-synchronous-zmq-collectives", "--no-inference-use-synchronous-zmq-collectives",
        "--inference-disable-ep-consensus", "--no-inference-disable-ep-consensus", "--inference-shards",
        "--use-legacy-static-engine"}},
      {"in-process restart (nvidia-resiliency-ext's inprocess wrapper); Gale's fault tolerance is "
       "--enable-ft-package, which ends a hung job for a restart from its last checkpoint",
       {"--inprocess-restart", "--inprocess-max-iterations", "--inprocess-monitor-thread-interval",
        "--inprocess-monitor-process-interval", "--inprocess-progress-watchdog-interval",
        "--inprocess-heartbeat-interval", "--inprocess-soft-timeout", "--inprocess-hard-timeout",
        "--inprocess-heartbeat-timeout", "--inprocess-barrier-timeout", "--inprocess-completion-timeout",
        "--inprocess-last-call-wait", "--inprocess-termination-grace-time", "--inprocess-granularity",
        "--inprocess-active-world-size", "--inprocess-empty-cuda-cache"}},
      {"OpenTelemetry traces and metrics; Gale's timings are --timing-log-level and --profile",
       {"--otel-enabled", "--otel-service-name", "--otel-span-groups"}},
      {"CUDA graphs (of the layers' modules, or of the optimizer step)", {"--cuda-graph-modules", "--optimizer-cuda-graph"}},
      {"NCCL user-buffer and symmetric-memory registration of communication buffers",
       {"--use-nccl-ub", "--disable-symmetric-registration", "--fsdp-manual-registration", "--gtp-remat-nccl-ub",
        "--gtp-expert-remat-nccl-ub"}},
      {"generalized tensor parallelism's weight rematerialisation (GTP)",
       {"--gtp-remat-reduce-scatter-with-fp32-accumulation"}},
      {"Megatron-FSDP's implementation version, buffer dtypes, double buffering and HSDP settings (--use-custom-fsdp "
       "runs --data-parallel-sharding-strategy no_shard, optim, optim_grads and optim_grads_params in fp32)",
       {"--megatron-fsdp-version", "--megatron-fsdp-main-params-dtype", "--megatron-fsdp-main-grads-dtype",
        "--megatron-fsdp-grad-comm-dtype", "--megatron-fsdp-enable-fine-grained-param-gather",
        "--megatron-fsdp-max-pool-double-buffer", "--fsdp-db-use-persist-buf-on-alloc-fail", "--fsdp-double-buffer",
        "--enable-full-sharding-in-hsdp", "--outer-dp-sharding-strategy"}},
      {"FP8 training options beyond Megatron's emulated FP8 recipes (--fp8-format, model/fp8.h)",
       {"--keep-fp8-transpose-cache", "--reuse-grad-buf-for-mxfp8-param-ag"}},
      {"FP4 (NVFP4) training", {"--fp4-param-gather"}},
      {"per-module precision configurations of Transformer Engine and NVIDIA Kitchen; Gale's precision flags are "
       "--fp8-format, --fp8-recipe and --qat-scheme",
       {"--te-precision-config-file", "--kitchen-config-file", "--kitchen-recipe-number"}},
      {"datasets on object storage (S3, Multi-Storage Client)", {"--object-storage-cache-path"}},
  };
  return reasons;
}

struct Compat {
  const char* flag;
  bool takes_value;
  const char* note;
};

// Accepted, and reported at start-up with the reason.
const std::vector<Compat>& compat_main_flags() {
  static const std::vector<Compat> compat = {
      {"--enable-experimental", false,
       "Megatron gates only its experimental Python APIs and the Triton kernels of --moe-permute-fusion's "
       "routing-map padding behind it (the same values as without); no Gale feature is experimental in that sense"},
      {"--dist-ckpt-workers", true,
       "Gale writes each rank's checkpoint shard from one background thread (--async-save); the number of writer "
       "processes changes nothing in the files"},
      {"--ckpt-drop-redundant-extra-state", false,
       "Gale's checkpoints hold no Transformer Engine _extra_state objects; the only such state it has, the delayed "
       "FP8 recipe's amax history, is what Megatron keeps with this flag too"},
      {"--disable-msc", false,
       "deprecated in Megatron: the Multi-Storage Client is off by default (and --enable-msc with it stays off)"},
  };
  return compat;
}

}  // namespace

void add_megatron_main_args(ArgParser& p, Arguments& a) {
  for (const Reason& r : unsupported_main_flags())
    for (const char* flag : r.flags) p.add_unsupported(flag, r.why);
  p.group("compatibility");
  for (const Compat& c : compat_main_flags()) p.add_compat(c.flag, c.takes_value, c.note);
  p.add_flag("--enable-msc", &a.megatron_compat.enable_msc,
             "Megatron's Multi-Storage Client for object-storage paths: not supported yet (no effect with "
             "--disable-msc, as Megatron)");
  p.group("checkpointing");
  p.add("--dump-param-to-param-group-map", &a.training.dump_param_to_param_group_map,
        "at start-up, write Megatron's parameter -> optimizer param-group index map (a PyTorch Distributed "
        "Checkpoint of {global parameter name: group index}) to this directory (train/param_group_map.h)");
  p.group("distributed");
  p.add_flag("--torch-fsdp2-no-reshard-after-forward", &a.parallel.torch_fsdp2_no_reshard_after_forward,
             "--use-torch-fsdp2: keep each unit's gathered parameters from its forward to its backward (ZeRO-2 "
             "style) instead of freeing them after the forward");
}

Status validate_megatron_main_args(const Arguments& a, const ArgParser& p) {
  if (a.megatron_compat.enable_msc && !p.was_set("--disable-msc"))
    return Unimplemented("--enable-msc: not supported yet (Megatron's Multi-Storage Client for object-storage "
                         "checkpoint and data paths; Gale reads and writes local files)");
  if (a.parallel.torch_fsdp2_no_reshard_after_forward && !a.parallel.use_torch_fsdp2)
    return InvalidArgument("--torch-fsdp2-no-reshard-after-forward configures FSDP2: expected --use-torch-fsdp2");
  GALE_RETURN_IF_ERROR(check_param_group_map_args(a));
  return Status::Ok();
}

}  // namespace gale
