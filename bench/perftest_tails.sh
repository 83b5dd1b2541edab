#!/usr/bin/env bash
# Latency tails of Debian's perftest run on peercm through `peercm exec`: ib_send_lat and
# ib_write_lat over both transports at 8 B, 64 KiB and 1 MiB, in the default configuration
# (two processes on loopback, no pinning, progress threads, rdma_cm with -R).
#   usage: bench/perftest_tails.sh [RUNS]   (default 3)
# Per row: each run's t_typical (perftest's median) and 99th percentile in µs, then the
# median and the worst run of p99 / typical. Target (issue: RoCE for real use): at most 3.
# -n 2000 round trips, 300 at 1 MiB.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
runs=${1:-3}
build=${BUILD:-build/release}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. bench/lib/perftest_dropin.sh

# Prints "typical p99" of one run, or nothing on failure.
run_once() {  # TRANSPORT OP SIZE
  local size=$3 n=2000
  ((size >= 1048576)) && n=300
  perftest_pair "$1" "ib_${2}_lat" "$size" "$n"
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
  perftest_row | awk '{print $5, $8}'
}

printf '%-6s %-6s %8s  %-58s %s\n' transport op size "runs: typical/p99 us (p99/typical)" "p99/typical: median (worst)"
for transport in roce iwarp; do
  for op in send write; do
    for size in 8 65536 1048576; do
      cells="" ratios=()
      for ((r = 0; r < runs; r++)); do
        read -r typical p99 <<< "$(run_once "$transport" "$op" "$size")"
        if [[ -z ${typical:-} ]]; then
          cells+="failed "
          continue
        fi
        ratio=$(awk -v a="$p99" -v b="$typical" 'BEGIN { printf "%.2f", a / b }')
        cells+="$typical/$p99 ($ratio) "
        ratios+=("$ratio")
      done
      summary=$(printf '%s\n' "${ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END {
        if (NR == 0) { print "-"; exit }
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2f (%.2f)", m, v[NR] }')
      printf '%-6s %-6s %8s  %-58s %s\n' "$transport" "$op" "$size" "$cells" "$summary"
    done
  done
done
