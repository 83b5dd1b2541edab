#!/usr/bin/env bash
# Builds the release preset, runs wire_bench and checks the wire-codec targets:
#   CRC32C >= 5 GB/s (64 KiB buffer, one core); small-FPDU header encode+decode >= 20 M/s.
#
# Usage: bench/run_wire_bench.sh [extra Google Benchmark flags, e.g. --benchmark_filter=Crc]
# Environment:
#   WIRE_BENCH=/path/to/wire_bench  skip the build and run this binary instead
#   WIRE_BENCH_STRICT=1             exit 1 when a target check fails
# GB/s and M/s are decimal (1e9 bytes, 1e6 items per second).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

if [[ -z "${WIRE_BENCH:-}" ]]; then
  cmake --preset release
  cmake --build --preset release --target wire_bench
  WIRE_BENCH="$repo/build/release/bench/wire_bench"
fi

json=$(mktemp "${TMPDIR:-/tmp}/wire_bench.XXXXXX.json")
trap 'rm -f "$json"' EXIT

"$WIRE_BENCH" --benchmark_min_time=0.2 --benchmark_format=json "$@" >"$json"

python3 - "$json" <<'PY'
import json
import os
import statistics
import sys

CRC_TARGET_GBPS = 5.0
SMALL_FPDU_TARGET_MPS = 20.0

with open(sys.argv[1]) as f:
    report = json.load(f)

# With --benchmark_repetitions there are several runs per name: use the median of each field.
runs = {}
order = []
for b in report["benchmarks"]:
    if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
        if b.get("error_occurred"):
            print(f"ERROR {b['name']}: {b.get('error_message', '')}", file=sys.stderr)
        continue
    name = b.get("run_name", b["name"])
    if name not in runs:
        runs[name] = []
        order.append(name)
    runs[name].append(b)

def median(name, field):
    values = [b[field] for b in runs.get(name, []) if field in b]
    return statistics.median(values) if values else None

def to_ns(value, unit):
    return value * {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]

ctx = report.get("context", {})
print(f"{ctx.get('executable', 'wire_bench')}  ({ctx.get('num_cpus', '?')} CPUs @ {ctx.get('mhz_per_cpu', '?')} MHz,"
      f" library {ctx.get('library_build_type', '?')})")
header = f"{'benchmark':<46} {'ns/iter':>10} {'GB/s':>9} {'M items/s':>10}"
print(header)
print("-" * len(header))
for name in order:
    unit = runs[name][0].get("time_unit", "ns")
    cpu_ns = to_ns(median(name, "cpu_time"), unit)
    bps = median(name, "bytes_per_second")
    ips = median(name, "items_per_second")
    gbps = f"{bps / 1e9:9.2f}" if bps is not None else f"{'':9}"
    mips = f"{ips / 1e6:10.2f}" if ips is not None else f"{'':10}"
    print(f"{name:<46} {cpu_ns:10.1f} {gbps} {mips}")

sizes = [n.split("/", 1)[1] for n in order if n.startswith("BM_Crc32c/")]
if sizes:
    print()
    print(f"{'size':>8} {'CRC32C GB/s':>12} {'memcpy GB/s':>12} {'CRC/memcpy':>11}")
    for size in sizes:
        crc = median(f"BM_Crc32c/{size}", "bytes_per_second")
        mem = median(f"BM_Memcpy/{size}", "bytes_per_second")
        ratio = f"{crc / mem:11.2f}" if crc and mem else f"{'n/a':>11}"
        mem_s = f"{mem / 1e9:12.2f}" if mem else f"{'n/a':>12}"
        print(f"{size:>8} {crc / 1e9:12.2f} {mem_s} {ratio}")

print()
failed = False

def check(label, value, target, unit, detail=""):
    global failed
    if value is None:
        print(f"SKIP {label}: not measured (filtered out?)")
        return
    ok = value >= target
    failed |= not ok
    print(f"{'PASS' if ok else 'FAIL'} {label}: {value:.2f} {unit} (target >= {target:g} {unit}){detail}")

crc64k = median("BM_Crc32c/65536", "bytes_per_second")
check("CRC32C 64 KiB", crc64k / 1e9 if crc64k else None, CRC_TARGET_GBPS, "GB/s")

small = [(median(n, "items_per_second"), n) for n in order if n.startswith("BM_SmallFpduHeader/")]
small = [(v, n) for v, n in small if v is not None]
if small:
    worst, worst_name = min(small)
    check("small-FPDU header encode+decode", worst / 1e6, SMALL_FPDU_TARGET_MPS, "M/s",
          f" [slowest variant: {worst_name}]")
else:
    check("small-FPDU header encode+decode", None, SMALL_FPDU_TARGET_MPS, "M/s")

if failed and os.environ.get("WIRE_BENCH_STRICT") == "1":
    sys.exit(1)
PY
