// Megatron's theoretical memory footprint: Gale's lines and megabytes against Megatron main's own
// report_theoretical_memory (tests/data/reference/theoretical_memory.json, written by
// tools/reference/theoretical_memory_reference.py running Megatron's file), and the memory report line.
#include "train/theoretical_memory.h"

#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "train/memory_report.h"

namespace gale {
namespace {

// The arguments Megatron's function reads, from the fixture's Megatron names, into Gale's fields.
Arguments arguments_of(const nlohmann::json& j) {
  Arguments a;
  ModelArgs& m = a.model;
  m.num_layers = j["num_layers"];
  m.hidden_size = j["hidden_size"];
  m.ffn_hidden_size = j["ffn_hidden_size"];
  m.num_attention_heads = j["num_attention_heads"];
  m.kv_channels = j["kv_channels"];
  m.group_query_attention = j["group_query_attention"];
  m.num_query_groups = j["num_query_groups"];
  m.seq_length = j["seq_length"];
  m.padded_vocab_size = j["padded_vocab_size"];
  m.swiglu = j["swiglu"];
  m.normalization = j["normalization"];
  m.untie_embeddings_and_output_weights = j["untie_embeddings_and_output_weights"];
  m.add_bias_linear = j["add_bias_linear"];
  m.mtp_num_layers = j["mtp_num_layers"].is_null() ? kUnset : j["mtp_num_layers"].get<int64_t>();
  m.multi_latent_attention = j["multi_latent_attention"];
  m.q_lora_rank = j["q_lora_rank"].is_null() ? kUnset : j["q_lora_rank"].get<int64_t>();
  m.kv_lora_rank = j["kv_lora_rank"];
  m.qk_head_dim = j["qk_head_dim"];
  m.qk_pos_emb_head_dim = j["qk_pos_emb_head_dim"];
  m.v_head_dim = j["v_head_dim"];
  m.recompute_granularity = j["recompute_granularity"].is_null() ? "" : j["recompute_granularity"].get<std::string>();
  m.is_hybrid_model = j["is_hybrid_model"];
  a.training.micro_batch_size = j["micro_batch_size"];
  MoeArgs& moe = a.moe;
  moe.num_experts = j["num_experts"].is_null() ? kUnset : j["num_experts"].get<int64_t>();
  moe.moe_layer_freq = j["moe_layer_freq"].dump();  // 2 or [0,1,1,1]: the flag's spellings
  moe.moe_ffn_hidden_size = j["moe_ffn_hidden_size"].is_null() ? kUnset : j["moe_ffn_hidden_size"].get<int64_t>();
  moe.moe_router_topk = j["moe_router_topk"];
  moe.moe_shared_expert_intermediate_size = j["moe_shared_expert_intermediate_size"].is_null()
                                                ? kUnset
                                                : j["moe_shared_expert_intermediate_size"].get<int64_t>();
  moe.moe_shared_expert_gate = j["moe_shared_expert_gate"];
  moe.expert_tensor_parallel_size = j["expert_tensor_parallel_size"];
  ParallelArgs& par = a.parallel;
  par.tensor_model_parallel_size = j["tensor_model_parallel_size"];
  par.pipeline_model_parallel_size = j["pipeline_model_parallel_size"];
  par.virtual_pipeline_model_parallel_size = j["virtual_pipeline_model_parallel_size"].is_null()
                                                 ? 1
                                                 : j["virtual_pipeline_model_parallel_size"].get<int64_t>();
  par.expert_model_parallel_size = j["expert_model_parallel_size"];
  par.world_size = j["world_size"];
  par.data_parallel_size = j["data_parallel_size"];
  par.use_distributed_optimizer = j["use_distributed_optimizer"];
  par.sequence_parallel = j["sequence_parallel"];
  return a;
}

TEST(TheoreticalMemory, MatchesMegatronsReport) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/theoretical_memory.json");
  ASSERT_TRUE(in.good());
  const nlohmann::json cases = nlohmann::json::parse(in);
  ASSERT_EQ(cases.size(), 8u);
  for (const nlohmann::json& c : cases) {
    SCOPED_TRACE(c["name"].get<std::string>());
    StatusOr<TheoreticalMemory> got = theoretical_memory(arguments_of(c["args"]), c["num_microbatches"]);
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(got->lines, c["lines"].get<std::vector<std::string>>());
    if (c["megabytes"].is_null()) continue;  // the hybrid model's one line
    // Megatron's megabytes, to the rounding of a different order of the same double operations.
    const std::vector<double> mb = c["megabytes"];
    EXPECT_NEAR(got->weight_and_optimizer_mb, mb[0], 1e-9 * mb[0]);
    EXPECT_NEAR(got->activation_mb, mb[1], 1e-9 * mb[1]);
    EXPECT_NEAR(got->total_mb, mb[2], 1e-9 * mb[2]);
  }
}

TEST(TheoreticalMemory, MalformedMoeLayerFreqIsAnError) {
  std::ifstream in(std::string(GALE_TEST_DATA_DIR) + "/reference/theoretical_memory.json");
  ASSERT_TRUE(in.good());
  Arguments a = arguments_of(nlohmann::json::parse(in)[3]["args"]);
  a.moe.moe_layer_freq = "[1,1]";  // two entries for four layers
  EXPECT_FALSE(theoretical_memory(a, 1).ok());
}

TEST(MemoryReport, MegatronsLine) {
  const AllocatorCounters c{3 * 1024 * 1024 + 512 * 1024, 10 * 1024 * 1024, 4 * 1024 * 1024, 12 * 1024 * 1024 + 1};
  EXPECT_EQ(format_memory_report(3, 20, c),
            "[Rank 3] (after 20 iterations) memory (MB) | allocated: 3.50 | max allocated: 10.00 | reserved: 4.00 | "
            "max reserved: 12.00");
}

TEST(MemoryReport, HostCountersAreOrdered) {
  const AllocatorCounters c = host_allocator_counters();
  EXPECT_LE(c.allocated, c.max_allocated);
  EXPECT_LE(c.reserved, c.max_reserved);
  EXPECT_LE(c.allocated, c.reserved);
}

}  // namespace
}  // namespace gale
