#!/usr/bin/env bash
# What the drop-in layer costs: Debian's perftest run on peercm through `peercm exec`, next
# to `peercm perf` (peercm's own C++ API) for the same operation, mode and size, in the
# default configuration of both (two processes on loopback, no pinning, progress threads).
# perftest connects with -R (rdma_cm) on both transports, as `peercm perf` connects through
# the CM: over RoCE a QP the CM makes between two loopback addresses uses a 4096-byte path MTU,
# where perftest's own exchange and ibv_modify_qp take the port's active MTU, 1024, and move
# four times the packets (ib_write_bw 1 MiB: about 1.3 GB/s against 3.5 with -R).
#   usage: bench/dropin_vs_native.sh [REPEAT]   (default 3; the median of each is reported)
# Figures: latency in µs (perftest's t_typical, the median; perf's median), bandwidth in
# MB/s = 10^6 B/s (perftest's "BW average" is in 2^20 B/s and is converted). The cost is
# drop-in/native - 1 for latency and native/drop-in - 1 for bandwidth: positive when the
# drop-in is slower. Target: at most 10 %.
set -uo pipefail
cd "$(dirname "$0")/.." || exit
repeat=${1:-3}
build=${BUILD:-build/release}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. bench/lib/perftest_dropin.sh

random_address() { echo "127.$((RANDOM % 250 + 1)).$((RANDOM % 250)).$((RANDOM % 250 + 1))"; }

iterations() {  # MODE SIZE
  if [[ $1 == lat ]]; then ((${2} >= 1048576)) && echo 200 || echo 1000
  else ((${2} >= 1048576)) && echo 500 || echo 2000; fi
}

# perftest through the drop-in: prints the figure (µs or MB/s), or nothing on failure.
perftest_figure() {  # TRANSPORT OP MODE SIZE
  local transport=$1 op=$2 mode=$3 size=$4 line
  perftest_pair "$transport" "ib_${op}_${mode}" "$size" "$(iterations "$mode" "$size")"
  line=$(perftest_row)
  [[ -n $line ]] || return 0
  # lat: #bytes #iterations t_min t_max t_typical ...; bw: #bytes #iterations BW_peak BW_average MsgRate
  if [[ $mode == lat ]]; then awk '{print $5}' <<< "$line"; else awk '{printf "%.1f\n", $4 * 1.048576}' <<< "$line"; fi
}

# peercm perf, server and client processes: the same figure.
perf_figure() {  # TRANSPORT OP MODE SIZE
  local transport=$1 op=$2 mode=$3 size=$4 n port bind=()
  n=$(iterations "$mode" "$size")
  port=$(free_port)
  local address=127.0.0.1
  if [[ $transport == roce ]]; then address=$(random_address); bind=(--bind "$address"); fi
  timeout 120 "$peercm" perf --server "${bind[@]}" --port "$port" --once --transport "$transport" \
    > "$work/perf_server.out" 2>&1 &
  local server=$!
  sleep 0.5
  timeout 120 "$peercm" perf --client "$address" --port "$port" --transport "$transport" --op "$op" --mode "$mode" \
    --size "$size" --iters "$n" --json > "$work/perf.json" 2> "$work/perf.err"
  wait "$server"
  python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["peercm"], 2))' "$work/perf.json" 2> /dev/null
}

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}'; }

printf '%-9s %-5s %-4s %8s %12s %12s %7s\n' transport op mode size drop-in native cost
for transport in iwarp roce; do
  for op in send write read; do
    for mode in lat bw; do
      for size in 8 65536 1048576; do
        dropin=() native=()
        for ((r = 0; r < repeat; r++)); do
          dropin+=("$(perftest_figure "$transport" "$op" "$mode" "$size")")
          native+=("$(perf_figure "$transport" "$op" "$mode" "$size")")
        done
        d=$(echo "${dropin[*]}" | median)
        n=$(echo "${native[*]}" | median)
        cost=$(python3 -c '
import sys
d, n, mode = sys.argv[1:4]
if not d or not n: print("-"); sys.exit()
d, n = float(d), float(n)
print("%+.0f%%" % (100 * ((d / n - 1) if mode == "lat" else (n / d - 1))))' "$d" "$n" "$mode")
        printf '%-9s %-5s %-4s %8s %12s %12s %7s\n' "$transport" "$op" "$mode" "$size" "${d:--}" "${n:--}" "$cost"
      done
    done
  done
done
