#!/usr/bin/env bash
# peercm against UCX or libfabric over TCP in order-alternating pairs: the tie-break for the
# side-by-side suite's checks against them, which compare medians of 5 samples taken minutes
# apart on a host whose speed moves by 10-20 % between minutes.
#
#   bench/paired_ratios.sh [--against ucx|libfabric] [--pairs N] [--figure "MODE SIZE OP CRC [PROGRESS]"]...
#                          [--null] [--out FILE]
#
# --against picks the other stack (default ucx): `ucx_perftest` (UCX_TLS=tcp,
# UCX_NET_DEVICES=lo; tag_lat, tag_bw) or `fi_pingpong -p tcp -e msg` (FI_TCP_IFACE=lo;
# ping-pong only, so lat figures only).
# --figure limits the run to one figure (repeatable), e.g. --figure "bw 1048576 send off";
# MODE is lat or bw, OP send or write, CRC on or off, PROGRESS thread (default) or inline.
# Default: eight figures against UCX, seven against libfabric (below).
# --null runs the other stack against itself in the same pairs (its second run takes peercm's
# place): a comparison with no difference in it, whose medians and intervals show how far
# from 1 this host's noise alone moves the figures.
#
# For each figure it runs N pairs of the other stack's tool and `peercm perf --loopback --pin`,
# back to back, the other stack first in odd pairs and peercm first in even ones (ABBA: on this
# host the second run of a pair is slower on its own). Both tools' ends keep to the same two
# CPUs (server on the first, client on the second), as in the suite. Each pair gives one ratio
# peercm / other; the script prints their median, the 95 % confidence interval of that median
# (order statistics of the binomial distribution) and the target. Latency, one-way: against
# UCX the p50 of each run, against libfabric the mean (all fi_pingpong reports); 5000 round
# trips up to 4 KiB, 1000 up to 64 KiB, 200 above. Streams: 256 MiB after 16 warm-up messages
# each. CRC-on rows are for information: neither UCX nor libfabric's tcp provider carries a
# CRC (docs/performance.md, "CRC on"). Every pair is kept beside the table (FILE with .pairs.tsv
# for .md), so that series can be pooled.
#
# Every tool's output goes to a file and is read after the run: a parser started beside a run
# (a pipe) takes a CPU from it.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source-path=SCRIPTDIR source=../scripts/lib/apt.sh
source scripts/lib/apt.sh

against=ucx
pairs=20
out=
figures=()
null=0
while (($#)); do
  case $1 in
    --against) against=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --figure) figures+=("$2"); shift 2 ;;
    --null) null=1; shift ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "paired_ratios: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $pairs =~ ^[1-9][0-9]*$ ]] || { echo "paired_ratios: --pairs must be a positive integer" >&2; exit 2; }
case $against in
  ucx) other=UCX package=ucx-utils ;;
  libfabric) other=libfabric package=libfabric-bin ;;
  *) echo "paired_ratios: --against takes ucx or libfabric, not $against" >&2; exit 2 ;;
esac
given=" --against $against" title=''
((null == 0)) || { given+=" --null"; title=": the null comparison, $other against $other"; }
if ((${#figures[@]})); then
  given+=$(printf ' --figure "%s"' "${figures[@]}")
elif [[ $against == ucx ]]; then
  figures=("lat 8 send off" "lat 8 write off" "lat 4096 send off" "lat 4096 write off"
    "bw 1048576 send off" "bw 1048576 write off" "lat 4096 send on" "bw 1048576 send on")
else
  figures=("lat 8 send off" "lat 8 write off" "lat 4096 send off" "lat 4096 send off inline"
    "lat 65536 write off" "lat 1048576 send off" "lat 1048576 write off")
fi
for spec in "${figures[@]}"; do
  [[ $spec =~ ^(lat|bw)\ [1-9][0-9]*\ (send|write)\ (on|off)(\ (thread|inline))?$ ]] ||
    { echo "paired_ratios: --figure wants \"lat|bw SIZE send|write on|off [thread|inline]\", not \"$spec\"" >&2; exit 2; }
  [[ $against == ucx || $spec == lat* ]] ||
    { echo "paired_ratios: fi_pingpong only ping-pongs: \"$spec\" needs --against ucx" >&2; exit 2; }
done

apt_ensure --tag paired_ratios "$package" python3
if [[ -z ${PEERCM:-} ]]; then
  export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
  bash scripts/build.sh release >/dev/null
fi
peercm=${PEERCM:-$PWD/build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { echo "paired_ratios: $peercm is not executable" >&2; exit 1; }
out=${out:-build/bench-paired/$(date +%Y%m%d-%H%M%S)-$against.md}
mkdir -p "$(dirname "$out")"
raw=${out%.md}.pairs.tsv
: >"$raw"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

read -r cpu_a cpu_b < <(python3 -c 'import os; c = sorted(os.sched_getaffinity(0)); print(c[0], c[1 % len(c)])')
port=$(python3 scripts/lib/free_port.py)

iterations() {  # mode size -> round trips (lat) or messages (bw)
  if [[ $1 == bw ]]; then echo $(((256 << 20) / $2))
  elif (($2 <= 4096)); then echo 5000
  elif (($2 <= 65536)); then echo 1000
  else echo 200; fi
}

other_run() {  # mode size file: one run of the other stack's tool
  local mode=$1 size=$2 file=$3 iters server
  iters=$(iterations "$mode" "$size")
  if [[ $against == ucx ]]; then
    local test=tag_lat
    [[ $mode == bw ]] && test=tag_bw
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 taskset -c "$cpu_a" ucx_perftest -p "$port" >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    UCX_TLS=tcp UCX_NET_DEVICES=lo timeout 60 taskset -c "$cpu_b" ucx_perftest 127.0.0.1 -p "$port" -t "$test" \
      -s "$size" -n "$iters" -w 16 -f -v >"$file" 2>&1 || true
  else
    FI_TCP_IFACE=lo timeout 60 taskset -c "$cpu_a" fi_pingpong -p tcp -e msg -B "$port" -I "$iters" -S "$size" \
      >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    FI_TCP_IFACE=lo timeout 60 taskset -c "$cpu_b" fi_pingpong -p tcp -e msg -P "$port" -I "$iters" -S "$size" \
      127.0.0.1 >"$file" 2>&1 || true
  fi
  wait "$server" 2>/dev/null || true
}

peercm_run() {  # mode size op crc progress -> $work/peercm.json (--null: the other stack again, $work/other2.txt)
  local mode=$1 size=$2 op=$3 crc=$4 progress=$5
  if ((null)); then
    other_run "$mode" "$size" "$work/other2.txt"
    return
  fi
  timeout 120 "$peercm" perf --loopback --pin --json --mode "$mode" --size "$size" --op "$op" --crc "$crc" \
    --progress "$progress" --iters "$(iterations "$mode" "$size")" >"$work/peercm.json" 2>&1 || true
}

# One figure: N pairs, then the statistics (python reads the two files after each run).
figure() {  # mode size op crc [progress]
  local mode=$1 size=$2 op=$3 crc=$4 progress=${5:-thread} i
  : >"$work/pairs.txt"
  for ((i = 1; i <= pairs; i++)); do
    if ((i % 2)); then
      other_run "$mode" "$size" "$work/other.txt"
      peercm_run "$mode" "$size" "$op" "$crc" "$progress"
    else
      peercm_run "$mode" "$size" "$op" "$crc" "$progress"
      other_run "$mode" "$size" "$work/other.txt"
    fi
    python3 - "$against" "$mode" "$work/other.txt" "$work/peercm.json" "$work/other2.txt" "$null" >>"$work/pairs.txt" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from side_by_side_report import parse_fi, parse_ucx  # the suite's readings of the two tools
against, mode, other_file, peercm_file, other2_file, null = sys.argv[1:]

def read_other(path):
    try:
        text = open(path, errors="replace").read()
        if against == "libfabric":
            return {stat: value for _, stat, value, _, _ in parse_fi(text, "libfabric", 0)}["mean_us"]
        values = {stat: value for _, stat, value, _, _ in parse_ucx(text, "ucx", 0)}
        return values["p50_us"] if mode == "lat" else values["GBps"]
    except (ValueError, StopIteration, KeyError, OSError):
        return None

def read_peercm(path):
    try:
        d = json.load(open(path))
        if mode == "bw":
            return d["peercm"] / 1000  # GB/s
        return d["peercm_detail"]["average"] if against == "libfabric" else d["peercm"]  # mean or p50, µs
    except (ValueError, KeyError, OSError):
        return None

other = read_other(other_file)
peercm = read_other(other2_file) if null == "1" else read_peercm(peercm_file)
print("nan nan" if other is None or peercm is None else f"{other} {peercm}")  # a failed run: the pair is dropped
PY
  done
  python3 - "$other" "$mode" "$size" "$op" "$crc" "$progress" "$null" "$work/pairs.txt" "$raw" <<'PY'
import math, statistics, sys
other, mode, size, op, crc, progress, null, path, raw = sys.argv[1:]
rows = [tuple(map(float, l.split())) for l in open(path)]
rows = [(u, p) for u, p in rows if not (math.isnan(u) or math.isnan(p)) and u > 0]
ratios = sorted(p / u for u, p in rows)
n = len(ratios)
size = int(size)
what = f"{'Send' if op == 'send' else 'RDMA Write'} {'latency' if mode == 'lat' else 'stream'}"
amount = f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB" if size >= 1024 else f"{size} B"
label = f"{what} {amount}, CRC {crc}" + (", inline progress" if progress == "inline" else "")
if null == "1":
    label = f"{other} against {other}: {'latency' if mode == 'lat' else 'stream'} {amount}"
with open(raw, "a") as f:  # every pair, for pooling series: label, then the other stack and peercm (or it again)
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
    verdict = f"information (CRC on; {other} carries none)"
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

if [[ $against == ucx ]]; then
  version="UCX $(ucx_info -v | sed -n 's/^# Version *//p')"
  statistic="latency: p50 of each run"
else
  version="libfabric $(fi_info --version 2>/dev/null | sed -n 's/^libfabric: *//p' | head -1)"
  statistic="latency: mean of each run (fi_pingpong gives no other)"
fi
second=peercm
((null == 0)) || second="$other again"
{
  echo "# peercm against $other over TCP, order-alternating pairs$title"
  echo
  echo "Command: \`bench/paired_ratios.sh --pairs $pairs$given\` at $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' + uncommitted changes'), $(date -u '+%Y-%m-%d %H:%M UTC')."
  echo "Machine: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) CPUs, kernel $(uname -r); $version; $statistic."
  echo
  echo "| figure | pairs | median $other / $second | median of $second / $other | 95 % interval | pairs $second ahead | target |"
  echo "|---|---|---|---|---|---|---|"
} | tee "$out"
for spec in "${figures[@]}"; do
  # shellcheck disable=SC2086
  figure $spec | tee -a "$out"
done
echo
echo "paired_ratios: $out (every pair: $raw)"
