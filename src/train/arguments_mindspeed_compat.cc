// MindSpeed's flags outside its feature classes: the ones that change nothing in Gale (accepted with
// a note), the band-mask flags of Ascend's flash attention (mapped onto --sliding-window), and the
// flags of MindSpeed's old core_r0.7/r0.8 branches (refused, naming what replaced them).
#include "train/arguments.h"

namespace gale {

namespace {

struct Compat {
  const char* flag;
  bool takes_value;
  const char* note;
};

const std::vector<Compat>& compat_flags() {
  static const std::vector<Compat> compat = {
      {"--use-cp-send-recv-overlap", false,
       "Gale's ring attention always posts the next block's send and receive before computing on the current "
       "block (model/ring_attention.cc)"},
      {"--use-fused-ring-attention-update", false,
       "Gale's ring attention merges each block's output and log-sum-exp into the running result in one pass "
       "(merge_attention_partial)"},
      {"--megatron-cp-in-bnsd", false,
       "the BNSD layout of Ascend's attention kernel; Gale's attention kernels read [S, B, NH, HD] rows"},
      {"--use-fused-moe-token-permute-and-unpermute", false, "Gale's dispatcher permutes tokens in one gather pass"},
      {"--gemm-gradient-accumulation-fusion", false,
       "Gale's expert weight-gradient GEMMs accumulate straight into the fp32 gradient buffer"},
      {"--npu-deterministic", false,
       "Gale's kernels and reductions are deterministic for a given layout and thread count"},
      {"--tokenizer-not-use-fast", false,
       "Gale has one Hugging Face tokenizer, which reads tokenizer.json (the fast tokenizer's file)"},
  };
  return compat;
}

struct Legacy {
  const char* instead;  // what to use in Gale, or "" if nothing replaces it
  std::vector<const char*> flags;
};

// MindSpeed core_r0.7/r0.8 features that MindSpeed master dropped (mindspeed.md §2.8).
const std::vector<Legacy>& legacy_flags() {
  static const std::vector<Legacy> legacy = {
      {"", {"--adaptive-recompute-device-size", "--adaptive-recompute-device-swap",
             "--adaptive-recompute-profiling-step", "--adaptive-memory-optimization"}},
      {"", {"--ampipe-degree", "--ampipe-tp-sp-comm-overlap"}},
      {"the pipeline schedules are --num-layers-per-virtual-pipeline-stage and --schedules-method dualpipev",
       {"--use-nanopipe", "--use-nanopipe-swap"}},
      {"", {"--use-pipe-experts", "--pipe-experts-multi-data", "--pipe-experts-multi-stream"}},
      {"2-D tensor parallelism is --tp-2d --tp-x --tp-y",
       {"--use-nd-matmul", "--nd1-dim1-size", "--nd1-dim2-size", "--nd2-dim1-size", "--nd2-dim2-size"}},
      {"", {"--auto-tuning"}},
      {"", {"--moe-hierarchical-alltoallv", "--moe-bmm-mc2"}},
      {"recompute the MoE activation with --recompute-granularity selective --recompute-modules moe_act",
       {"--moe-adaptive-recompute-activation", "--moe-adaptive-recompute-activation-scale"}},
      {"Gale implements Megatron-Core MoE (--num-experts, --moe-token-dispatcher-type)",
       {"--moe-model-type", "--noisy-gate-policy", "--moe-no-drop", "--moe-dynamic-padding",
        "--enable-token-rearrange-opt"}},
      {"ZeRO-3 is --use-custom-fsdp --data-parallel-sharding-strategy optim_grads_params, or --layerzero",
       {"--enable-zero3"}},
  };
  return legacy;
}

}  // namespace

void add_mindspeed_compat_args(ArgParser& p, MindSpeedCompatArgs& a) {
  for (const Legacy& l : legacy_flags())
    for (const char* flag : l.flags)
      p.add_rejected(flag, std::string("a flag of MindSpeed's core_r0.7/r0.8 branches that MindSpeed master removed; "
                                       "Gale follows master") +
                               (*l.instead ? std::string(" (") + l.instead + ")" : std::string()));
  p.group("compatibility (MindSpeed)");
  for (const Compat& c : compat_flags()) p.add_compat(c.flag, c.takes_value, c.note);
  p.add_compat_list("--virtual-optimizer",
                    "Gale's optimizer state lives in host memory already (MindSpeed maps the Adam moments from host "
                    "memory into the NPU's address space)");
  p.group("attention");
  p.add("--sparse-mode", &a.sparse_mode,
        "MindSpeed: the mask mode of Ascend's flash attention. 0 (default; the causal mask with the "
        "--pre-tockens band), 2 and 3 (causal) and 4 (the band, with --next-tockens 0) are accepted");
  p.add("--pre-tockens", &a.pre_tockens,
        "MindSpeed: how many earlier tokens a query sees (default 65536). Below --seq-length - 1 it is "
        "--sliding-window (pre-tockens + 1)");
  p.add("--next-tockens", &a.next_tockens,
        "MindSpeed: how many later tokens a query sees (default 0; Gale's attention is causal)");
  p.add("--attention-mask-type", &a.attention_mask_type,
        "MindSpeed: causal (the default; with --reset-attention-mask, per document); general (a mask from the "
        "data) is not supported yet");
}

Status validate_mindspeed_compat_args(Arguments& a, const ArgParser& p) {
  const MindSpeedCompatArgs& c = a.mindspeed_compat;
  if (c.attention_mask_type == "general")
    return Unimplemented("--attention-mask-type general: not supported yet (MindSpeed's general mask is an [S, S] "
                         "tensor the user's Python code hands to set_attention_mask, with no flag or file to read it "
                         "from; Gale's attention is causal, per document with --reset-attention-mask, banded with "
                         "--sliding-window, and adaptive_cp_algo skips the empty blocks of those)");
  if (c.attention_mask_type != "causal")
    return InvalidArgument("--attention-mask-type: expected causal or general, found '", c.attention_mask_type, "'");
  const int mode = c.sparse_mode;
  if (mode != 0 && mode != 2 && mode != 3 && mode != 4)
    return InvalidArgument("--sparse-mode ", mode,
                           ": not supported (Gale's attention is causal; expected 0, 2 or 3 for the causal mask, or "
                           "4 for a causal band)");
  if (c.pre_tockens < 0 || c.next_tockens < 0)
    return InvalidArgument("--pre-tockens and --next-tockens: expected non-negative token counts, found ",
                           c.pre_tockens, " and ", c.next_tockens);
  if (mode == 4 && c.next_tockens != 0)
    return InvalidArgument("--sparse-mode 4 with --next-tockens ", c.next_tockens,
                           ": a query would see later tokens; Gale's attention is causal (expected --next-tockens 0)");
  // Modes 0 and 4 restrict each query to the keys i - pre_tockens .. i (mode 0 intersects the band
  // with the causal mask, mode 4 with --next-tockens 0 is that band); modes 2 and 3 ignore it.
  const int64_t S = a.model.seq_length;
  if ((mode == 0 || mode == 4) && S != kUnset && c.pre_tockens + 1 < S) {
    const int64_t window = c.pre_tockens + 1;
    if (p.was_set("--sliding-window") && a.model.sliding_window != window)
      return InvalidArgument("--pre-tockens ", c.pre_tockens, " means --sliding-window ", window, ", but --sliding-window ",
                             a.model.sliding_window, " is given");
    a.model.sliding_window = window;
  }
  return Status::Ok();
}

}  // namespace gale
