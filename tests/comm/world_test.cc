// Choosing the world communicator: without a launcher it is the single-process world; bad
// --distributed-backend / --distributed-timeout-minutes values are one-line errors naming the flag.
#include <gtest/gtest.h>

#include <cstdlib>

#include "comm/communicator.h"

namespace gale {
namespace {

TEST(InitWorld, WithoutALauncherItIsTheSelfWorld) {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS", "SLURM_NTASKS"})
    unsetenv(v);
  StatusOr<Comm> w = init_world("mpi");
  ASSERT_TRUE(w.ok()) << w.status().to_string();
  EXPECT_STREQ((*w)->backend(), "self");
  EXPECT_EQ((*w)->size(), 1);
  EXPECT_EQ((*w)->make_group({}, "none"), nullptr);
  EXPECT_NE((*w)->make_group({0}, "tp"), nullptr);
}

TEST(InitWorld, BadFlagValues) {
  StatusOr<Comm> bad = init_world("ucc");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "--distributed-backend: expected one of mpi, nccl, gloo; found 'ucc'");
  StatusOr<Comm> zero = init_world("mpi", 0.0);
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().message(), "--distributed-timeout-minutes: expected a positive number, found 0");
}

}  // namespace
}  // namespace gale
