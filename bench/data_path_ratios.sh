#!/usr/bin/env bash
# Data-path targets of the software iWARP device, as ratios to raw TCP measured in the same
# invocation of `peercm perf` (which runs peercm, then the same pattern over plain TCP).
# Each figure is measured REPEAT times; the median ratio is reported, so one noisy run on a
# shared machine does not decide the result.
#   usage: bench/data_path_ratios.sh [REPEAT]   (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-5}
peercm=${PEERCM:-./build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target peercm_tool >/dev/null; }

figure() {  # name target compare args...
  local name=$1 target=$2 compare=$3; shift 3
  local ratios=()
  for _ in $(seq "$repeat"); do
    ratios+=("$("$peercm" perf --loopback --json "$@" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ratio"])')")
  done
  python3 - "$name" "$target" "$compare" "${ratios[@]}" <<'PY'
import statistics, sys
name, target, compare, *ratios = sys.argv[1:]
r = sorted(float(x) for x in ratios)
m = statistics.median(r)
ok = m <= float(target) if compare == "le" else m >= float(target)
print(f"{name:<34} median ratio {m:5.2f}  (runs {', '.join(f'{x:.2f}' for x in r)})  target {'<=' if compare == 'le' else '>='} {target}  {'PASS' if ok else 'FAIL'}")
PY
}

# --pin: the two busy-polling ends on their own CPUs for the peercm run (the TCP baseline
# stays unpinned); without it the scheduler leaves both on one core in some runs.
figure "send latency 8 B"              1.15 le --op send  --mode lat --size 8 --iters 3000 --pin
figure "write bandwidth 1 MiB, CRC off" 0.90 ge --op write --mode bw  --size 1048576 --iters 4096 --crc off
figure "write bandwidth 1 MiB, CRC on"  0.80 ge --op write --mode bw  --size 1048576 --iters 4096 --crc on
figure "read bandwidth 1 MiB, CRC off"  0.85 ge --op read  --mode bw  --size 1048576 --iters 4096 --crc off
