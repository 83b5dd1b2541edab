#!/usr/bin/env bash
# Connection setup over RoCEv2 against iWARP, measured side by side: `peercm cmtime` at each
# connection count (default 100 and 4000) in both modes (client-server and p2p), the two
# transports run alternately (iwarp, roce, iwarp, roce, ...) REPEAT times. Per run pair the
# ratio roce/iwarp of the connect step's total (steps.connect.total_us, first connect() to the
# last ESTABLISHED); printed: the median and the worst ratio, the median of each transport, and
# how many runs did not complete cleanly (completed false, or any error). Target: median
# ratio <= 1.5.
#   usage: bench/roce_setup_ratios.sh [REPEAT] [CONNECTIONS...]   (defaults 5, 100 4000)
#   ROCE_SETUP_STRICT=1: exit 1 when a target is missed or a run failed
set -euo pipefail
cd "$(dirname "$0")/.."
repeat=${1:-5}
shift || true
counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(100 4000)
peercm=${PEERCM:-./build/release/tools/peercm/peercm}
[[ -x $peercm ]] || { cmake --preset release >/dev/null && cmake --build --preset release --target peercm_tool >/dev/null; }

failed=0
for connections in "${counts[@]}"; do
  for mode in client-server p2p; do
    runs=()
    for _ in $(seq "$repeat"); do
      for transport in iwarp roce; do
        # Parsed after the run ends: a python beside it would take a CPU from the measured run.
        # A failing run still prints its JSON (exit status 1): it is counted, not fatal.
        out=$("$peercm" cmtime --connections "$connections" --transport "$transport" --mode "$mode" --json 2>/dev/null || true)
        runs+=("$transport $(python3 -c '
import json, sys
try:
    d = json.loads(sys.stdin.read())
except ValueError:
    print("0 0"); sys.exit()
ok = d["completed"] and not d["errors"]
print(d["steps"]["connect"]["total_us"], 1 if ok else 0)' <<<"$out")")
      done
    done
    python3 - "$connections" "$mode" "${runs[@]}" <<'PY' || failed=1
import statistics, sys
connections, mode, *runs = sys.argv[1:]
iwarp, roce, bad = [], [], {"iwarp": 0, "roce": 0}
for run in runs:
    transport, total_us, ok = run.split()
    (iwarp if transport == "iwarp" else roce).append(float(total_us) / 1000)
    bad[transport] += int(ok) == 0
ratios = sorted(r / i for i, r in zip(iwarp, roce) if i > 0 and r > 0)
if not ratios:  # a run that timed out reports no connect total
    print(f"{connections:>5} {mode:<13} no run pair with both totals; failed runs iwarp {bad['iwarp']} "
          f"roce {bad['roce']} of {len(iwarp)}  FAIL")
    sys.exit(1)
m = statistics.median(ratios)
ok = m <= 1.5 and bad["iwarp"] == 0 and bad["roce"] == 0
def median_ms(totals):  # of the runs that reported a total
    done = [t for t in totals if t > 0]
    return statistics.median(done) if done else 0.0
print(f"{connections:>5} {mode:<13} iwarp {median_ms(iwarp):8.1f} ms  roce {median_ms(roce):8.1f} ms  "
      f"ratio roce/iwarp median {m:4.2f} worst {ratios[-1]:4.2f}  (runs {', '.join(f'{x:.2f}' for x in ratios)})  "
      f"failed runs iwarp {bad['iwarp']} roce {bad['roce']}  target <= 1.5  {'PASS' if ok else 'FAIL'}")
sys.exit(0 if ok else 1)
PY
  done
done
[[ $failed -eq 0 || ${ROCE_SETUP_STRICT:-0} != 1 ]] || exit 1
