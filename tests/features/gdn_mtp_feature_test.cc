// Gated DeltaNet models with MTP layers (--experimental-attention-variant gdn --mtp-num-layers;
// train/arguments_gdn.cc):
// accepted when the last decoder layer is a full-attention layer (Megatron's MTP layer takes the
// last decoder layer's spec; Gale's MTP layers are full-attention layers), refused naming the flags
// when it is a GDN layer.
#include <gtest/gtest.h>

#include "features/resolved_features.h"

namespace gale {
namespace {

std::vector<std::string> gdn_mtp_flags(const std::string& freq) {
  return {"--num-layers", "4", "--ffn-hidden-size", "32", "--swiglu", "--normalization", "RMSNorm", "--experimental-attention-variant", "gdn",
          "--linear-attention-freq", freq, "--linear-num-key-heads", "2", "--linear-num-value-heads", "4",
          "--mtp-num-layers", "2"};
}

TEST(GdnMtpFeature, LastDecoderLayerMustBeFullAttention) {
  for (const char* freq : {"2", "4", "[1,1,0,0]"}) {  // 1 1 1 0 .. : the last layer attends
    const Status s = validated_pretrain_args(gdn_mtp_flags(freq));
    EXPECT_TRUE(s.ok()) << freq << ": " << s.to_string();
    ResolvedFeatures r(gdn_mtp_flags(freq));  // the features' checks (feature_dsa.cc) too
    EXPECT_TRUE(r.status.ok()) << freq << ": " << r.status.to_string();
  }
  for (const char* freq : {"[1,1,0,1]", "[0,0,0,1]"}) {
    const Status s = validated_pretrain_args(gdn_mtp_flags(freq));
    ASSERT_FALSE(s.ok()) << freq;
    EXPECT_EQ(s.message(),
              "--experimental-attention-variant gdn with --mtp-num-layers 2: not supported yet when the last decoder "
              "layer is a Gated DeltaNet layer (Megatron's MTP layer takes the last decoder layer's spec; Gale's MTP "
              "layers are full-attention layers)");
  }
}

}  // namespace
}  // namespace gale
