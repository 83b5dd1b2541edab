#!/usr/bin/env bash
# Every test: set everything up, build the release and the ASan+UBSan presets, run the suites.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
for preset in release asan; do
  echo "=== preset ${preset}"
  bash scripts/build.sh "$preset"
  ctest --preset "$preset" -j "$jobs"
done
