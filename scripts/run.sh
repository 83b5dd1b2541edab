#!/usr/bin/env bash
# The main job on loopback: set everything up, build, and run peercm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh release
exec ./build/release/tools/peercm/peercm selfcheck
