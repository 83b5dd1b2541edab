#!/usr/bin/env bash
# RoCE-path targets (issue: IB CM over RoCEv2), as ratios of the RoCEv2 transport to the
# iWARP transport measured in the same run: `peercm perf --loopback` alternates the two
# (iwarp, roce, iwarp, roce, ...) REPEAT times and reports the median of each and of the
# per-pair ratios. Then the RoCE Write bandwidth on a wire that drops 1 % of the datagrams
# each way (perf --drop) against the clean wire, and the latency tails (p99 / median) of both
# transports. Every run is in the default configuration (no pinning).
#   usage: bench/roce_ratios.sh [REPEAT]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-5}
peercm=${PEERCM:-./build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target peercm_tool >/dev/null; }

value() {  # perf args... -> the peercm figure
  # The run's output is parsed after it ends: a python started beside it (a pipe) would take
  # a CPU from the measured run for its first ~50 ms.
  local out
  out=$("$peercm" perf --loopback --json "$@")
  python3 -c 'import json,sys; print(json.load(sys.stdin)["peercm"])' <<<"$out"
}

figure() {  # name target compare args...
  local name=$1 target=$2 compare=$3; shift 3
  local iwarp=() roce=()
  for _ in $(seq "$repeat"); do
    iwarp+=("$(value --transport iwarp "$@")")
    roce+=("$(value --transport roce "$@")")
  done
  python3 - "$name" "$target" "$compare" "${iwarp[*]}" "${roce[*]}" <<'PY'
import statistics, sys
name, target, compare, iwarp, roce = sys.argv[1:]
iwarp = [float(x) for x in iwarp.split()]
roce = [float(x) for x in roce.split()]
ratios = sorted(r / i for i, r in zip(iwarp, roce))
m = statistics.median(ratios)
ok = m <= float(target) if compare == "le" else m >= float(target)
print(f"{name:<30} iwarp {statistics.median(iwarp):8.2f}  roce {statistics.median(roce):8.2f}  "
      f"median ratio roce/iwarp {m:5.2f}  (pairs {', '.join(f'{x:.2f}' for x in ratios)})  "
      f"target {'<=' if compare == 'le' else '>='} {target}  {'PASS' if ok else 'FAIL'}")
PY
}

# The default configuration, as every figure here: no pinning (docs/performance.md,
# "Pinning is for exploring"), so both transports' runs share the CPUs the same way.
figure "send latency 8 B (us)"        1.10 le --op send  --mode lat --size 8 --iters 3000
figure "write bandwidth 1 MiB (MB/s)" 0.70 ge --op write --mode bw  --size 1048576 --iters 300

# Loss: the RoCE Write stream on a wire that drops 1 % of the datagrams each way, paired with
# a clean-wire run of the same minutes. Target: lossy >= 0.5 x clean (median of pairs).
clean=() lossy=()
for _ in $(seq "$repeat"); do
  clean+=("$(value --transport roce --op write --mode bw --size 1048576 --iters 200)")
  lossy+=("$(value --transport roce --op write --mode bw --size 1048576 --iters 200 --drop 0.01)")
done
python3 - "${clean[*]}" "${lossy[*]}" <<'PY'
import statistics, sys
clean = [float(x) for x in sys.argv[1].split()]
lossy = [float(x) for x in sys.argv[2].split()]
ratios = sorted(l / c for c, l in zip(clean, lossy))
m = statistics.median(ratios)
print(f"{'roce write 1 MiB, 1% drop':<30} clean {statistics.median(clean):8.2f}  lossy {statistics.median(lossy):8.2f} MB/s  "
      f"median ratio lossy/clean {m:5.2f}, worst {ratios[0]:.2f}  (pairs {', '.join(f'{x:.2f}' for x in ratios)})  "
      f"target >= 0.5  {'PASS' if m >= 0.5 else 'FAIL'}")
PY

# Tails: p99 against the median of one-way latency, default flags (no pinning), both
# transports, Send and Write, 8 B to 1 MiB. Target: p99 <= 3 x median, in the median run and
# the worst.
tail_figure() {  # transport op size
  local out ratios=()
  for _ in $(seq "$repeat"); do
    out=$("$peercm" perf --loopback --json --transport "$1" --op "$2" --mode lat --size "$3" --iters 2000)
    ratios+=("$(python3 -c 'import json,sys; d=json.load(sys.stdin)["peercm_detail"]; print(d["median"], d["p99"])' <<<"$out")")
  done
  python3 - "$1" "$2" "$3" "${ratios[@]}" <<'PY'
import statistics, sys
transport, op, size = sys.argv[1:4]
runs = [tuple(float(v) for v in r.split()) for r in sys.argv[4:]]
tails = sorted(p99 / med for med, p99 in runs)
m = statistics.median(tails)
print(f"tail {transport:<5} {op:<5} {size:>7} B  median {statistics.median(r[0] for r in runs):8.2f} us  "
      f"p99 {statistics.median(r[1] for r in runs):8.2f} us  p99/median: median {m:5.2f}, worst {tails[-1]:5.2f}  "
      f"target <= 3  {'PASS' if tails[-1] <= 3 else 'FAIL'}")
PY
}
for transport in iwarp roce; do
  for op in send write; do
    for size in 8 65536 1048576; do tail_figure "$transport" "$op" "$size"; done
  done
done
