#!/usr/bin/env bash
# peercm in the configuration a user gets (two processes, no pinning, default flags) against
# the TCP stacks a user would otherwise pick, in the same minutes:
#   latency: peercm perf --server/--client --op send --mode lat; fi_pingpong -p tcp -e msg;
#            ucx_perftest -t tag_lat (UCX_TLS=tcp, lo only). 8 B and 64 B, quiet and under
#            one CPU hog (a shell busy loop, unpinned, for the whole hog section).
#   streams: peercm perf --mode bw 1 MiB Send and Write, CRC off and on; ucx_perftest -t
#            tag_bw 1 MiB (UCX_TLS=tcp, lo only).
# Each repetition runs the contenders of one row back to back, in an order that rotates
# every repetition. Nothing is pinned.
#
#   bench/default_config.sh [--reps N] [--stream-reps M] [--iters I] [--no-hog] [--waits] [--out DIR]
#     --reps N         latency repetitions per row (default 20)
#     --stream-reps M  stream repetitions per row (default 7)
#     --iters I        round trips per latency run, every tool (default 10000)
#     --waits          also peercm perf --wait block and --wait hybrid in the latency rows
#                      (contenders peercm-block, peercm-hybrid; the default is --wait poll)
#     PEERCM=path      the peercm binary (default build/release/tools/peercm/peercm)
#
# Prints per row the median and the worst run of every contender (latency: the mean one-way
# time of each run, the one figure all three tools give; peercm's and UCX's medians beside
# it), and for latency in how many repetitions peercm was at or below the better of the
# other two of the same repetition. The targets are in bench/targets.json ("default_config").
# Writes every sample to DIR/samples.csv (default: a temporary folder, printed).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=20 stream_reps=7 iters=10000 hog=1 waits=0 out=
while (($#)); do
  case $1 in
    --reps) reps=$2; shift 2 ;;
    --stream-reps) stream_reps=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --no-hog) hog=0; shift ;;
    --waits) waits=1; shift ;;
    --out) out=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
peercm=${PEERCM:-build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target peercm_tool >/dev/null; }
command -v fi_pingpong >/dev/null && command -v ucx_perftest >/dev/null ||
  { echo "default_config: needs fi_pingpong (libfabric-bin) and ucx_perftest (ucx-utils)" >&2; exit 2; }
out=${out:-$(mktemp -d /tmp/default_config.XXXXXX)}
mkdir -p "$out/logs"
samples=$out/samples.csv
echo "row,rep,contender,mean,median" >"$samples"
hog_pid=
trap '[[ -n $hog_pid ]] && kill "$hog_pid" 2>/dev/null; true' EXIT

free_port() { python3 scripts/lib/free_port.py; }
wait_listen() {  # port pid
  for _ in $(seq 200); do
    ss -ltn "sport = :$1" | grep -q LISTEN && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.02
  done
  return 1
}
record() { echo "$1,$2,$3,$4,$5" >>"$samples"; }

peercm_run() {  # row rep op mode size crc [wait]
  local row=$1 rep=$2 op=$3 mode=$4 size=$5 crc=$6 wait=${7:-} port log spid args=() name=peercm
  port=$(free_port)
  [[ -n $wait ]] && name=peercm-$wait
  log=$out/logs/$row-$rep-$name
  [[ $mode == lat ]] && args=(--iters "$iters") || args=(--iters 2000)
  [[ $crc == default ]] || args+=(--crc "$crc")
  [[ -n $wait ]] && args+=(--wait "$wait")
  timeout 120 "$peercm" perf --server --bind 127.0.0.1 --port "$port" --once ${wait:+--wait "$wait"} >"$log.server" 2>&1 &
  spid=$!
  wait_listen "$port" "$spid" || { echo "default_config: peercm server failed: $log.server" >&2; return 1; }
  if timeout 120 "$peercm" perf --client 127.0.0.1 --port "$port" --op "$op" --mode "$mode" \
      --size "$size" --json "${args[@]}" >"$log" 2>&1; then
    python3 - "$log" <<'EOF' | { IFS=, read -r mean median; record "$row" "$rep" "$name" "$mean" "$median"; }
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
if d["mode"] == "bw":  # MB/s -> GB/s, as UCX's row
    print(f"{d['peercm'] / 1000},")
else:
    det = d["peercm_detail"]
    print(f"{det['average']},{det['median']}")
EOF
  else
    echo "default_config: $name $row failed: $log" >&2
  fi
  wait "$spid" 2>/dev/null || true
}

fi_run() {  # row rep size
  local row=$1 rep=$2 size=$3 port log spid
  port=$(free_port)
  log=$out/logs/$row-$rep-fi
  FI_TCP_IFACE=lo timeout 120 fi_pingpong -p tcp -e msg -B "$port" -I "$iters" -S "$size" >"$log.server" 2>&1 &
  spid=$!
  wait_listen "$port" "$spid" || { echo "default_config: fi_pingpong server failed" >&2; return 1; }
  if FI_TCP_IFACE=lo timeout 120 fi_pingpong -p tcp -e msg -P "$port" -I "$iters" -S "$size" 127.0.0.1 \
      >"$log" 2>&1; then
    # The result row: bytes iters total time MB/sec usec/xfer Mxfers/sec; usec/xfer is the
    # mean one-way time (elapsed / iterations / 2). fi_pingpong gives no median.
    awk 'NF == 8 && $7 ~ /^[0-9.]+$/ { v = $7 } END { if (v == "") exit 1; print v }' "$log" |
      { read -r mean; record "$row" "$rep" libfabric "$mean" ""; }
  else
    echo "default_config: fi_pingpong $row failed: $log" >&2
  fi
  wait "$spid" 2>/dev/null || true
}

ucx_run() {  # row rep test size
  local row=$1 rep=$2 test=$3 size=$4 port log spid n=$iters w=$((iters / 10))
  [[ $test == tag_bw ]] && n=2000 w=16
  port=$(free_port)
  log=$out/logs/$row-$rep-ucx
  UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest -p "$port" >"$log.server" 2>&1 &
  spid=$!
  wait_listen "$port" "$spid" || { echo "default_config: ucx_perftest server failed" >&2; return 1; }
  if UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p "$port" -t "$test" -s "$size" \
      -n "$n" -w "$w" -f -v >"$log" 2>&1; then
    python3 - "$log" "$test" <<'EOF' | { IFS=, read -r mean median; record "$row" "$rep" ucx "$mean" "$median"; }
import re, sys
header = row = None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith("iterations,"):
        header = line.split(",")
    elif header and re.match(r"^\d", line):
        vals = [v.strip() for v in line.split(",")]
        if len(vals) >= len(header):
            row = dict(zip(header, vals))
if sys.argv[2] == "tag_bw":
    print(f"{float(row['overall_bw']) * 1048576 / 1e9},")
else:
    p50 = next(k for k in header if "percentile" in k or k == "typical_lat")
    print(f"{row['overall_lat']},{row[p50]}")
EOF
  else
    echo "default_config: ucx_perftest $row failed: $log" >&2
  fi
  wait "$spid" 2>/dev/null || true
}

rotate() {  # rep items... -> the items rotated by rep
  local rep=$1; shift
  local items=("$@") n=$# i
  for ((i = 0; i < n; i++)); do echo "${items[$(((i + rep) % n))]}"; done
}

latency_rows() {  # suffix
  local size rep who contenders=(peercm libfabric ucx)
  ((waits)) && contenders+=(peercm-block peercm-hybrid)
  for size in 8 64; do
    for ((rep = 0; rep < reps; rep++)); do
      for who in $(rotate "$rep" "${contenders[@]}"); do
        case $who in
          peercm) peercm_run "lat$size$1" "$rep" send lat "$size" default ;;
          peercm-*) peercm_run "lat$size$1" "$rep" send lat "$size" default "${who#peercm-}" ;;
          libfabric) fi_run "lat$size$1" "$rep" "$size" ;;
          ucx) ucx_run "lat$size$1" "$rep" tag_lat "$size" ;;
        esac
      done
    done
  done
}

echo "default_config: samples in $out" >&2
latency_rows ""
if ((hog)); then
  sh -c 'while :; do :; done' &
  hog_pid=$!
  latency_rows "-hog"
  kill "$hog_pid"
  hog_pid=
fi
for ((rep = 0; rep < stream_reps; rep++)); do
  for who in $(rotate "$rep" send-off send-on write-off write-on ucx); do
    case $who in
      ucx) ucx_run bw "$rep" tag_bw 1048576 ;;
      *) peercm_run "bw-${who%-*}-crc-${who#*-}" "$rep" "${who%-*}" bw 1048576 "${who#*-}" ;;
    esac
  done
done
# The UCX stream is one row, the baseline of all four peercm stream rows.
python3 bench/default_config_report.py "$samples" bench/targets.json
