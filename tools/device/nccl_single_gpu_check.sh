#!/bin/bash
# Builds the NCCL communicator and tests/comm/nccl_communicator_test.cc on a GPU machine without MPI or Gale's
# Debian packages (the device tool's H200 image: nvcc, and NCCL inside its PyTorch), and runs the test.
#
# Here, once: echo /.devck/ >> .git/info/exclude; mkdir -p .devck; cp -r /usr/src/googletest/googletest .devck/
# Then on the device (carry .devck): bash tools/device/nccl_single_gpu_check.sh
# The core and comm sources are the only ones it compiles; world.cc's MPI entry points are given
# a stand-in that refuses (the test never starts under mpirun). Writes $OUT/nccl_test.log when OUT is set.
set -x
R=$PWD
B=/tmp/nccl_check
mkdir -p $B
nvidia-smi -L
nvcc --version | tail -2
NCCL=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])")
CUDART=$(find / -name 'libcudart.so*' 2>/dev/null | head -1)
CUDAINC=$(dirname "$(find / -name cuda_runtime.h 2>/dev/null | head -1)")
cat > $B/no_mpi.cc <<'CC'
#include "comm/mpi_communicator.h"
namespace gale {
StatusOr<Comm> init_mpi_world() { return Unimplemented("no MPI in this device-check build"); }
void set_distributed_timeout(double) {}
}  // namespace gale
CC
CXX="g++ -std=c++20 -O2 -w -DGALE_HAVE_CUDA -I$R/src -I$R/tests -I$CUDAINC -I$NCCL/include -I$R/.devck/googletest/include -I$R/.devck/googletest"
for f in core/check core/log core/status core/trace core/allocator core/memory_history comm/communicator \
         comm/self_communicator comm/launcher comm/serial_executor comm/world comm/nccl_communicator; do
  $CXX -c src/$f.cc -o $B/$(echo $f | tr / _).o || echo "COMPILE FAILED: $f" &
done
$CXX -c .devck/googletest/src/gtest-all.cc -o $B/gtest-all.o &
$CXX -c .devck/googletest/src/gtest_main.cc -o $B/gtest_main.o &
$CXX -c $B/no_mpi.cc -o $B/no_mpi.o &
$CXX -c tests/comm/nccl_communicator_test.cc -o $B/test.o || echo "COMPILE FAILED: test" &
wait
g++ $B/*.o -o $B/nccl_test "$CUDART" -Wl,-rpath,"$(dirname "$CUDART")" "$(ls $NCCL/lib/libnccl.so* | head -1)" \
    -Wl,-rpath,$NCCL/lib -lpthread -fopenmp || echo "LINK FAILED"
$B/nccl_test 2>&1 | tee ${OUT:-$B}/nccl_test.log
exit ${PIPESTATUS[0]}
