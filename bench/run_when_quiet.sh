#!/usr/bin/env bash
# Waits until the machine is idle (other processes use < 10% of the CPUs over 3 s, twice in a row), then runs "$@".
# Benchmarks on a shared machine: usage bench/run_when_quiet.sh [--max-wait SECONDS] COMMAND [ARGS...]
set -euo pipefail
max_wait=1800
if [[ "${1:-}" == "--max-wait" ]]; then max_wait="$2"; shift 2; fi
(($#)) || { echo "usage: $0 [--max-wait SECONDS] COMMAND [ARGS...]" >&2; exit 2; }

busy_percent() {  # CPU time not idle over 3 seconds, in percent of all CPUs
  local a b
  read -r -a a < <(grep '^cpu ' /proc/stat)
  sleep 3
  read -r -a b < <(grep '^cpu ' /proc/stat)
  local total=0 idle i
  for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
  idle=$((b[4] - a[4] + b[5] - a[5]))
  echo $((total > 0 ? 100 * (total - idle) / total : 0))
}

start=$SECONDS
quiet=0
while ((quiet < 2)); do
  if (($(busy_percent) < 10)); then quiet=$((quiet + 1)); else quiet=0; fi
  if ((SECONDS - start > max_wait)); then
    echo "run_when_quiet: the machine stayed busy for ${max_wait}s; running anyway" >&2
    break
  fi
done
exec "$@"
