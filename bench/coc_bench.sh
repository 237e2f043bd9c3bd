#!/usr/bin/env bash
# Times a TP 2 + sequence-parallel training step of a small GPT with and without chunked TP overlap
# (--use-ascend-coc --coc-parallel-num N, docs/parallelism.md §3.2) under mpirun: the mean
# "elapsed time per iteration" of iterations 3..ITERS for each chunk count. Run on a quiet machine:
#   [CHUNKS="8 4 2 1"] bench/coc_bench.sh [build-dir] [iters]   (CHUNKS: the order, to expose load drift)
# Figures on the 2-core development VM (AMD EPYC, AVX2, shared with other builds; 2 ranks x 1 OpenMP
# thread; 6 layers, hidden 512, 8 heads, seq 512, micro-batch 2, global batch 8), ms per iteration,
# 2026-12-02, CHUNKS="8 4 2 1", 5 iterations, load average 2.2-4.2 during the run:
#   chunks 8: 14957   chunks 4: 15319   chunks 2: 14570   chunks 1 (plain): 13598
# i.e. no gain, the chunked runs 7-13% slower (smaller GEMMs, 4-32 messages per linear instead of one,
# and the MPI communication thread competing with the two ranks' GEMMs for the 2 cores: nothing
# runs on separate hardware). An earlier run in the order 1 2 4 8 under a falling load (7.7 -> 2)
# showed 28710 / 21969 / 20151 / 14764 ms: the load's drift, not the chunks (the reverse order
# above shows it). docs/parallelism.md §3.2.
set -euo pipefail
build="${1:-build}"
iters="${2:-8}"
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"  # before OMP_NUM_THREADS (nproc reads it)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
model=(--num-layers 6 --hidden-size 512 --num-attention-heads 8 --seq-length 512 --max-position-embeddings 512
       --micro-batch-size 2 --global-batch-size 8 --train-iters "$iters" --lr 1e-4 --mock-data --vocab-size 8192
       --log-interval 1 --eval-iters 0 --tensor-model-parallel-size 2 --sequence-parallel)
for chunks in ${CHUNKS:-1 2 4 8}; do
  extra=()
  [ "$chunks" -gt 1 ] && extra=(--use-ascend-coc --coc-parallel-num "$chunks")
  ms=$(mpirun --oversubscribe --bind-to none -np 2 "$build/bin/gale" pretrain "${model[@]}" "${extra[@]}" 2>&1 |
       grep -o 'elapsed time per iteration (ms): *[0-9.]*' | awk 'NR > 2 {s += $NF; n++} END {printf "%.1f", s / n}')
  echo "chunks $chunks: $ms ms per iteration"
done
