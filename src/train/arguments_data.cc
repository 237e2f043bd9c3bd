// Validation of the data and tokenizer flags (Megatron's rules, plus clear errors where Megatron
// would fail later or loop).
#include "train/arguments.h"

#include <cmath>

#include "data/sft_conversation.h"

namespace gale {

namespace {

// --sft (Megatron-LM main's SFT dataset) and --dataloader-inter-document-masking.
Status validate_sft_args(const Arguments& a) {
  const DataArgs& d = a.data;
  const TokenizerArgs& t = a.tokenizer;
  if (t.tokenizer_type == "SFTTokenizer" && !d.sft)
    return Unimplemented("--tokenizer-type SFTTokenizer without --sft: not supported yet (Gale reads it for "
                         "Megatron's SFT dataset only)");
  if (d.dataloader_inter_document_masking && (d.is_instruction_dataset || a.dpo.is_pairwise_dataset))
    return InvalidArgument("--dataloader-inter-document-masking with ",
                           d.is_instruction_dataset ? "--is-instruction-dataset" : "--is-pairwise-dataset",
                           ": expected GPT pretraining data (Megatron-LM applies it in GPTDataset, to its GPT and "
                           "FIM samples; the instruction and pairwise datasets are MindSpeed-LLM's, which has no "
                           "such flag)");
  if (!d.sft) return Status::Ok();
  if (t.tokenizer_type != "SFTTokenizer")
    return InvalidArgument("--sft: expected --tokenizer-type SFTTokenizer (Megatron's SFT dataset tokenizes "
                           "conversations with it), found ",
                           t.tokenizer_type.empty() ? std::string("GPT2BPETokenizer") : t.tokenizer_type);
  GALE_RETURN_IF_ERROR(parse_sft_prompt_format(d.sft_tokenizer_prompt_format).status());
  if (d.reset_position_ids || d.reset_attention_mask)
    return InvalidArgument("--sft with --reset-position-ids or --reset-attention-mask: expected neither (Megatron's "
                           "SFT dataset asserts both are off: positions and attention follow the conversations)");
  if (d.mock_data)
    return InvalidArgument("--sft with --mock-data: expected --data-path FILE.jsonl (Megatron-LM main has no mock SFT "
                           "dataset: its builder hands SFTDataset the dataset path None, which SFTLowLevelDataset "
                           "cannot load, and fails with 'SFTDataset failed to build as a mock data generator')");
  if (d.fim_data || d.is_instruction_dataset || a.dpo.is_pairwise_dataset)
    return InvalidArgument("--sft with --fim-data, --is-instruction-dataset or --is-pairwise-dataset: expected one "
                           "kind of dataset, found two");
  return Status::Ok();
}

}  // namespace

Status validate_data_args(Arguments& a, const ArgParser& p) {
  DataArgs& d = a.data;
  TokenizerArgs& t = a.tokenizer;
  bool data_path = !d.data_path.empty() || !d.data_args_path.empty();
  bool per_split = !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty();
  if (!d.data_path.empty() && !d.data_args_path.empty())
    return InvalidArgument("--data-path and --data-args-path are exclusive (the file holds the --data-path text)");
  if (per_split && !d.per_split_data_args_path.empty())
    return InvalidArgument("--train/--valid/--test-data-path and --per-split-data-args-path are exclusive");
  per_split = per_split || !d.per_split_data_args_path.empty();
  if (data_path && per_split)
    return InvalidArgument("--data-path and --train-data-path/--valid-data-path/--test-data-path are exclusive");
  if (d.mock_data && (data_path || per_split)) return InvalidArgument("--mock-data and --data-path are exclusive");
  if (!d.mock_data && !data_path && !per_split)
    return InvalidArgument(
        "no training data: give --data-path PREFIX (a .bin/.idx pair made by `gale preprocess`) or --mock-data");
  if (!d.split.empty() && !data_path && !d.mock_data)
    return InvalidArgument("--split is only used with --data-path (each --train/valid/test-data-path is used whole)");
  if (d.split.empty() && data_path) d.split = "969, 30, 1";  // Megatron's legacy default (it warns)
  if (d.dataloader_type == "external")
    return Unimplemented("--dataloader-type external: not supported yet (Megatron hands a user-built data loader "
                         "through); accepted values: single, cyclic");
  if (d.dataloader_type != "single" && d.dataloader_type != "cyclic")
    return InvalidArgument("--dataloader-type: expected single or cyclic, found '", d.dataloader_type, "'");
  if (d.num_workers < 0)
    return InvalidArgument("--num-workers: expected a non-negative integer, found ", d.num_workers);
  if (t.vocab_extra_ids < 0)
    return InvalidArgument("--vocab-extra-ids: expected a non-negative integer, found ", t.vocab_extra_ids);
  if (p.was_set("--vocab-size") && t.vocab_size <= 0)
    return InvalidArgument("--vocab-size: expected a positive integer, found ", t.vocab_size);
  for (const std::string& unsupported : kUnsupportedTokenizerTypes)
    if (t.tokenizer_type == unsupported)
      return Unimplemented("--tokenizer-type ", unsupported, ": not supported yet (Gale reads GPT2BPETokenizer, "
                           "HuggingFaceTokenizer, SentencePieceTokenizer/GPTSentencePieceTokenizer/Llama2Tokenizer, "
                           "TikTokenizer and NullTokenizer)");
  GALE_RETURN_IF_ERROR(validate_sft_args(a));
  if (!std::isfinite(d.mid_level_dataset_surplus) || d.mid_level_dataset_surplus <= -1.0)
    return InvalidArgument("--mid-level-dataset-surplus: expected a finite number > -1 (a blend's datasets get "
                           "ceil(ceil(n*w)*(1+surplus)) samples), found ",
                           d.mid_level_dataset_surplus);
  if (!d.per_dataset_sequences_path.empty() &&
      (d.mock_data || d.sft || d.is_instruction_dataset || a.dpo.is_pairwise_dataset))
    return Unimplemented("--per-dataset-sequences-path with ",
                         d.mock_data ? "--mock-data" : d.sft ? "--sft" : d.is_instruction_dataset
                                                                   ? "--is-instruction-dataset"
                                                                   : "--is-pairwise-dataset",
                         ": not supported (it stands for the .idx headers of GPT pretraining datasets only)");
  d.has_fim_split_sample = p.was_set("--fim-split-sample");
  d.has_fim_fragment_rate = p.was_set("--fim-fragment-rate");
  d.has_fim_no_prefix = p.was_set("--fim-no-prefix");
  if (d.fim_data) {
    if (d.mock_data) return InvalidArgument("--fim-data with --mock-data: Megatron's FIM dataset reads --data-path");
    if (d.is_instruction_dataset)
      return InvalidArgument("--fim-data with --is-instruction-dataset: FIM turns pretraining samples only");
    for (auto [flag, rate] : {std::pair<const char*, double>{"--fim-rate", d.fim_rate}, {"--fim-spm-rate", d.fim_spm_rate}})
      if (!(rate > 0.0 && rate <= 1.0))
        return InvalidArgument(flag, ": expected a probability in (0, 1] (Megatron asserts it is non-zero), found ",
                               rate);
    if (d.has_fim_split_sample && !d.has_fim_fragment_rate)
      return InvalidArgument("--fim-split-sample needs --fim-fragment-rate (the probability of FIM per fragment)");
    if (d.has_fim_fragment_rate && !(d.fim_fragment_rate >= 0.0 && d.fim_fragment_rate <= 1.0))
      return InvalidArgument("--fim-fragment-rate: expected a probability in [0, 1], found ", d.fim_fragment_rate);
    // Virtual pipeline stages and --iterations-to-skip need no refusal: see data/fim_dataset.h.
    const std::string& type = t.tokenizer_type;
    if (type == "SentencePieceTokenizer" || type == "GPTSentencePieceTokenizer" || type == "Llama2Tokenizer")
      return InvalidArgument("--fim-data with --tokenizer-type ", type, ": expected HuggingFaceTokenizer (Megatron-LM "
                             "main's FIM dataset calls ids_to_text(ids, remove_special_tokens=True), which its "
                             "SentencePiece tokenizer does not take: the first sample turned into FIM raises a "
                             "TypeError)");
    if (type == "NullTokenizer")
      return InvalidArgument("--fim-data with --tokenizer-type NullTokenizer: expected HuggingFaceTokenizer (the "
                             "NullTokenizer has no token names, so Megatron cannot look up the --fim-*-token ids)");
    if (type != "HuggingFaceTokenizer" && type != "PretrainedFromHF")
      return Unimplemented("--fim-data with --tokenizer-type ", type.empty() ? std::string("GPT2BPETokenizer") : type,
                           ": not supported yet (Megatron's FIM dataset decodes and re-encodes text with a "
                           "HuggingFaceTokenizer)");
  }
  if (t.tokenizer_type == "NullTokenizer" && t.vocab_size == kUnset)
    return InvalidArgument("--tokenizer-type NullTokenizer needs --vocab-size");
  return Status::Ok();
}

}  // namespace gale
