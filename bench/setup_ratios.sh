#!/usr/bin/env bash
# Connection-setup targets of the peer-to-peer model, as ratios to a baseline measured in the
# same invocation, each repeated REPEAT times and reported as the median (one noisy run on a
# shared machine does not decide the result):
#   - simultaneous p2p setup: `peercm cmtime --mode p2p` against its plain TCP connect + 8 B
#     exchange (ratio_connect, averages per connection), target <= 2.5;
#   - full mesh of 32 ranks: `peercm mesh --model p2p` against `--model static`, run
#     alternately, target <= 1.5 with zero duplicates;
#   - 64 ranks in p2p mode: exactly 2016 connections, zero duplicates (one run).
#   usage: bench/setup_ratios.sh [REPEAT] [CONNECTIONS]   (defaults 7 and 100)
#   SETUP_RATIOS_STRICT=1: exit 1 when a target is missed
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-7}
connections=${2:-100}
peercm=${PEERCM:-./build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target peercm_tool >/dev/null; }

cmtime=()
for _ in $(seq "$repeat"); do
  cmtime+=("$("$peercm" cmtime --connections "$connections" --mode p2p --json)")
done
mesh=()
for _ in $(seq "$repeat"); do
  mesh+=("p2p $("$peercm" mesh --ranks 32 --model p2p --json)")
  mesh+=("static $("$peercm" mesh --ranks 32 --model static --json)")
done
mesh64=$("$peercm" mesh --ranks 64 --model p2p --json)

python3 - "$connections" "$mesh64" "${#cmtime[@]}" "${cmtime[@]}" "${mesh[@]}" <<'PY'
import json, os, statistics, sys
connections, mesh64, n, *rest = sys.argv[1:]
n = int(n)
cmtime = [json.loads(r) for r in rest[:n]]
mesh = [(r.split(" ", 1)[0], json.loads(r.split(" ", 1)[1])) for r in rest[n:]]
failed = False

def verdict(ok):
    global failed
    failed |= not ok
    return "PASS" if ok else "FAIL"

ratios = sorted(d["ratio_connect"] for d in cmtime)
cpu_ratios = sorted(d["ratio_cpu"] for d in cmtime)
complete = all(d["completed"] and d["established"] == int(connections) and d["pairs_matched"] == int(connections)
               for d in cmtime)
m = statistics.median(ratios)
print(f"cmtime p2p, {connections} pairs: median ratio {m:.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)}), "
      f"every pair matched: {complete}  target <= 2.5  {verdict(m <= 2.5 and complete)}")

print(f"  CPU per pair against TCP's per connection (information): median {statistics.median(cpu_ratios):.2f} "
      f"(runs {', '.join(f'{x:.2f}' for x in cpu_ratios)})")

p2p = [d for model, d in mesh if model == "p2p"]
static = [d for model, d in mesh if model == "static"]
pt = statistics.median(d["time_to_mesh_us"] for d in p2p) / 1000
st = statistics.median(d["time_to_mesh_us"] for d in static) / 1000
dups = sum(d["duplicates"] for d in p2p)
exact = all(d["connections"] == d["expected_connections"] for d in p2p + static)
print(f"mesh 32, p2p vs static: median {pt:.1f} ms vs {st:.1f} ms, ratio {pt / st:.2f}, duplicates {dups}, "
      f"all connections exact: {exact}  target <= 1.5  {verdict(pt / st <= 1.5 and dups == 0 and exact)}")

d = json.loads(mesh64)
print(f"mesh 64, p2p: {d['connections']} connections (expected {d['expected_connections']}), duplicates "
      f"{d['duplicates']}, {d['time_to_mesh_us'] / 1000:.0f} ms  target 2016  "
      f"{verdict(d['connections'] == 2016 and d['duplicates'] == 0)}")
sys.exit(1 if failed and os.environ.get("SETUP_RATIOS_STRICT") == "1" else 0)
PY
