#!/usr/bin/env bash
# Every test: set everything up, build the release, ASan+UBSan and TSan presets, run the suites.
# TSan runs the multi-threaded suites (the API, the reactor, the mesh, the fault-injection
# and C API tests); the single-threaded codec, core and simulator suites gain nothing from it.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
for preset in release asan; do
  echo "=== preset ${preset}"
  bash scripts/build.sh "$preset"
  # Debian's own RDMA programs on the drop-in libraries (label dropin, tests/dropin) run in
  # the release build; under ASan the same C API is the capi tests'.
  exclude=()
  [[ $preset == asan ]] && exclude=(-LE '^dropin$')
  ctest --preset "$preset" -j "$jobs" "${exclude[@]}"
done
echo "=== preset tsan (multi-threaded suites)"
bash scripts/build.sh tsan
ctest --preset tsan -j "$jobs" -L '^(api_tests|engine_tests|mesh_tests|reliability_tests|capi)$'
