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
peercm=$build/tools/peercm/peercm
# perftest 4.5-0.17's -R client races the server's second rdma_listen (tests/dropin/run_case.sh):
# this library, preloaded into the client, gives the server a head start.
head_start=$build/tests/dropin/libdropin_connect_head_start.so
if [[ ! -x $peercm || ! -e $build/dropin/libibverbs.so.1 || ! -e $head_start ]]; then
  cmake --preset release > /dev/null && cmake --build "$build" --target peercm_tool peercm_dropin_ibverbs \
    peercm_dropin_rdmacm peercm_dropin_mlx5 peercm_dropin_efa dropin_connect_head_start > /dev/null || exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wait_tcp() {
  local i
  for ((i = 0; i < 50; i++)); do
    ss -Hltn "sport = :$1" 2> /dev/null | grep -q . && return 0
    sleep 0.1
  done
  return 1
}

# Prints "typical p99" of one run, or nothing on failure.
run_once() {  # TRANSPORT OP SIZE
  local transport=$1 op=$2 size=$3 n=2000 port device
  ((size >= 1048576)) && n=300
  port=$(python3 scripts/lib/free_port.py)
  if [[ $transport == iwarp ]]; then device=peercm_iw0; else device=peercm_roce0; fi
  "$peercm" exec --transport "$transport" -- timeout 120 "ib_${op}_lat" -d "$device" -R -p "$port" -s "$size" \
    -n "$n" > "$work/server.out" 2>&1 &
  local server=$!
  # iWARP: the rdma_cm listener is a TCP socket; RoCE's is the UDP 4791 one: a pause
  if [[ $transport == iwarp ]]; then wait_tcp "$port"; else sleep 1; fi
  "$peercm" exec --transport "$transport" -- env "LD_PRELOAD=${LD_PRELOAD:+$LD_PRELOAD:}$head_start" \
    timeout 120 "ib_${op}_lat" -d "$device" -R -p "$port" -s "$size" -n "$n" 127.0.0.1 > "$work/client.out" 2>&1
  wait "$server"
  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%
  grep -a -A1 '#bytes' "$work/client.out" | grep -a -E '^\s*[0-9]' | head -1 | awk '{print $5, $8}'
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
