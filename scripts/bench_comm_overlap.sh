#!/usr/bin/env bash
# Measure how well an all-reduce overlaps compute for the MPI progress designs (see
# bench/comm_overlap_bench.cc and docs/parallelism.md §4.3). Run on a quiet machine:
#   scripts/bench_comm_overlap.sh [build-dir]
set -euo pipefail
build="${1:-build}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
for mib in 8 32; do
  OMP_NUM_THREADS=1 mpirun --bind-to none -np 2 "$build/bench/comm_overlap_bench" \
    --mib "$mib" --compute-ms 100 --reps 25
done
