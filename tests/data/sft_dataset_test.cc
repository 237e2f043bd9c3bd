// Megatron-LM's --sft samples: every train/valid/test sample of tools/reference/megatron_sft_reference.py
// (Megatron's own SFTDataset, SFTTokenizer and dataset builder) for three prompt formats and CP 2,
// token for token, including the samples on which Megatron raises; and the TrainingSample view.
#include "data/sft_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "data/data_test_util.h"
#include "data/split.h"

namespace gale {
namespace {

const std::string kDir = std::string(GALE_TEST_DATA_DIR) + "/megatron_sft";

std::shared_ptr<const HuggingFaceTokenizer> load_tokenizer() {
  auto t = HuggingFaceTokenizer::load(kDir);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return std::shared_ptr<const HuggingFaceTokenizer>(std::move(*t));
}

TEST(SftDataset, SamplesEqualMegatronsTokenForToken) {
  const auto golden = testing::load_json(kDir + "/golden.json");
  const int64_t S = golden["seq_length"].get<int64_t>();
  auto hf = load_tokenizer();
  auto records = SftRecords::load(kDir + "/conversations.jsonl");
  ASSERT_TRUE(records.ok()) << records.status().message();
  const int64_t N = static_cast<int64_t>((*records)->lines.size());
  ASSERT_EQ(N, 20);
  int checked = 0, errors = 0;
  for (const auto& config : golden["configs"]) {
    SCOPED_TRACE(config["name"].get<std::string>());
    auto format = parse_sft_prompt_format(config["prompt_format"].get<std::string>());
    ASSERT_TRUE(format.ok());
    auto tok = SftTokenizer::create(hf.get(), *format);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_EQ(tok->pad(), config["pad"].get<int32_t>());
    EXPECT_EQ(tok->eod(), config["eod"].get<int32_t>());
    EXPECT_EQ(hf->vocab_size(), config["vocab_size"].get<int64_t>());
    SftSampleOptions o{S, config["context_parallel_size"].get<int64_t>()};
    auto matrix = parse_split(config["split"].get<std::string>());
    ASSERT_TRUE(matrix.ok());
    const char* names[3] = {"train", "valid", "test"};
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(names[i]);
      const auto& split = config["splits"][names[i]];
      auto [begin, end] = split_range(*(*matrix)[i], N);
      EXPECT_EQ(begin, split["lines"][0].get<int64_t>());
      EXPECT_EQ(end, split["lines"][1].get<int64_t>());
      for (const auto& want : split["samples"]) {
        const int64_t k = want["index"].get<int64_t>();
        const int64_t line = begin + k % (end - begin);  // SFTDataset: indices[idx % len(indices)]
        SCOPED_TRACE(k);
        ASSERT_EQ(line, want["line"].get<int64_t>());
        SftSample got;
        Status s = pack_sft_sample(*tok, (*records)->lines[static_cast<size_t>(line)], o, &got);
        if (want.contains("error")) {
          EXPECT_FALSE(s.ok()) << "Megatron: " << want["error"].get<std::string>();
          ++errors;
          continue;
        }
        ASSERT_TRUE(s.ok()) << s.message();
        EXPECT_EQ(got.tokens, want["tokens"].get<std::vector<int32_t>>());
        EXPECT_EQ(got.labels, want["labels"].get<std::vector<int32_t>>());
        EXPECT_EQ(got.position_ids, want["position_ids"].get<std::vector<int32_t>>());
        // Megatron pads cu_seqlens with S and its consumer keeps the entries up to the first S
        // (_merge_cu_seqlens_across_micro_batch), so that is all a sample shows.
        auto first_s = std::find(got.cu_seqlens.begin(), got.cu_seqlens.end(), static_cast<int32_t>(S));
        ASSERT_NE(first_s, got.cu_seqlens.end());
        EXPECT_EQ(std::vector<int32_t>(got.cu_seqlens.begin(), first_s + 1), want["cu_seqlens"].get<std::vector<int32_t>>());
        EXPECT_EQ(got.max_seqlen, want["max_seqlen"].get<int32_t>());
        std::vector<int32_t> mask(got.loss_mask.begin(), got.loss_mask.end());
        EXPECT_EQ(mask, want["loss_mask"].get<std::vector<int32_t>>());
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 30 - errors);
  EXPECT_EQ(errors, 4);  // the empty assistant turn (h-aligned: a turn that tokenizes differently first)
}

TEST(SftDataset, TrainingSampleHasOneDocumentPerConversation) {
  auto hf = load_tokenizer();
  auto records = SftRecords::load(kDir + "/conversations.jsonl");
  ASSERT_TRUE(records.ok());
  auto tok = SftTokenizer::create(hf.get(), SftPromptFormat::kNemotronHAligned);
  ASSERT_TRUE(tok.ok());
  // Line 2 holds two conversations: Megatron's cu_seqlens [0, 39, 96].
  auto ds = make_sft_dataset(*records, hf, *tok, 0, 16, 40, SftSampleOptions{96, 1});
  EXPECT_EQ(ds->size(), 40);
  TrainingSample s;
  ASSERT_TRUE(ds->get(18, &s).ok());  // 18 mod 16 = line 2
  ASSERT_EQ(s.document_ids.size(), 96u);
  for (int i = 0; i < 96; ++i) {
    EXPECT_EQ(s.document_ids[i], i < 39 ? 0 : 1) << i;
    EXPECT_EQ(s.position_ids[i], i < 39 ? i : i - 39) << i;
    if (s.loss_mask[i] == 0.0f) {
      EXPECT_GE(s.labels[i], 0) << "a -100 label must become a valid id";
    }
  }
  EXPECT_FALSE(ds->get(40, &s).ok());
}

TEST(SftDataset, ErrorsNameTheFileLineAndProblem) {
  testing::TempDir dir;
  {
    std::ofstream f(dir.file("bad.jsonl"));
    f << R"({"messages": [{"role": "user", "content": "hi"}]})" << "\n\n"
      << R"({"messages": [{"role": "narrator", "content": "x"}]})" << "\n";
  }
  auto r = SftRecords::load(dir.file("bad.jsonl"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            dir.file("bad.jsonl") + ":3: --sft: expected role system, user, assistant or tool, found 'narrator'");
  {
    std::ofstream f(dir.file("nomsg.jsonl"));
    f << R"({"text": "plain"})" << "\n";
  }
  r = SftRecords::load(dir.file("nomsg.jsonl"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(":1: --sft: expected \"messages\""), std::string::npos);
}

TEST(SftDataset, PromptFormatsAndStrip) {
  EXPECT_EQ(python_strip(" \t\n\u00a0 x y \u3000\r\n"), "x y");
  EXPECT_EQ(python_strip("   "), "");
  std::vector<SftMessage> m = {{"system", " S "}, {"user", "U /think"}, {"assistant", " A "}, {"tool", "T"}};
  EXPECT_EQ(render_sft_messages(SftPromptFormat::kNemotronHAligned, m),
            "<SPECIAL_10>System\nS\n<SPECIAL_11>User\nU /think\n<SPECIAL_11>Assistant\nA\n");
  EXPECT_EQ(render_sft_messages(SftPromptFormat::kNemotronNanoV2, m),
            "<SPECIAL_10>System\nS\n<SPECIAL_11>User\nU\n<SPECIAL_11>Assistant\nA\n<SPECIAL_12>\n");
  EXPECT_EQ(render_sft_messages(SftPromptFormat::kIdentity, m), " S U /think A T");
  auto convs = split_sft_conversations(std::vector<SftMessage>{{"user", "a"}, {"system", "b"}, {"user", "c"}});
  ASSERT_EQ(convs.size(), 2u);
  EXPECT_EQ(convs[0].size(), 1u);
  EXPECT_EQ(convs[1].size(), 2u);
  EXPECT_EQ(parse_sft_prompt_format("default").status().message(),
            "--sft-tokenizer-prompt-format default: not supported yet (it renders the tokenizer's own Jinja "
            "chat_template); Gale has nemotron-h-aligned, nemotron-nano-v2 and identity");
  EXPECT_EQ(parse_sft_prompt_format("chatml").status().message(),
            "--sft-tokenizer-prompt-format: expected nemotron-h-aligned, nemotron-nano-v2, identity or default, found "
            "'chatml'");
}

}  // namespace
}  // namespace gale
