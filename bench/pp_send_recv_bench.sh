#!/usr/bin/env bash
# Pipeline point-to-point time per training step with and without --optimize-send-recv-comm
# (docs/parallelism.md §6.5): `gale pretrain` at PP 2 and PP 4 under mpirun with Megatron's level-2
# timers; for each run, the mean over iterations 3..ITERS of the per-iteration sums of the largest
# (across ranks) forward-recv + backward-recv (time blocked waiting for a transfer) and forward-send + backward-send
# (time posting one), in ms, and the mean elapsed time per iteration. The two variants alternate
# (plain, flag, flag, plain) so that a drifting machine load hits both alike. Usage:
#   bench/pp_send_recv_bench.sh [build-dir] [iters]
set -euo pipefail
build="${1:-build}"
iters="${2:-6}"
echo "# $(date -u +%FT%TZ) $(nproc) cores, load: $(cut -d' ' -f1-3 /proc/loadavg)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
model=(--num-layers 4 --hidden-size 256 --num-attention-heads 8 --seq-length 256 --max-position-embeddings 256
       --micro-batch-size 1 --global-batch-size 8 --train-iters "$iters" --lr 1e-4 --mock-data --vocab-size 4096
       --log-interval 1 --eval-iters 0 --timing-log-level 2 --timing-log-option max)
run() {  # run NP EXTRA...: "recv send step" in ms
  local np="$1"
  shift
  mpirun --oversubscribe --bind-to none -np "$np" "$build/bin/gale" pretrain "${model[@]}" \
    --pipeline-model-parallel-size "$np" "$@" 2>&1 | awk -v skip=2 '
      /elapsed time per iteration \(ms\):/ { it++; if (it > skip) { split($0, a, "elapsed time per iteration \\(ms\\): *"); split(a[2], b, " "); step += b[1]; n++ } }
      it > skip && /(forward|backward)-recv / { split($0, a, ": "); recv += a[2] }
      it > skip && /(forward|backward)-send / { split($0, a, ": "); send += a[2] }
      END { printf "%.1f %.2f %.1f\n", recv / n, send / n, step / n }'
}
for np in 2 4; do
  for variant in plain flag flag plain; do
    extra=()
    [ "$variant" = flag ] && extra=(--optimize-send-recv-comm)
    read -r recv send step < <(run "$np" "${extra[@]}")
    echo "PP $np $variant: p2p wait (recv) $recv ms, posting (send) $send ms, step $step ms"
  done
done
