// Megatron-LM main's SFTDataset (megatron/training/datasets/sft_dataset.py, --sft): JSONL
// conversations packed into samples of --seq-length tokens with one attention document per
// conversation.
//
// Input: --data-path FILE.jsonl (the file itself, not a prefix), one JSON object per line with
// "messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...] (other keys
// are ignored; blank lines are skipped). The builder's split (BlendedMegatronDatasetBuilder) cuts
// the lines: split i holds lines [round(a_i·N), round(b_i·N)) of the --split matrix, and sample k
// of a split is line begin + k mod (end − begin), in order (SFTDataset does not shuffle).
//
// Sample of one line (S = --seq-length, pad = the prompt format's pad, CP = --context-parallel-size):
// the line's conversations (data/sft_conversation.h) are tokenized one by one and appended; each
// conversation's positions count from 0; with CP > 1 the pack is padded after each conversation to
// a multiple of 2·CP (pad tokens and pad targets, positions continuing); cu_seqlens gets the pack's
// length after each conversation. When the pack reaches S + 1 tokens it is cut to S tokens plus one
// pad (targets likewise, positions to S + 1), the last cu_seqlens entry becomes S, and later
// conversations are dropped. A shorter pack is padded to S + 1 (positions continuing the last
// conversation's) and its last cu_seqlens entry becomes S: the padding joins the last conversation.
// Then tokens = pack[:-1], labels = targets[1:], position_ids = positions[:-1], loss_mask 0 where
// the label is the pad or -100, max_seqlen the longest cu_seqlens step.
//
// As a TrainingSample: labels of -100 become 0 (their loss mask is 0), and the document id of a
// position is the index of its cu_seqlens segment, so attention stays inside each conversation
// (Megatron's packed-sequence attention over cu_seqlens). Megatron applies RoPE from each
// segment's start; Gale rotates by the position in the sample, which within a segment differs by a
// constant shift and leaves attention unchanged; learned absolute position embeddings read the
// position_ids, which restart per conversation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/sample.h"
#include "data/sft_conversation.h"

namespace gale {

// The lines of one JSONL file. Errors name FILE:LINE and what is wrong.
struct SftRecords {
  std::string path;
  std::vector<std::vector<SftMessage>> lines;
  std::vector<int64_t> line_numbers;  // 1-based line in the file of each record
  static StatusOr<std::shared_ptr<const SftRecords>> load(const std::string& path);
};

struct SftSampleOptions {
  int64_t seq_length = 0;
  int64_t context_parallel_size = 1;
};

// Megatron's sample dict (header comment); cu_seqlens without its padding.
struct SftSample {
  std::vector<int32_t> tokens, labels, position_ids;
  std::vector<float> loss_mask;
  std::vector<int32_t> cu_seqlens;
  int32_t max_seqlen = 0;
};

Status pack_sft_sample(const SftTokenizer& tokenizer, std::span<const SftMessage> messages, const SftSampleOptions& o,
                       SftSample* out);

// The TrainingSample of an SftSample (header comment).
void sft_training_sample(const SftSample& sample, TrainingSample* out);

// One split: lines [begin, end) of `records`, `num_samples` samples (begin < end).
std::unique_ptr<SampleDataset> make_sft_dataset(std::shared_ptr<const SftRecords> records,
                                                std::shared_ptr<const HuggingFaceTokenizer> tokenizer,
                                                const SftTokenizer& sft_tokenizer, int64_t begin, int64_t end,
                                                int64_t num_samples, const SftSampleOptions& options);

}  // namespace gale
