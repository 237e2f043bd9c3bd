// Megatron's check of parameter hashes across data-parallel replicas
// (--check-weight-hash-across-dp-replicas-interval): equal replicas pass; one changed element on
// one rank fails on every rank with the same one-line error naming the parameter.
#include "train/param_hash.h"

#include <gtest/gtest.h>

#include <mutex>

#include "ckpt/thread_communicator.h"

namespace gale {
namespace {

using testing_util::run_ranks;

// Two chunks as a model would have them; the second has an expert-parallel parameter.
std::vector<ParamBuffer> make_chunks() {
  std::vector<ParamBuffer> chunks(2);
  int c = 0;
  for (ParamBuffer& pb : chunks) {
    for (const char* name : {"decoder.layers.0.mlp.linear_fc1.weight", "decoder.final_layernorm.weight"}) {
      ParamSpec s;
      s.name = std::string(name) + std::to_string(c);
      s.global_shape = {4, 8};
      s.init = InitKind::kNormal;
      s.init_std = 0.02f;
      pb.add(s);
    }
    if (c == 1) {
      ParamSpec e;
      e.name = "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight";
      e.global_shape = {8, 4};
      e.expert_parallel = true;
      pb.add(e);
    }
    pb.finalize();
    pb.initialize(1234);
    ++c;
  }
  return chunks;
}

// Runs the check on `n` thread ranks (the same group for dense and expert parameters); `perturb`
// changes this rank's chunks first. Returns each rank's status message ("ok" when it passed).
std::vector<std::string> check_on_ranks(int n, const std::function<void(int, std::vector<ParamBuffer>&)>& perturb) {
  std::vector<std::string> results(static_cast<size_t>(n));
  std::mutex mu;
  run_ranks(n, [&](Communicator& comm) {
    std::vector<ParamBuffer> chunks = make_chunks();
    perturb(comm.rank(), chunks);
    std::vector<const ParamBuffer*> ptrs;
    for (const ParamBuffer& pb : chunks) ptrs.push_back(&pb);
    Comm group(&comm, [](Communicator*) {});  // not owned
    const Status st = check_param_hashes_across_dp_replicas(ptrs, group, group);
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<size_t>(comm.rank())] = st.ok() ? "ok" : st.message();
  });
  return results;
}

TEST(ParamHash, HashesTheValues) {
  const float a[3] = {1.0f, 2.0f, 3.0f}, b[3] = {1.0f, 2.0f, 3.0000002f};
  EXPECT_EQ(param_hash(a, 3), param_hash(a, 3));
  EXPECT_NE(param_hash(a, 3), param_hash(b, 3));
  EXPECT_NE(param_hash(a, 2), param_hash(a, 3));
}

TEST(ParamHash, EqualReplicasPass) {
  for (const std::string& r : check_on_ranks(3, [](int, std::vector<ParamBuffer>&) {})) EXPECT_EQ(r, "ok");
}

TEST(ParamHash, OneChangedElementStopsEveryRank) {
  const std::string expected =
      "Parameter hashes not matching across DP replicas (data-parallel rank 2 differs from rank 0 in "
      "decoder.final_layernorm.weight1 of model chunk 1)";
  auto results = check_on_ranks(3, [](int rank, std::vector<ParamBuffer>& chunks) {
    if (rank == 2) chunks[1].param_data(1)[5] += 1e-6f;
  });
  for (const std::string& r : results) EXPECT_EQ(r, expected);
  // An expert-parallel parameter is compared over the expert-data-parallel group.
  results = check_on_ranks(2, [](int rank, std::vector<ParamBuffer>& chunks) {
    if (rank == 1) chunks[1].param_data(2)[0] = 7.0f;
  });
  for (const std::string& r : results)
    EXPECT_EQ(r, "Parameter hashes not matching across DP replicas (data-parallel rank 1 differs from rank 0 in "
                 "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight of model chunk 1)");
}

// One chunk with --qk-layernorm's parameters (LayerNorm: weight and bias) in two layers.
std::vector<ParamBuffer> make_qk_chunks() {
  std::vector<ParamBuffer> chunks(1);
  for (int layer = 0; layer < 2; ++layer)
    for (const char* n : {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias",
                          "linear_qkv.weight"}) {
      ParamSpec s;
      s.name = "decoder.layers." + std::to_string(layer) + ".self_attention." + n;
      s.global_shape = {8};
      s.init = InitKind::kNormal;
      s.init_std = 0.02f;
      chunks[0].add(s);
    }
  chunks[0].finalize();
  chunks[0].initialize(99);
  return chunks;
}

// --test-mode's check on `n` thread ranks, the same group standing for data- and tensor-parallel
// (`as_tp` puts it in the tensor-parallel place and a single-rank group in the data-parallel one).
std::vector<std::string> qk_check_on_ranks(int n, bool as_tp,
                                           const std::function<void(int, std::vector<ParamBuffer>&)>& perturb) {
  std::vector<std::string> results(static_cast<size_t>(n));
  std::mutex mu;
  run_ranks(n, [&](Communicator& comm) {
    std::vector<ParamBuffer> chunks = make_qk_chunks();
    perturb(comm.rank(), chunks);
    std::vector<const ParamBuffer*> ptrs{&chunks[0]};
    Comm group(&comm, [](Communicator*) {});
    Comm self = make_self_communicator();
    const Status st = as_tp ? check_qk_layernorm_replicas(ptrs, self, group) : check_qk_layernorm_replicas(ptrs, group, self);
    std::lock_guard<std::mutex> lock(mu);
    results[static_cast<size_t>(comm.rank())] = st.ok() ? "ok" : st.message();
  });
  return results;
}

TEST(TestMode, EqualQkLayernormsPass) {
  for (bool as_tp : {false, true})
    for (const std::string& r : qk_check_on_ranks(3, as_tp, [](int, std::vector<ParamBuffer>&) {})) EXPECT_EQ(r, "ok");
}

TEST(TestMode, ADifferentQkLayernormStopsEveryRankNamingIt) {
  // Layer 1's k_layernorm.bias (id 8) differs on data-parallel rank 2: found; the linear layer's
  // weight (id 4, not a q/k norm) is not compared.
  auto results = qk_check_on_ranks(3, false, [](int rank, std::vector<ParamBuffer>& chunks) {
    chunks[0].param_data(8)[3] = rank == 2 ? 1.5f : 1.0f;
    if (rank == 1) chunks[0].param_data(4)[0] += 1.0f;
  });
  for (const std::string& r : results)
    EXPECT_EQ(r, "--test-mode: discrepancy between decoder.layers.1.self_attention.k_layernorm.bias of model chunk 0 "
                 "in data-parallel ranks 2 and 0 (norm of the difference 0.5)");
  results = qk_check_on_ranks(2, true, [](int rank, std::vector<ParamBuffer>& chunks) {
    chunks[0].param_data(0)[7] = rank == 1 ? 0.75f : 1.0f;
  });
  for (const std::string& r : results)
    EXPECT_EQ(r, "--test-mode: discrepancy between decoder.layers.0.self_attention.q_layernorm.weight of model chunk 0 "
                 "in tensor-parallel ranks 1 and 0 (norm of the difference 0.25)");
  // Without such parameters there is nothing to compare.
  std::vector<std::string> none(2);
  run_ranks(2, [&](Communicator& comm) {
    std::vector<ParamBuffer> chunks = make_chunks();
    std::vector<const ParamBuffer*> ptrs{&chunks[0], &chunks[1]};
    Comm group(&comm, [](Communicator*) {});
    none[static_cast<size_t>(comm.rank())] = check_qk_layernorm_replicas(ptrs, group, group).ok() ? "ok" : "error";
  });
  EXPECT_EQ(none, (std::vector<std::string>{"ok", "ok"}));
}

}  // namespace
}  // namespace gale
