// Inference of a --softmax-type learnable model (attention sinks) through the serving engine
// (train/inference_engine.h): static batches and dynamic batching (ragged requests joining
// mid-flight, with and without flash-decode steps) give every request, at every step, the logits
// (within 1e-4 relative) and greedy tokens of rerunning its whole sequence.
#include "train/inference_engine.h"

#include <gtest/gtest.h>

#include "model/tiny_model_training.h"
#include "train/engine_decoding_check.h"

namespace gale {
namespace {

ModelConfig sink_llama() {
  ModelConfig c = testing::tiny_llama_config();  // RoPE, GQA
  c.max_positions = 48;
  c.softmax_type = SoftmaxType::kLearnable;
  return c;
}

// The sink logits drawn larger than init_std: each takes a real share of its rows.
void widen_sinks(GPTModel& m) {
  ParamBuffer& pb = m.params();
  for (int id = 0; id < pb.size(); ++id)
    if (pb.spec(id).name.find("core_attention.softmax_offset") != std::string::npos)
      for (int64_t h = 0; h < pb.spec(id).local_numel(); ++h) pb.param_data(id)[h] = 1.5f * static_cast<float>(h % 3) - 1.0f;
}

class SoftmaxTypeEngineTest : public testing::EngineDecodingTest {
 protected:
  void SetUp() override { set_up(sink_llama(), widen_sinks, {5, 1, 17, 40, 3, 12, 2, 9}); }
};

TEST_F(SoftmaxTypeEngineTest, StaticBatchesGiveTheFullForwardLogitsAndTokens) {
  EngineOptions o = options(8);
  o.max_requests = 3;
  StatusOr<EngineResult> r = run_inference_engine(*model_, prompts_, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  testing::expect_full_forward_tokens(prompts_, *r, o, check_);
}

TEST_F(SoftmaxTypeEngineTest, DynamicBatchingGivesTheFullForwardTokens) {
  for (int64_t flash : {0, 3}) {
    SCOPED_TRACE(flash);
    EngineOptions o = options(10);
    o.flash_decode_chunk = flash;
    EngineResult r;
    testing::expect_dynamic_batching_gives_full_forward_tokens(*model_, prompts_, o, check_, &r);
  }
}

}  // namespace
}  // namespace gale
