#!/usr/bin/env bash
# fi_pingpong's latency over libfabric's verbs provider on peercm (iWARP and RoCE, through
# `peercm exec` and the drop-in libraries) next to libfabric's own tcp provider, in one run
# (issue 32: "latency at least as good"). Default configuration: two processes on loopback,
# no pinning, fi_pingpong's own busy-polling loop. The three alternate (tcp, iWARP, RoCE, tcp,
# ...) REPEAT times for each message size; fi_pingpong reports usec/xfer, the mean one-way
# time of ITERATIONS ping-pongs (its half round trip). Prints per size the median and the
# worst run of each and the ratios of the medians (verbs / tcp; below 1: verbs is faster).
#   usage: bench/fi_pingpong_latency.sh [REPEAT] [ITERATIONS]   (defaults 7 and 2000)
# Needs a non-loopback IPv4 interface that is up (libfabric's verbs provider skips lo).
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-7}
iterations=${2:-2000}
peercm=${PEERCM:-./build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release \
  --target peercm_tool peercm_dropin_ibverbs peercm_dropin_rdmacm >/dev/null; }
sizes=(8 4096 65536)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

free_port() { python3 scripts/lib/free_port.py; }

one_run() {  # one_run SIZE ARGS... -> usec/xfer of the client's row
  local size=$1; shift
  local port; port=$(free_port)
  timeout 120 "$@" -S "$size" -I "$iterations" -B "$port" > "$out/server" 2>&1 &
  local server=$!
  for _ in $(seq 50); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.05; done
  timeout 120 "$@" -S "$size" -I "$iterations" -P "$port" 127.0.0.1 > "$out/client" 2>&1 ||
    { cat "$out/client" "$out/server" >&2; kill "$server" 2>/dev/null; return 1; }
  wait "$server"
  awk -v s="$size" '$1 == s || ($1 ~ /k$/ && $1+0 == s/1024) { print $7 }' "$out/client"
}

tcp=(fi_pingpong -p tcp -e msg)
iwarp=("$peercm" exec --transport iwarp -- fi_pingpong -p verbs -e msg -d peercm_iw0)
roce=("$peercm" exec --transport roce -- fi_pingpong -p verbs -e msg -d peercm_roce0)
results=()
for size in "${sizes[@]}"; do
  t=() i=() r=()
  for _ in $(seq "$repeat"); do
    t+=("$(one_run "$size" "${tcp[@]}")")
    i+=("$(one_run "$size" "${iwarp[@]}")")
    r+=("$(one_run "$size" "${roce[@]}")")
  done
  results+=("$size ${t[*]} | ${i[*]} | ${r[*]}")
done

python3 - "$repeat" "$iterations" "${results[@]}" <<'PY'
import statistics, sys
repeat, iterations = sys.argv[1], sys.argv[2]
print(f"fi_pingpong -e msg, loopback, {repeat} runs of {iterations} ping-pongs per size; usec/xfer (one way)")
print(f"{'bytes':>7} {'tcp median':>11} {'tcp worst':>10} {'iWARP median':>13} {'iWARP worst':>12} "
      f"{'RoCE median':>12} {'RoCE worst':>11} {'iWARP/tcp':>10} {'RoCE/tcp':>9}")
for line in sys.argv[3:]:
    size, rest = line.split(' ', 1)
    tcp, iwarp, roce = ([float(x) for x in part.split()] for part in rest.split('|'))
    tm, im, rm = statistics.median(tcp), statistics.median(iwarp), statistics.median(roce)
    print(f"{size:>7} {tm:>11.2f} {max(tcp):>10.2f} {im:>13.2f} {max(iwarp):>12.2f} "
          f"{rm:>12.2f} {max(roce):>11.2f} {im / tm:>10.2f} {rm / tm:>9.2f}")
PY
