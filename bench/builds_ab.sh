#!/usr/bin/env bash
# Two builds of peercm in the default configuration (two processes, no pinning, default
# flags), alternating A B, B A, ... in the same minutes: the check that a change moved a
# latency figure, on a host whose speed moves by 10-20 % between minutes.
#
#   bench/builds_ab.sh [--pairs N] [--size S] [--op send|write] [--iters I] A_PEERCM B_PEERCM
#     A_PEERCM, B_PEERCM  two `peercm` binaries (each finds its own libpeercm by its RUNPATH),
#                         e.g. a worktree's build of the base commit and build/release's
#
# Prints per build the median over its runs of each run's mean, median and 99th percentile of
# the one-way time (`peercm perf --mode lat`), and the worst run's mean.
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=12 size=8 op=send iters=10000
while (($# > 2)); do
  case $1 in
    --pairs) pairs=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --op) op=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2 ;;
  esac
done
(($# == 2)) || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
a=$1 b=$2
out=$(mktemp -d /tmp/builds_ab.XXXXXX)

run() {  # binary tag
  local port spid
  port=$(python3 scripts/lib/free_port.py)
  timeout 120 "$1" perf --server --bind 127.0.0.1 --port "$port" --once >/dev/null 2>&1 &
  spid=$!
  for _ in $(seq 200); do ss -ltn "sport = :$port" | grep -q LISTEN && break; sleep 0.02; done
  # Parsed after the runs: a parser beside a run takes a CPU from it.
  timeout 120 "$1" perf --client 127.0.0.1 --port "$port" --op "$op" --mode lat --size "$size" \
    --iters "$iters" --json 2>/dev/null | tail -1 | sed "s/^/$2 /" >>"$out/runs"
  wait "$spid" || true
}

for i in $(seq "$pairs"); do
  if ((i % 2)); then run "$a" A; run "$b" B; else run "$b" B; run "$a" A; fi
done
python3 - "$out/runs" "$a" "$b" <<'PY'
import json, statistics, sys
runs = {"A": [], "B": []}
for line in open(sys.argv[1]):
    tag, text = line.split(" ", 1)
    detail = json.loads(text)["peercm_detail"]
    runs[tag].append((detail["average"], detail["median"], detail["p99"]))
for tag, binary in (("A", sys.argv[2]), ("B", sys.argv[3])):
    r = runs[tag]
    if not r:
        print(f"{tag} {binary}: no run finished")
        continue
    med = lambda i: statistics.median(x[i] for x in r)
    print(f"{tag} ({len(r)} runs) mean {med(0):.2f} us (worst run {max(x[0] for x in r):.2f}), "
          f"median {med(1):.2f}, p99 {med(2):.2f}   {binary}")
PY
echo "runs: $out/runs"
