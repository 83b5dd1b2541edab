#!/usr/bin/env bash
# peercm against UCX over TCP in order-alternating pairs: the tie-break for the side-by-side
# suite's "<= UCX" and ">= UCX" checks, which compare medians of 5 samples taken minutes apart
# on a host whose speed moves by 10-20 % between minutes.
#
#   bench/paired_vs_ucx.sh [--pairs N] [--figure "MODE SIZE OP CRC"]... [--null] [--out FILE]
#
# --null runs UCX against UCX in the same pairs (the second UCX run takes peercm's place): a
# comparison with no difference in it, whose medians and intervals show how far from 1 this
# host's noise alone moves the figures.
# --figure limits the run to one figure (repeatable), e.g. --figure "bw 1048576 send off";
# MODE is lat or bw, OP send or write, CRC on or off. Default: the eight figures below.
#
# For each figure it runs N pairs of `ucx_perftest` (UCX_TLS=tcp, UCX_NET_DEVICES=lo) and
# `peercm perf --loopback --pin`, back to back, UCX first in odd pairs and peercm first in
# even ones (ABBA: on this host the second run of a pair is slower on its own). Both tools'
# ends keep to the same two CPUs (server on the first, client on the second), as in the suite.
# Each pair gives one ratio peercm / UCX; the script prints their median, the 95 % confidence
# interval of that median (order statistics of the binomial distribution) and the target.
# Latency: p50 one-way of 5000 round trips each (8 B and 4 KiB); streams: 256 MiB of 1 MiB
# messages after 16 warm-up messages each. CRC-on rows are for information: UCX carries no
# CRC (docs/performance.md, "What bounds the remaining misses").
#
# Every tool's output goes to a file and is read after the run: a parser started beside a run
# (a pipe) takes a CPU from it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/apt.sh
source scripts/lib/apt.sh

pairs=20
out=
figures=()
null=0
while (($#)); do
  case $1 in
    --pairs) pairs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --figure) figures+=("$2"); shift 2 ;;
    --null) null=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "paired_vs_ucx: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "paired_vs_ucx: --pairs must be a positive integer" >&2; exit 2; }
given='' title=''
((null == 0)) || { given=" --null"; title=": the null comparison, UCX against UCX"; }
if ((${#figures[@]})); then given+=$(printf ' --figure "%s"' "${figures[@]}"); else figures=("lat 8 send off" "lat 8 write off" "lat 4096 send off" "lat 4096 write off"
  "bw 1048576 send off" "bw 1048576 write off" "lat 4096 send on" "bw 1048576 send on"); fi
for spec in "${figures[@]}"; do
  [[ $spec =~ ^(lat|bw)\ [1-9][0-9]*\ (send|write)\ (on|off)$ ]] ||
    { echo "paired_vs_ucx: --figure wants \"lat|bw SIZE send|write on|off\", not \"$spec\"" >&2; exit 2; }
done

apt_ensure --tag paired_vs_ucx ucx-utils python3
if [[ -z ${PEERCM:-} ]]; then
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
  bash scripts/build.sh release >/dev/null
fi
peercm=${PEERCM:-$PWD/build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { echo "paired_vs_ucx: $peercm is not executable" >&2; exit 1; }
out=${out:-build/bench-paired-vs-ucx/$(date +%Y%m%d-%H%M%S).md}
mkdir -p "$(dirname "$out")"
raw=${out%.md}.pairs.tsv
: >"$raw"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

read -r cpu_a cpu_b < <(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[0], c[1 % len(c)])')
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

ucx_run() {  # mode size [file] -> $work/ucx.txt or file
  local mode=$1 size=$2 file=${3:-$work/ucx.txt} test iters
  if [[ $mode == lat ]]; then test=tag_lat iters=5000; else test=tag_bw iters=$(((256 << 20) / size)); fi
  UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 taskset -c "$cpu_a" ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 taskset -c "$cpu_b" ucx_perftest 127.0.0.1 -p "$port" -t "$test" \
    -s "$size" -n "$iters" -w 16 -f -v >"$file" 2>&1 || true
  wait "$server" 2>/dev/null || true
}

peercm_run() {  # mode size op crc -> $work/peercm.json (--null: a second UCX run, $work/ucx2.txt)
  local mode=$1 size=$2 op=$3 crc=$4 iters=5000
  if ((null)); then
    ucx_run "$mode" "$size" "$work/ucx2.txt"
    return
  fi
  [[ $mode == bw ]] && iters=$(((256 << 20) / size))
  timeout 120 "$peercm" perf --loopback --pin --json --mode "$mode" --size "$size" --op "$op" --crc "$crc" \
    --iters "$iters" >"$work/peercm.json" 2>&1 || true
}

# One figure: N pairs, then the statistics (python reads the two files after each run).
figure() {  # mode size op crc
  local mode=$1 size=$2 op=$3 crc=$4 i
  : >"$work/pairs.txt"
  for ((i = 1; i <= pairs; i++)); do
    if ((i % 2)); then
      ucx_run "$mode" "$size"
      peercm_run "$mode" "$size" "$op" "$crc"
    else
      peercm_run "$mode" "$size" "$op" "$crc"
      ucx_run "$mode" "$size"
    fi
    python3 - "$mode" "$work/ucx.txt" "$work/peercm.json" "$work/ucx2.txt" "$null" >>"$work/pairs.txt" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from side_by_side_report import parse_ucx  # the suite's reading of ucx_perftest -f -v
mode, ucx_file, peercm_file, ucx2_file, null = sys.argv[1:]

def read_ucx(path):
    try:
        values = {stat: value for _, stat, value, _, _ in parse_ucx(open(path, errors="replace").read(), "ucx", 0)}
        return values["p50_us"] if mode == "lat" else values["GBps"]
    except (ValueError, StopIteration, KeyError, OSError):
        return None

def read_peercm(path):
    try:
        value = json.load(open(path))["peercm"]
        return value if mode == "lat" else value / 1000  # GB/s
    except (ValueError, KeyError, OSError):
        return None

ucx = read_ucx(ucx_file)
other = read_ucx(ucx2_file) if null == "1" else read_peercm(peercm_file)
print("nan nan" if ucx is None or other is None else f"{ucx} {other}")  # a failed run: the pair is dropped
PY
  done
  python3 - "$mode" "$size" "$op" "$crc" "$null" "$work/pairs.txt" "$raw" <<'PY'
import math, statistics, sys
mode, size, op, crc, null, path, raw = sys.argv[1:]
rows = [tuple(map(float, l.split())) for l in open(path)]
rows = [(u, p) for u, p in rows if not (math.isnan(u) or math.isnan(p)) and u > 0]
ratios = sorted(p / u for u, p in rows)
n = len(ratios)
size = int(size)
what = f"{'Send' if op == 'send' else 'RDMA Write'} {'latency' if mode == 'lat' else 'stream'}"
amount = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
label = f"{what} {amount}, CRC {crc}"
if null == "1":
    label = f"UCX against UCX: {'latency' if mode == 'lat' else 'stream'} {amount}"
with open(raw, "a") as f:  # every pair, for pooling series: label, then UCX and peercm (or UCX again)
    f.write("".join(f"{label}\t{u}\t{p}\n" for u, p in rows))
if n == 0:
    print(f"| {label} | 0 | — | — | — | — | no pair completed |")
    sys.exit(0)
# 95 % interval of the median: the k-th smallest and k-th largest ratio, k the largest with
# P(Binomial(n, 1/2) < k) <= 2.5 %.
k, cum = 0, 0.0
while True:
    p = math.comb(n, k) / 2 ** n
    if cum + p > 0.025:
        break
    cum += p
    k += 1
low, high = (ratios[k], ratios[n - 1 - k]) if k > 0 and k <= n - 1 - k else (ratios[0], ratios[-1])
median = statistics.median(ratios)
better = (lambda r: r <= 1.0) if mode == "lat" else (lambda r: r >= 1.0)
wins = sum(better(r) for r in ratios)
target = "<= 1" if mode == "lat" else ">= 1"
if null == "1":
    verdict = "null comparison: noise alone"
elif crc == "on":
    verdict = "information (CRC on; UCX carries none)"
elif k == 0:
    verdict = "too few pairs for a 95 % interval (at least 6)"
elif better(high) and better(low):
    verdict = "met (whole interval)"
elif better(median):
    verdict = "met (median; interval spans 1)"
else:
    verdict = "missed"
unit = "µs" if mode == "lat" else "GB/s"
print(f"| {label} | {n} | {statistics.median([u for u, _ in rows]):.3g} / {statistics.median([p for _, p in rows]):.3g} {unit} | "
      f"{median:.3f} | {low:.3f}–{high:.3f} | {wins} of {n} | {target}: {verdict} |")
PY
}

{
  echo "# peercm against UCX over TCP, order-alternating pairs$title"
  echo
  echo "Command: \`bench/paired_vs_ucx.sh --pairs $pairs$given\` at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes'), $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, kernel $(uname -r); UCX $(ucx_info -v | sed -n 's/^# Version *//p')."
  echo
  if ((null)); then
    echo "| figure | pairs | median UCX / UCX again | median of UCX again / UCX | 95 % interval | pairs UCX again ahead | target |"
  else
    echo "| figure | pairs | median UCX / peercm | median of peercm / UCX | 95 % interval | pairs peercm ahead | target |"
  fi
  echo "|---|---|---|---|---|---|---|"
} | tee "$out"
for spec in "${figures[@]}"; do
  # shellcheck disable=SC2086
  figure $spec | tee -a "$out"
done
echo
echo "paired_vs_ucx: $out (every pair: $raw)"
