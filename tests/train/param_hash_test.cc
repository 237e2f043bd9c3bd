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

}  // namespace
}  // namespace gale
