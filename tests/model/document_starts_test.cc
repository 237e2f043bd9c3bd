// Each row's document start (model/document_starts.h) and the causal convolution that reads nothing before it.
#include "model/document_starts.h"

#include <gtest/gtest.h>

#include "model/causal_conv1d.h"

namespace gale {
namespace {

TEST(DocumentStarts, RowsInSequenceMajorOrder) {
  // Sample 0: documents of 2 and 3 positions; sample 1: 1, 1, 3.
  const std::vector<int32_t> ids = {0, 0, 1, 1, 1, /**/ 4, 7, 2, 2, 2};
  const std::vector<int32_t> got = document_starts(ids.data(), 2, 5);
  // row s·2 + b
  EXPECT_EQ(got, (std::vector<int32_t>{0, 0, 0, 1, 2, 2, 2, 2, 2, 2}));
}

TEST(DocumentStarts, ScanStartsOnlyForPackedSequences) {
  MicroBatch mb;
  mb.B = 1;
  mb.S = 4;
  mb.document_ids = {0, 0, 1, 1};
  EXPECT_TRUE(scan_document_starts(mb).empty());  // --reset-attention-mask: the scans run on (Megatron's)
  mb.packed_sequences = true;
  EXPECT_EQ(scan_document_starts(mb), (std::vector<int32_t>{0, 0, 2, 2}));
  // Under context parallelism the whole sequences' ids (the scans' rows after the all-to-all).
  mb.S = 2;
  mb.S_global = 4;
  mb.document_ids = {0, 1};
  mb.key_document_ids = {0, 1, 1, 1};
  EXPECT_EQ(scan_document_starts(mb), (std::vector<int32_t>{0, 1, 1, 1}));
}

// With starts the convolution of a packed row is each document's own: y and the gradients of x,
// w and bias equal those of the documents convolved one by one.
TEST(DocumentStarts, ConvolutionStaysInsideEachDocument) {
  const int64_t C = 2, K = 4, S = 7, B = 1;
  const std::vector<int32_t> ids = {0, 0, 1, 1, 1, 1, 2};
  const std::vector<int32_t> starts = document_starts(ids.data(), B, S);
  std::vector<float> x(S * C), w(C * K), bias(C), dy(S * C);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * static_cast<float>(i) - 0.5f;
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.3f - 0.07f * static_cast<float>(i);
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = 1.0f + 0.2f * static_cast<float>(i % 5);
  bias = {0.25f, -0.5f};
  std::vector<float> y(S * C), dx(S * C, 0.0f), dw(C * K, 0.0f), db(C, 0.0f);
  causal_conv1d_forward_sequences(x.data(), C, w.data(), bias.data(), y.data(), C, K, {ConvSequence{0, 1, S}},
                                  starts.data());
  causal_conv1d_backward(dy.data(), x.data(), C, w.data(), dx.data(), C, dw.data(), db.data(), C, K, S, B,
                         starts.data());
  std::vector<float> ey(S * C), edx(S * C, 0.0f), edw(C * K, 0.0f), edb(C, 0.0f);
  for (const auto& [s0, n] : std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {2, 4}, {6, 1}}) {
    causal_conv1d_forward(x.data() + s0 * C, C, w.data(), bias.data(), ey.data() + s0 * C, C, K, n, 1);
    causal_conv1d_backward(dy.data() + s0 * C, x.data() + s0 * C, C, w.data(), edx.data() + s0 * C, C, edw.data(),
                           edb.data(), C, K, n, 1);
  }
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_FLOAT_EQ(y[i], ey[i]) << "y " << i;
    EXPECT_FLOAT_EQ(dx[i], edx[i]) << "dx " << i;
  }
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(dw[i], edw[i], 1e-5) << "dw " << i;
  for (size_t i = 0; i < bias.size(); ++i) EXPECT_NEAR(db[i], edb[i], 1e-5) << "db " << i;
}

}  // namespace
}  // namespace gale
