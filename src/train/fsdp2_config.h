// MindSpeed's FSDP2 configuration file (--use-torch-fsdp2 --fsdp2-config-path FILE.yaml): the keys
// Gale reads, those it accepts without effect, and those it refuses; and what Megatron's
// --use-torch-fsdp2 alone means (the defaults below).
//
// The file is MindSpeed's Fsdp2Config as a flat YAML mapping (train/flat_yaml.h). Gale's FSDP2 is
// its ZeRO-3 (optim/zero3_sync.h); a "unit" is one of Gale's parameter groups: the embedding, each
// transformer layer, the head (final norm and output layer). Keys, MindSpeed's default in brackets:
//   sharding_size [the DP size; also `auto`]  an integer ≥ 1 dividing DP: parameters, gradients
//                       and optimizer state sharded over groups of sharding_size consecutive DP
//                       ranks, the shard gradients all-reduced across the groups (HSDP: PyTorch's
//                       2-D (Replicate, Shard) mesh); sharding_size = DP is plain ZeRO-3
//   sub_modules_to_wrap [TransformerLayer, LanguageModelEmbedding, RotaryEmbedding]
//                       the units gathered and released on their own; a unit not listed belongs to
//                       the root, gathered at the start of each forward and kept until the end of
//                       its backward. Names: embedding (or a path ending in LanguageModelEmbedding),
//                       layers (…TransformerLayer), head; …RotaryEmbedding holds no parameter and is
//                       accepted; any other name is refused
//   reshard_after_forward [true]  false: each wrapped unit stays gathered from its forward to its
//                       backward (no second all-gather); an integer (reshard to a smaller group) is
//                       refused, not supported yet
//   num_to_forward_prefetch [0]  n > 0: a wrapped unit's forward starts the all-gathers of the next
//                       n wrapped units (asynchronous, awaited at their forward); as MindSpeed, only
//                       when n < --num-layers (else no prefetch, a notice says so)
//   param_dtype [none: the parameters' own]  PyTorch's MixedPrecisionPolicy.param_dtype: the dtype
//                       of the all-gather and of the unsharded compute copy, the shards staying the
//                       f32 masters. bf16 is Gale's --bf16 arithmetic (required with it): the
//                       transformer layers' linear weights gathered as bf16, what --bf16 reads in f32
//                       (norms, biases, embedding, output layer) as f32 (optim/zero3_sync.h);
//                       --bf16 alone means bf16 (Megatron: Float16Module makes the parameters bf16
//                       before FSDP2 shards them); fp32 with --bf16 is refused
//   reduce_dtype [none: param_dtype's]  the dtype of the gradient reduce-scatter (and of HSDP's
//                       all-reduce): bf16 rounds the scaled gradients to bf16 and sums them as bf16,
//                       the result added to the f32 gradient shard; fp32 reduces in f32
//   output_dtype [none]  fp32 accepted; bf16 refused, not supported yet (Gale's units pass f32
//                       hidden states; --bf16 rounds only the GEMM inputs)
//   fp16 anywhere       refused, not supported yet (Megatron refuses --fp16 with FSDP2: no loss scaling)
//   cast_forward_inputs [true]  a boolean; no effect (the GEMM inputs follow --bf16)
//   offload_to_cpu [false], pin_memory [true]  booleans accepted without effect: Gale trains on
//                       the CPU, its parameters, gradients and optimizer state already are in host
//                       memory (pageable or pinned is a device-copy distinction)
//   ignored_modules     must be empty (FSDP2 leaves an ignored module unsharded and its gradients
//                       unreduced, for frozen modules; Gale trains every parameter): refused
//   recompute_modules   [none] MindSpeed wraps those modules in activation checkpointing: `layers`
//                       (…TransformerLayer) is Gale's --recompute-granularity full
//                       --recompute-method uniform --recompute-num-layers 1 (each layer keeps its
//                       input only and reruns its forward in its backward, while it is gathered);
//                       the embedding and the head are refused, not supported yet
// Any other key, or a value of the wrong type, is an error naming the file and the key.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gale {

struct Arguments;

struct Fsdp2Config {
  int64_t sharding_size = 0;  // 0: the whole data-parallel group
  bool wrap_embedding = true, wrap_layers = true, wrap_head = false;
  bool reshard_after_forward = true;
  int64_t num_to_forward_prefetch = 0;
  bool recompute_layers = false;
  // param_dtype, reduce_dtype, output_dtype: "" (not given), "fp32" or "bf16" (spellings normalised).
  std::string param_dtype, reduce_dtype, output_dtype;
  std::vector<std::string> accepted_without_effect;  // the keys given that change nothing in Gale
};

// FSDP2's mixed precision as a run uses it: from the file's dtypes and --bf16 (resolve_fsdp2_precision).
struct Fsdp2Precision {
  bool param_bf16 = false;   // the all-gather and the compute copy in bf16 (= --bf16)
  bool reduce_bf16 = false;  // the gradient reduction in bf16
};

// The mixed precision of --use-torch-fsdp2 for `a` (its --fsdp2-config-path read again when given):
// the file's param_dtype / reduce_dtype against --bf16, and the refusals above; messages name the
// file and the key.
StatusOr<Fsdp2Precision> resolve_fsdp2_precision(const Arguments& a);
StatusOr<Fsdp2Precision> fsdp2_precision(const Fsdp2Config& config, const Arguments& a);

// Reads and checks `path` (messages name --fsdp2-config-path, the file and the key).
StatusOr<Fsdp2Config> read_fsdp2_config(const std::string& path);
// The same from the file's text (`path` only for messages).
StatusOr<Fsdp2Config> parse_fsdp2_config(const std::string& text, const std::string& path);

// --use-torch-fsdp2's conflicts with the other ways to shard the model and Megatron's own rules
// (pipeline and expert parallelism, the distributed optimizer, --fp16, tied embeddings). Ok, or the
// first found.
Status check_torch_fsdp2_conflicts(const Arguments& a);

}  // namespace gale
