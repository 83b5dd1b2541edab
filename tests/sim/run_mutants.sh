#!/usr/bin/env bash
# The simulator's teeth: builds every mutant of tests/sim/mutants (`mutants` target) and runs each
# on both transports over seeds 1..N (default 100000), printing the table of docs/p2p-resolver.md:
# how many seeds fail, the first failing seed (how many seeds it takes to catch the mutant) and the
# first report. A mutant the simulator does not catch on a transport makes the script exit 1.
# A patch whose first line reads `Transports: roce` (or iwarp) breaks a rule only that transport
# runs (R5b's check: RoCE only); its mutant runs on that transport alone.
#   tests/sim/run_mutants.sh [build-dir] [seeds]
set -euo pipefail
build=${1:-build/release}
seeds=${2:-100000}
here=$(cd "$(dirname "$0")" && pwd)
cmake --build "$build" --target mutants >/dev/null || cmake --build "$build" --target mutants
status=0
echo "| mutant | transport | failing seeds of $seeds | first failing seed | first report |"
echo "|---|---|---|---|---|"
for patch in "$here"/mutants/*.patch; do
  name=$(basename "$patch"); name=${name%%.*}
  [[ " ${done_names:-} " == *" $name "* ]] && continue
  done_names="${done_names:-} $name"
  transports=$(sed -s -n '1s/^Transports: *\([a-z ]*\).*$/\1/p' "$here"/mutants/"$name".*patch 2>/dev/null \
                 | head -1 | sed 's/ *$//')
  for transport in ${transports:-iwarp roce}; do
    out=$("$build/tests/sim/p2p_sim_$name" --transport "$transport" --seeds "$seeds" --max-reported 1 2>&1 || true)
    failed=$(sed -n 's/.* \([0-9]*\) failed$/\1/p' <<<"$out")
    first=$(sed -n 's/^  first failing seed: //p' <<<"$out")
    report=$(sed -n 's/^p2p_sim: seed [0-9]* FAILED at [0-9.]* \?ms: //p' <<<"$out" | head -1 | cut -c1-110)
    echo "| $name | $transport | ${failed:-?} | ${first:--} | ${report//|/\\|} |"
    if [[ "${failed:-0}" == 0 ]]; then status=1; fi
  done
done
exit $status
