// load_inference_model (train/inference_model.h) on a checkpoint trained with --mtp-num-layers: the
// model is built without its MTP layers, whether the flag comes from the checkpoint's args or the
// command line, and its logits are those of the trained model (whose evaluation forward skips MTP).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ckpt/checkpoint_writer.h"
#include "ckpt/model_checkpoint.h"
#include "ckpt/temp_dir.h"
#include "comm/communicator.h"
#include "train/checkpoint_args.h"
#include "train/inference_model.h"
#include "train/model_setup.h"

namespace gale {
namespace {

using testing_util::TempDir;

Arguments mtp_model_args() {
  Arguments a;
  ModelArgs& m = a.model;
  m.num_layers = 2;
  m.hidden_size = 32;
  m.ffn_hidden_size = 48;
  m.num_attention_heads = 4;
  m.num_kv_heads = 4;
  m.kv_channels = 8;
  m.seq_length = 16;
  m.max_position_embeddings = 16;
  m.normalization = "RMSNorm";
  m.swiglu = true;
  m.position_embedding_type = "rope";
  m.add_bias_linear = false;
  m.untie_embeddings_and_output_weights = true;
  m.padded_vocab_size = 128;
  m.mtp_num_layers = 2;
  return a;
}

TEST(InferenceModel, CheckpointTrainedWithMtpLoadsWithoutTheMtpLayers) {
  TempDir tmp;
  Arguments a = mtp_model_args();
  const ModelConfig c = model_config_from_args(a);
  ASSERT_EQ(c.mtp_num_layers, 2);
  const OpTable ops = reference_ops();
  GPTModel trained(c, single_process_partition(c), &ops);
  trained.params().initialize(7);
  ASSERT_GE(trained.params().find("mtp.layers.1.eh_proj.weight"), 0);
  {
    Comm self = make_self_communicator("world");
    CheckpointWriter w(tmp.file("ckpt"), 3, *self);
    ASSERT_TRUE(add_parameters(w, trained.params()).ok());
    nlohmann::json sections;
    sections["model"] = checkpoint_model_section(c);
    sections["args"] = model_flags_json(a.model);
    sections["trainer"] = {{"iteration", 3}};
    ASSERT_TRUE(w.commit(sections).ok());
  }
  MicroBatch mb;
  mb.B = 1;
  mb.S = 9;
  mb.tokens = {5, 17, 99, 2, 41, 7, 7, 120, 0};
  mb.position_ids.resize(9);
  std::iota(mb.position_ids.begin(), mb.position_ids.end(), 0);
  const Tensor expected = trained.forward_logits(mb, Tensor());
  for (bool from_checkpoint : {true, false}) {
    Arguments args = from_checkpoint ? Arguments{} : mtp_model_args();  // the command line's flags, MTP included
    args.checkpoint.load = tmp.file("ckpt");
    args.checkpoint.use_checkpoint_args = from_checkpoint;
    args.tokenizer.tokenizer_type = "NullTokenizer";
    args.tokenizer.vocab_size = 127;
    args.model.make_vocab_size_divisible_by = 128;
    auto m = load_inference_model(args, 1);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ((*m)->config.mtp_num_layers, 0);
    for (const ParamSpec& s : (*m)->model->params().specs())
      EXPECT_NE(s.name.rfind("mtp.", 0), 0u) << s.name;
    const Tensor logits = (*m)->logits(mb.tokens);
    ASSERT_EQ(logits.numel(), expected.numel());
    double diff = 0;  // the inference model runs the fused kernels, `trained` the reference ones
    for (int64_t i = 0; i < logits.numel(); ++i)
      diff = std::max(diff, static_cast<double>(std::abs(logits.data<float>()[i] - expected.data<float>()[i])));
    EXPECT_LT(diff, 1e-4) << from_checkpoint;
  }
}

}  // namespace
}  // namespace gale
