#!/usr/bin/env bash
# A bounded libFuzzer run of every harness in tests/fuzz (docs/reliability.md, Fuzzing):
# installs clang 14 and its runtime when missing, builds the fuzz preset, fuzzes each target
# for SECONDS on a working copy of its committed seed corpus, and prints per target the
# executions, exec/s, coverage (libFuzzer's cov: and ft:), corpus size and crashes.
# Not part of scripts/test.sh; the normal suite only replays the seeds (fuzz_replay.*).
#
#   scripts/fuzz.sh [--no-build] [--build-dir DIR] [SECONDS_PER_TARGET]   (default 60)
#
# Crashing inputs land in DIR/artifacts/<target>/; replay one with
#   DIR/tests/fuzz/fuzz_<target> DIR/artifacts/<target>/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

build=1
build_dir=build/fuzz
seconds=60
while (($#)); do
  case $1 in
    --no-build) build=0; shift ;;
    --build-dir) build_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) seconds=$1; shift ;;
  esac
done

targets=(mpa_frame fpdu_stream ddp_rdmap cm_header mpa_handshake qp_receive)

if ((build)); then
  bash scripts/setup.sh
  # shellcheck source=lib/apt.sh
  source scripts/lib/apt.sh
  apt_ensure --tag fuzz clang-14 libclang-rt-14-dev
  cmake --preset fuzz -B "$build_dir" >/dev/null
  cmake --build "$build_dir" -j 2 --target "${targets[@]/#/fuzz_}"
fi

# Every input allocates afresh: a small quarantine keeps that from turning into page faults.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:quarantine_size_mb=16}
work="$build_dir/corpus-work"
artifacts="$build_dir/artifacts"
summary="$build_dir/fuzz-summary.txt"
failed=0
{
  printf '%-14s %12s %8s %6s %7s %7s %8s\n' target executions exec/s cov ft corpus crashes
} >"$summary"

for t in "${targets[@]}"; do
  binary="$build_dir/tests/fuzz/fuzz_$t"
  [[ -x $binary ]] || { echo "fuzz: $binary missing (build the fuzz preset)" >&2; exit 1; }
  rm -rf "${work:?}/$t" "${artifacts:?}/$t"
  mkdir -p "$work/$t" "$artifacts/$t"
  cp tests/fuzz/corpus/"$t"/* "$work/$t/"
  log="$build_dir/fuzz-$t.log"
  echo "fuzz: $t for ${seconds}s (log: $log)"
  set +e
  "$binary" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -use_value_profile=1 \
    -print_final_stats=1 -artifact_prefix="$artifacts/$t/" "$work/$t" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  status=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$status")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$status")
  corpus=$(find "$work/$t" -type f | wc -l)
  crashes=$(find "$artifacts/$t" -type f | wc -l)
  if ((rc != 0 || crashes > 0)); then
    failed=1
    echo "fuzz: $t FAILED (exit $rc); inputs in $artifacts/$t/, tail of the log:" >&2
    tail -n 30 "$log" >&2
  fi
  printf '%-14s %12s %8s %6s %7s %7s %8s\n' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" \
    "$corpus" "$crashes" >>"$summary"
done

echo
cat "$summary"
exit "$failed"
