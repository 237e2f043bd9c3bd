// PipelineP2P's typed multi-tensor transfers (--use-multiparameter-pipeline-model-parallel) under
// mpirun (2 and 4 ranks, one or two chunks per rank): lists of f32, i32, i64 and bf16 tensors of
// different shapes arrive forward intact and in order, whatever order the receives are posted in;
// backward carries only the gradients of the tensors that require one; and the stages' agreement
// on the lists turns every kind of mismatch (shape, type, name, gradient flag, count) into an error
// on every rank — the mismatching stage's naming both lists and the micro-batch — instead of a hang.
#include <gtest/gtest.h>

#include <cstring>

#include "mpi_test_env.h"
#include "schedule/pipeline_p2p.h"

namespace gale {
namespace {

constexpr int64_t kMicroBatches = 3;

// The list every stage sends for micro-batch m (B = 2, S = 3 + m: shapes differ per micro-batch).
PipeTensorSpecs specs_of(int64_t m) {
  const int64_t S = 3 + m;
  return {{"hidden_states", {2 * S, 5}, DType::kF32, true},
          {"document_ids", {2, S}, DType::kI32, false},
          {"sample_ids", {2}, DType::kI64, false},
          {"image_features", {4, 3}, DType::kBF16, true}};
}

// Element i of the tensor for (stage, micro-batch, tensor k, direction), as raw bits of its type.
uint64_t value_at(int stage, int64_t m, size_t k, bool forward, int64_t i) {
  return static_cast<uint64_t>(((stage * 131 + m) * 17 + static_cast<int64_t>(k)) * 1009 + i) * (forward ? 1 : 7) % 30011;
}

Tensor make(const PipeTensorSpec& s, int stage, int64_t m, size_t k, bool forward) {
  Tensor t = Tensor::empty(s.shape, s.dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const uint64_t v = value_at(stage, m, k, forward, i);
    switch (s.dtype) {
      case DType::kF32: static_cast<float*>(t.raw())[i] = static_cast<float>(v) * 0.25f; break;
      case DType::kI32: static_cast<int32_t*>(t.raw())[i] = static_cast<int32_t>(v); break;
      case DType::kI64: static_cast<int64_t*>(t.raw())[i] = static_cast<int64_t>(v) << 33; break;
      default: static_cast<uint16_t*>(t.raw())[i] = static_cast<uint16_t>(v); break;  // bf16 bits
    }
  }
  return t;
}

void expect_tensor(const Tensor& t, const PipeTensorSpec& s, int stage, int64_t m, size_t k, bool forward) {
  ASSERT_EQ(t.dtype(), s.dtype) << s.name;
  ASSERT_EQ(t.shape(), s.shape) << s.name;
  const Tensor want = make(s, stage, m, k, forward);
  EXPECT_EQ(std::memcmp(t.raw(), want.raw(), t.nbytes()), 0)
      << s.name << " of micro-batch " << m << (forward ? " (forward)" : " (backward)") << " from stage " << stage;
}

// Forward then backward of every micro-batch through all virtual stages of `num_chunks` chunks per
// rank, the receives posted in reverse micro-batch order (tag matching, not posting order, pairs them).
void round_trip(int num_chunks) {
  const Comm& pp = test::world();
  PipelineP2P p2p(pp, num_chunks);
  const auto specs = [](int, int64_t m) { return specs_of(m); };
  ASSERT_TRUE(p2p.agree_on_tensors(specs, specs, kMicroBatches).ok());
  const int last = p2p.num_virtual_stages() - 1;
  // Stage s runs after stage s − 1: walk the stages in order; every rank takes its own chunks' turns.
  for (int stage = 0; stage <= last; ++stage) {
    if (p2p.rank_of(stage) != pp->rank()) continue;
    const int chunk = stage / pp->size();
    if (stage > 0)
      for (int64_t m = kMicroBatches - 1; m >= 0; --m) p2p.post_recv_tensors(true, chunk, m, specs_of(m));
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      const PipeTensorSpecs s = specs_of(m);
      if (stage > 0) {
        const std::vector<Tensor> got = p2p.wait_recv_tensors(true, chunk, m);
        ASSERT_EQ(got.size(), s.size());
        for (size_t k = 0; k < s.size(); ++k) expect_tensor(got[k], s[k], stage - 1, m, k, true);
      }
      if (stage < last) {
        std::vector<Tensor> out;
        for (size_t k = 0; k < s.size(); ++k) out.push_back(make(s[k], stage, m, k, true));
        p2p.send_tensors(true, chunk, m, std::move(out));
      }
    }
  }
  // Backward: the gradient specs (hidden_states and image_features), from the last stage down.
  for (int stage = last; stage >= 0; --stage) {
    if (p2p.rank_of(stage) != pp->rank()) continue;
    const int chunk = stage / pp->size();
    if (stage < last)
      for (int64_t m = kMicroBatches - 1; m >= 0; --m)
        p2p.post_recv_tensors(false, chunk, m, gradient_specs(specs_of(m)));
    for (int64_t m = 0; m < kMicroBatches; ++m) {
      const PipeTensorSpecs g = gradient_specs(specs_of(m));
      ASSERT_EQ(g.size(), 2u);
      if (stage < last) {
        const std::vector<Tensor> got = p2p.wait_recv_tensors(false, chunk, m);
        ASSERT_EQ(got.size(), g.size());
        for (size_t k = 0; k < g.size(); ++k) expect_tensor(got[k], g[k], stage + 1, m, k, false);
      }
      if (stage > 0) {
        std::vector<Tensor> grads;
        for (size_t k = 0; k < g.size(); ++k) grads.push_back(make(g[k], stage, m, k, false));
        p2p.send_tensors(false, chunk, m, std::move(grads));
      }
    }
  }
  p2p.finish();
}

TEST(PipelineMultiP2P, TypedListsTravelForwardAndTheirGradientsBack) {
  const Comm& pp = test::world();
  pp->reset_stats();
  round_trip(1);
  // One message per tensor: 4 forward and 2 backward per micro-batch and stage boundary.
  const int r = pp->rank(), P = pp->size();
  const int64_t handshake = 2;  // the agreement's length and text
  EXPECT_EQ(pp->stats().calls[static_cast<int>(CommOp::kSend)],
            (r < P - 1 ? 4 * kMicroBatches + handshake : 0) + (r > 0 ? 2 * kMicroBatches : 0));
  EXPECT_EQ(pp->stats().calls[static_cast<int>(CommOp::kRecv)],
            (r > 0 ? 4 * kMicroBatches + handshake : 0) + (r < P - 1 ? 2 * kMicroBatches : 0));
}

TEST(PipelineMultiP2P, TypedListsWithTwoChunksPerRank) { round_trip(2); }

// Rank `bad` (the last) expects a list that differs from what its previous stage sends in one way.
struct Mismatch {
  const char* what;
  PipeTensorSpecs expected;
  const char* found_in_message;
};

TEST(PipelineMultiP2P, MismatchedListsAreAnErrorOnEveryRankNotAHang) {
  const Comm& pp = test::world();
  const int bad = pp->size() - 1;
  const PipeTensorSpecs sent = specs_of(1);
  auto changed = [&](auto f) {
    PipeTensorSpecs s = sent;
    f(s);
    return s;
  };
  const std::vector<Mismatch> cases = {
      {"shape", changed([](PipeTensorSpecs& s) { s[0].shape = {8, 6}; }), "hidden_states f32 [8, 6] (grad)"},
      {"dtype", changed([](PipeTensorSpecs& s) { s[1].dtype = DType::kI64; }), "document_ids i64 [2, 4]"},
      {"name", changed([](PipeTensorSpecs& s) { s[2].name = "position_ids"; }), "position_ids i64 [2]"},
      {"gradient flag", changed([](PipeTensorSpecs& s) { s[3].requires_grad = false; }), "image_features bf16 [4, 3]] from"},
      {"count", changed([](PipeTensorSpecs& s) { s.pop_back(); }), "sample_ids i64 [2]]"},
  };
  for (const Mismatch& c : cases) {
    PipelineP2P p2p(pp, 1);
    const auto outputs = [](int, int64_t m) { return specs_of(m); };
    // Micro-batch 1 is the one that differs (0 and 2 match).
    const auto inputs = [&](int, int64_t m) { return pp->rank() == bad && m == 1 ? c.expected : specs_of(m); };
    const Status st = p2p.agree_on_tensors(outputs, inputs, kMicroBatches);
    ASSERT_FALSE(st.ok()) << c.what;
    if (pp->rank() == bad) {
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << c.what;
      const std::string want = "pipeline transfer mismatch (--use-multiparameter-pipeline-model-parallel): virtual stage " +
                               std::to_string(bad) + " (pipeline rank " + std::to_string(bad) +
                               ") expects for micro-batch 1 [";
      EXPECT_EQ(st.message().rfind(want, 0), 0u) << c.what << ": " << st.message();
      EXPECT_NE(st.message().find(c.found_in_message), std::string::npos) << c.what << ": " << st.message();
      EXPECT_NE(st.message().find("from virtual stage " + std::to_string(bad - 1) + " (pipeline rank " +
                                  std::to_string(bad - 1) + "), which sends [" + describe(sent) + "]"),
                std::string::npos)
          << c.what << ": " << st.message();
    } else {
      EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << c.what;
      EXPECT_NE(st.message().find("pipeline rank " + std::to_string(bad) + " found that the tensors its previous "
                                  "stage sends are not the ones it expects"),
                std::string::npos)
          << st.message();
    }
    p2p.finish();
  }
  // After the errors the communicator is clean: a matching agreement succeeds everywhere.
  PipelineP2P p2p(pp, 1);
  const auto specs = [](int, int64_t m) { return specs_of(m); };
  EXPECT_TRUE(p2p.agree_on_tensors(specs, specs, kMicroBatches).ok());
}

TEST(PipelineMultiP2P, SpecDescriptions) {
  EXPECT_EQ(describe(specs_of(0)),
            "hidden_states f32 [6, 5] (grad), document_ids i32 [2, 3], sample_ids i64 [2], image_features bf16 [4, 3] "
            "(grad)");
  EXPECT_EQ(describe(PipeTensorSpecs{}), "no tensors");
  const PipeTensorSpecs g = gradient_specs(specs_of(0));
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "hidden_states");
  EXPECT_EQ(g[1].name, "image_features");
  EXPECT_EQ(hidden_states_spec({4, 8}), (PipeTensorSpec{"hidden_states", {4, 8}, DType::kF32, true}));
}

}  // namespace
}  // namespace gale
